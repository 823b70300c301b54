import json

import pytest
import yaml

from rollflow.cli import main
from tests.learn.conftest import tiny_config


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A config file and the policy `rollflow router train` made from it (tiny budgets)."""
    root = tmp_path_factory.mktemp("router")
    config = tiny_config(f"output_dir={root / 'out'}")
    path = root / "tiny.yaml"
    path.write_text(yaml.safe_dump(config.model_dump(mode="json", exclude={"eval_workload"})))
    assert main(["router", "train", "--config", str(path), "--resume", "never"]) == 0
    return path, root / "out"


def test_train_writes_policy_metrics_and_checkpoint(trained):
    _, out = trained
    assert (out / "policy.npz").is_file() and (out / "checkpoint.pt").is_file()
    rows = (out / "metrics.csv").read_text().splitlines()
    phases = {row.split(",")[0] for row in rows[1:]}
    assert {"demos", "bc", "ppo", "validation"} <= phases
    assert any((out / "tensorboard").iterdir())


def test_resume_auto_continues_from_the_checkpoint(trained, capsys):
    path, out = trained
    assert main(["router", "train", "--config", str(path), "--resume", "auto", "ppo.total_steps=96"]) == 0
    assert "resuming from" in capsys.readouterr().err
    ppo_steps = [
        int(r.split(",")[1])
        for r in (out / "metrics.csv").read_text().splitlines()[1:]
        if r.startswith("ppo,")
    ]
    assert sorted(set(ppo_steps)) == [32, 64, 96]  # two iterations, then one more after the resume


def test_compare_writes_every_router_with_the_four_metrics(trained, capsys, tmp_path):
    path, out = trained
    assert (
        main(
            [
                "router",
                "compare",
                "--config",
                str(path),
                "--output-dir",
                str(tmp_path),
                "--policy",
                str(out / "policy.npz"),
            ]
        )
        == 0
    )
    results = json.loads((tmp_path / "compare.json").read_text())
    assert {"round_robin", "lor", "least_tokens"} <= set(results)
    assert any("learned" in name for name in results)
    for row in results.values():
        assert {"e2e_p99", "e2e_mean", "ttft_p99", "slo_attainment"} <= set(row)
        assert row["e2e_p99"] >= row["e2e_mean"] > 0 and 0 <= row["slo_attainment"] <= 1
    assert (tmp_path / "compare.png").is_file()
    printed = capsys.readouterr().out
    assert "decision latency" in printed
    # the README's sign: delta = learned / best - 1, so a negative delta is a better learned router
    best = min(("round_robin", "lor", "least_tokens"), key=lambda name: results[name]["e2e_p99"])
    delta = results["learned"]["e2e_p99"] / results[best]["e2e_p99"] - 1
    verdict = "better" if delta < 0 else "worse"
    assert f"({best}): Δ p99 E2E {100 * delta:+.1f}% ({verdict})" in " ".join(printed.split())


def test_evaluate_prints_latency_and_decision_time(trained, capsys):
    path, _ = trained
    assert main(["router", "evaluate", "--config", str(path)]) == 0
    text = capsys.readouterr().out
    assert "E2E p99" in text and "decision latency" in text


def test_config_errors_name_the_key(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text("workload: {kind: synthetic}\nppo: {kl_strat: 0.5}\n")
    assert main(["router", "train", "--config", str(path)]) == 2
    assert "ppo.kl_strat: unknown key; did you mean 'kl_start'?" in capsys.readouterr().err
    path.write_text("workload: {kind: synthetic}\nscenario: {train_seeds: [1, 2], eval_seeds: [2]}\n")
    assert main(["router", "compare", "--config", str(path)]) == 2
    assert "overlap" in capsys.readouterr().err
