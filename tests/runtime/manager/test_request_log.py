"""The manager's request log (`request_log: PATH`), replayed by `rollflow sim replay` on the
engine's own profile: a real manager, a real built-in engine, the CLI as a user runs it."""

from __future__ import annotations

import json
import subprocess
from concurrent.futures import ThreadPoolExecutor

from rollflow.runtime.launch.servers import run_rollflow
from tests.perf.profiling import TINY_SHAPE
from tests.runtime.manager.helpers import wait_until
from tests.runtime.processes import ENV, REPO, http

REQUESTS = [([3, 4, 5] * k, 4 + 3 * k) for k in range(1, 7)]  # (prompt, max_new_tokens)


def generate(manager, prompt: list[int], max_new_tokens: int) -> dict:
    sampling = {"max_new_tokens": max_new_tokens, "temperature": 0, "ignore_eos": True}
    status, answer = http(
        "POST", manager.url + "/generate", {"input_ids": prompt, "sampling_params": sampling}
    )
    assert status == 200, answer
    return answer


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return run_rollflow(*args, env={**ENV, "PYTHONPATH": str(REPO)})


def test_the_log_records_every_sample_and_replays_on_the_engines_profile(processes, tmp_path):
    engine = processes.engine()
    log_path = tmp_path / "requests.jsonl"
    manager = processes.manager(
        request_log=str(log_path), engines=[{"url": engine.url, "engine_type": "builtin"}]
    )
    # rounds enough that one is timed on a loaded machine (which can deliver a round's streams whole)
    profile = run_cli(
        "profile", "engine", "--url", engine.url, "--kind", "builtin", "--model-config", str(processes.model),
        "--out", str(tmp_path / "tables"), "--batch-sizes", "1,4", "--prompt-lengths", "8,32",
        "--decode-tokens", "16", "--repeats", "3",
    )  # fmt: skip
    assert profile.returncode == 0, profile.stderr

    with ThreadPoolExecutor(len(REQUESTS)) as pool:
        answers = list(pool.map(lambda r: generate(manager, *r), REQUESTS))
    lines = wait_until(
        lambda: (
            [json.loads(x) for x in log_path.read_text().splitlines()]
            if log_path.exists() and len(log_path.read_text().splitlines()) == len(REQUESTS)
            else None
        ),
        timeout=30,
        what="one log line per sample",
    )
    by_id = {entry["sample_id"]: entry for entry in lines}
    for (prompt, max_new), answer in zip(REQUESTS, answers, strict=True):
        entry = by_id[answer["meta_info"]["id"]]
        assert entry["state"] == "finished" and entry["finish_reason"] == "length"
        assert (entry["prompt_tokens"], entry["output_tokens"]) == (len(prompt), max_new)
        assert entry["arrived_at"] <= entry["first_token_at"] <= entry["finished_at"]
        [span] = entry["spans"]
        assert span["engine_url"] == engine.url and (span["start"], span["end"]) == (0, max_new)
        assert entry["arrived_at"] <= span["started_at"] <= span["first_token_at"] == entry["first_token_at"]
        assert span["first_token_at"] <= span["ended_at"] <= entry["finished_at"]

    sim_yaml = tmp_path / "sim.yaml"
    sim_yaml.write_text(
        json.dumps(
            {
                "cluster": {"model": "tiny", "model_shape": TINY_SHAPE},
                "scheduler": {"kind": "sarathi", "chunk_size": 256, "batch_size_cap": 16},
                "execution": {
                    "kind": "tables",
                    "compute_table": str(tmp_path / "tables" / "mlp.csv"),
                    "attention_table": str(tmp_path / "tables" / "attention.csv"),
                },
                "output": {"progress": False},
            }
        )
    )
    out = tmp_path / "replay"
    proc = run_cli(
        "sim",
        "replay",
        "--from-manager-log",
        str(log_path),
        "--config",
        str(sim_yaml),
        "--output-dir",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr
    assert f"replayed {len(REQUESTS)} finished samples" in proc.stdout
    assert "recorded on 1 engine(s), simulated on 1 replica(s)" in proc.stdout
    report = json.loads((out / "replay.json").read_text())
    assert report["recorded_engines"] == [engine.url]
    for metric in ("ttft", "tpot", "e2e"):
        line = next(x for x in proc.stdout.splitlines() if x.startswith(f"| {metric} (s) |"))
        for q in ("p50", "p90"):
            cell = report["metrics"][metric][q]
            assert cell["recorded"] > 0 and cell["simulated"] > 0
            assert f"{cell['recorded']:.4f}" in line and f"{cell['simulated']:.4f}" in line


def test_a_request_log_that_cannot_be_opened_stops_the_manager_with_one_line(tmp_path):
    config = tmp_path / "manager.yaml"
    config.write_text(f"request_log: {tmp_path / 'no-such-dir' / 'log.jsonl'}\n")
    proc = run_cli("manager", "serve", "--config", str(config), "--port", "0")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("rollflow: request_log: cannot open ")
