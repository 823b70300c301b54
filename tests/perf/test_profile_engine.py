"""`rollflow profile engine` against a real built-in engine process, as a user runs it."""

from __future__ import annotations

import pytest

from tests.perf.profiling import read_rows, run_rollflow, simulate_one_prompt
from tests.runtime.engines.processes import EngineProcess
from tests.runtime.processes import free_port


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("models") / "tiny"
    proc = run_rollflow("engine", "init-model", str(path))
    assert proc.returncode == 0, proc.stderr
    return path


def test_engine_profile_writes_tables_whose_simulation_gives_the_measured_times(tiny, tmp_path):
    engine = EngineProcess(tiny)
    try:
        proc = run_rollflow(
            "profile", "engine", "--url", engine.url, "--kind", "builtin", "--model-config", str(tiny),
            "--out", str(tmp_path / "tables"), "--batch-sizes", "1,4", "--prompt-lengths", "16,128",
            "--decode-tokens", "8", "--repeats", "2",
        )  # fmt: skip
    finally:
        engine.stop()
    assert proc.returncode == 0, proc.stderr
    assert "decode batch 4:" in proc.stdout and "prompt 128 tokens:" in proc.stdout
    rows = {int(r["num_tokens"]): r for r in read_rows(tmp_path / "tables" / "mlp.csv")}
    assert sorted(rows) == [1, 4, 16, 128]
    assert all(float(r["time_stats.attn_pre_proj.median"]) > 0 for r in rows.values())

    # One request of 128 prompt tokens is one 128-token iteration: the simulator must take the
    # engine's measured time for it (iteration time per layer x 2 layers).
    request = simulate_one_prompt(tmp_path / "tables", 128, tmp_path)
    measured_ms = 2 * float(rows[128]["time_stats.attn_pre_proj.median"])
    assert float(request["ttft"]) * 1e3 == pytest.approx(measured_ms, rel=1e-9)


def test_an_engine_that_is_not_there_is_a_one_line_error(tiny, tmp_path):
    proc = run_rollflow(
        "profile", "engine", "--url", f"http://127.0.0.1:{free_port()}", "--model-config", str(tiny),
        "--out", str(tmp_path),
    )  # fmt: skip
    assert proc.returncode == 2
    [line] = proc.stderr.strip().splitlines()[-1:]
    assert line.startswith("rollflow: engine at http://127.0.0.1:")
