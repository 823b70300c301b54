"""`rollflow demo run` as `make demo` runs it, shortened: real manager, weight server, engines and
trainer on 127.0.0.1; the spot engine is SIGKILLed mid-rollout and a new one joins."""

from __future__ import annotations

import json

import pytest

from tests.runtime.demo.helpers import demo, preemption_config


def test_demo_trains_through_a_preemption_with_nothing_regenerated(tmp_path, tiny_model):
    out = tmp_path / "out"
    done = demo("run", "--config", str(preemption_config(tmp_path, tiny_model)), "--output-dir", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 3
    assert summary["samples"] == 3 * 4 * 4
    assert summary["engines_preempted"] == 1 and summary["engines_joined"] == 1
    assert summary["resumes"] >= 1  # the killed engine had samples in flight, and they moved
    assert summary["tokens_regenerated"] == 0
    # every token the engines sent was trained on: none lost, none made twice
    assert summary["tokens_generated"] == summary["tokens_trained"] > 0
    for key in ("reward_first_step", "reward_last_step"):
        assert 0.0 <= summary[key] <= 1.0
    assert (out / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "tokens regenerated" in done.stdout
    rows = (out / "train" / "metrics.csv").read_text().splitlines()
    assert len(rows) == 1 + 3
    # the killed engine's log is there, and the launch's work folder is under --output-dir
    assert (out / "launch" / "manager.log").is_file()


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("demo.preemption.step=99", "demo.preemption.step: 99 is past the last step"),
        ("demo.preemption.pool=5", "demo.preemption.pool: 5 names no entry of launch.engines"),
        ("launch.engines.1.weights_url=launched", None),  # valid: the shipped value
        ("launch.weights.enabled=false", "weights_url: 'launched' needs weights.enabled: true"),
    ],
)
def test_config_errors_name_the_key(tmp_path, tiny_model, override, message):
    done = demo("show", "--config", str(preemption_config(tmp_path, tiny_model)), override, timeout=60)
    if message is None:
        assert done.returncode == 0, done.stderr
    else:
        assert done.returncode == 2
        assert message in done.stderr
        assert "Traceback" not in done.stderr
