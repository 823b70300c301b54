"""`rollflow profile engine` against a real built-in engine process, as a user runs it."""

from __future__ import annotations

import asyncio
import json
import statistics
from pathlib import Path

import pytest

from rollflow.perf.profile.progress import PROGRESS_FILE
from rollflow.runtime.engines.profiler.measure import EngineProbe, least_disturbed, measure_engine
from tests.perf.profiling import read_rows, run_rollflow, simulate_one_prompt, simulate_requests
from tests.runtime.engines.processes import EngineProcess
from tests.runtime.processes import free_port, http

pytestmark = pytest.mark.process  # runs the CLI as a subprocess (left out of `make test-fast`)


def _profile_args(engine: EngineProcess, model: Path, out: Path, *grid: str) -> list[str]:
    """`rollflow profile engine`'s arguments for the built-in `engine` serving `model`, its tables
    written to `out`, measuring what `grid` names (batch sizes, prompt lengths, rounds...)."""
    args = ["profile", "engine", "--url", engine.url, "--kind", "builtin", "--model-config", str(model)]
    return [*args, "--out", str(out), *grid]


def test_engine_profile_writes_tables_whose_simulation_gives_the_measured_times(tiny, tmp_path):
    engine = EngineProcess(tiny)
    try:
        proc = run_rollflow(
            *_profile_args(
                engine, tiny, tmp_path / "tables", "--batch-sizes", "1,4", "--prompt-lengths", "16,128",
                "--decode-prompt-lengths", "16,96", "--decode-tokens", "8", "--repeats", "2",
            )
        )  # fmt: skip
    finally:
        engine.stop()
    assert proc.returncode == 0, proc.stderr
    assert "decode batch 4, KV " in proc.stdout and "prompt 128 tokens:" in proc.stdout
    rows = {int(r["num_tokens"]): r for r in read_rows(tmp_path / "tables" / "mlp.csv")}
    assert sorted(rows) == [16, 128]  # tokens' cost, from the prompts
    assert all(float(r["time_stats.attn_pre_proj.median"]) > 0 for r in rows.values())
    decode = {
        (int(r["batch_size"]), int(r["kv_cache_size"])): float(r["time_stats.attn_decode.median"])
        for r in read_rows(tmp_path / "tables" / "attention.csv")
        if r["is_prefill"] == "False"
    }
    # each batch decoded after 16- and 96-token prompts: rows at the mean KV of their measured gaps
    # (the prompt and 0 to 6 generated tokens)
    assert sorted(batch for batch, _ in decode) == [1, 1, 4, 4] and all(
        value >= 0 for value in decode.values()
    )
    kv_lengths = sorted(kv for batch, kv in decode if batch == 4)
    assert 16 <= kv_lengths[0] <= 22 and 96 <= kv_lengths[1] <= 102

    # One request of 128 prompt tokens is one 128-token iteration: the simulator must take the
    # engine's measured time for it (iteration time per layer x 2 layers).
    request = simulate_one_prompt(tmp_path / "tables", 128, tmp_path)
    measured_ms = 2 * float(rows[128]["time_stats.attn_pre_proj.median"])
    assert float(request["ttft"]) * 1e3 == pytest.approx(measured_ms, rel=1e-9)

    # Four prompts of a profiled KV length prefill together, then decode their second tokens as a
    # batch of 4 at that KV length: that iteration must take what the engine took per iteration at
    # decode batch 4 and that KV length (its printed median), or its four tokens' cost through the
    # weights (the 16-token row: rounded up to 8, clamped) when a loaded machine measured the batch
    # faster than that. KV granularity 1: the lookup is at the profiled length, not a bucket's; the
    # prompts are one token short of it, since a decode's KV holds the token sampled at prefill too.
    tokens_ms = 2 * float(rows[16]["time_stats.attn_pre_proj.median"])
    for kv in kv_lengths:
        [printed] = [
            line for line in proc.stdout.splitlines() if line.startswith(f"decode batch 4, KV {kv}:")
        ]
        decode_4_ms = float(printed.split()[5])
        (tmp_path / f"decode{kv}").mkdir()
        batch = simulate_requests(
            tmp_path / "tables",
            [(0.0, kv - 1, 2)] * 4,
            tmp_path / f"decode{kv}",
            chunk_size=512,
            kv_cache_granularity=1,
        )
        for request in batch:
            iteration_ms = (float(request["completed_at"]) - float(request["first_token_at"])) * 1e3
            assert iteration_ms == pytest.approx(max(decode_4_ms, tokens_ms), abs=0.006)  # printed to 0.01 ms
        if decode_4_ms > tokens_ms + 0.01:
            assert decode[4, kv] > 0
        elif decode_4_ms < tokens_ms - 0.01:
            assert decode[4, kv] == 0


def test_memory_moves_are_timed_for_rl_sim_and_the_engine_serves_again(tiny, tmp_path):
    engine = EngineProcess(tiny)
    try:
        proc = run_rollflow(
            *_profile_args(
                engine, tiny, tmp_path / "tables", "--batch-sizes", "1", "--prompt-lengths", "16",
                "--decode-prompt-lengths", "16", "--decode-tokens", "4", "--repeats", "2", "--memory-moves",
            )
        )  # fmt: skip
        status, answer = http(
            "POST",
            engine.url + "/generate",
            {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 4}},
        )
    finally:
        engine.stop()
    assert proc.returncode == 0, proc.stderr
    [line] = [line for line in proc.stdout.splitlines() if line.startswith("memory release ")]
    settings = line.rsplit("(simulate them with ", 1)[1].rstrip(")").split()
    seconds = {key: float(value) for key, value in (setting.split("=") for setting in settings)}
    assert sorted(seconds) == ["scheduling.release_s", "scheduling.resume_s"]
    assert all(0 < value < 60 for value in seconds.values())
    assert status == 200 and len(answer["output_ids"]) == 4, answer  # released, resumed, serving


def test_an_interrupted_engine_profile_resumes_keeping_what_it_measured(tiny, tmp_path):
    engine = EngineProcess(tiny)
    try:
        probe = EngineProbe(
            kind="builtin", url=engine.url, batch_sizes=(1, 4), prompt_lengths=(16, 128),
            decode_prompt_lengths=(16,), decode_tokens=8, repeats=2,
        )  # fmt: skip

        def interrupt_after_three(done, total):
            if done == 3:
                raise KeyboardInterrupt

        with pytest.raises(KeyboardInterrupt):
            asyncio.run(measure_engine(probe, tmp_path, on_step=interrupt_after_three))
        assert not (tmp_path / "mlp.csv").exists()
        first = [json.loads(line) for line in (tmp_path / PROGRESS_FILE).read_text().splitlines()[1:]]
        # round 0: decode batches 1 and 4, then the 16-token prompt
        assert [record["point"] for record in first] == [
            ["decode", 0, 1, 16], ["decode", 0, 4, 16], ["prefill", 0, 16],
        ]  # fmt: skip
        # a kill can leave half a line behind: it is measured again, not read as garbage
        with (tmp_path / PROGRESS_FILE).open("a") as handle:
            handle.write('{"point": ["prefill", 0, 128], "st')

        args = _profile_args(
            engine, tiny, tmp_path, "--batch-sizes", "1,4", "--prompt-lengths", "16,128",
            "--decode-prompt-lengths", "16", "--decode-tokens", "8", "--repeats", "2",
        )  # fmt: skip
        proc = run_rollflow(*args)
        assert proc.returncode == 0, proc.stderr
        assert "measured 11 of 14 request mixes" in proc.stdout
        assert "(3 resumed from an earlier run)" in proc.stdout
        records = [json.loads(line) for line in (tmp_path / PROGRESS_FILE).read_text().splitlines()[1:]]
        assert records[:3] == first and len(records) == 14  # kept as measured, each mix once
        rounds: dict[tuple[int, int], list[list[float]]] = {}
        for record in records:
            if record["point"][0] == "decode":
                _, _, batch, prompt = record["point"]
                rounds.setdefault((batch, prompt), []).append(record["stats"]["gaps"])
        assert sorted(rounds) == [(1, 16), (4, 16)] and all(len(r) == 2 for r in rounds.values())
        for batch, prompt in rounds:  # each row is the least disturbed of both runs' timed rounds
            [line] = [x for x in proc.stdout.splitlines() if x.startswith(f"decode batch {batch}, KV ")]
            # a round whose streams each came in one chunk timed nothing (`best_decode_round` skips it)
            best = least_disturbed([gaps for gaps in rounds[batch, prompt] if gaps])
            assert float(line.split()[5]) == pytest.approx(statistics.median(best) * 1e3, abs=0.006)

        proc = run_rollflow(*args[:-1], "3")  # another number of rounds: another profile
        assert proc.returncode == 2 and "holds a profile of another model or settings" in proc.stderr
    finally:
        engine.stop()


def test_an_engine_that_is_not_there_is_a_one_line_error(tiny, tmp_path):
    proc = run_rollflow(
        "profile", "engine", "--url", f"http://127.0.0.1:{free_port()}", "--model-config", str(tiny),
        "--out", str(tmp_path),
    )  # fmt: skip
    assert proc.returncode == 2
    [line] = proc.stderr.strip().splitlines()[-1:]
    assert line.startswith("rollflow: engine at http://127.0.0.1:")


def test_each_mix_keeps_its_least_disturbed_round():
    # a burst of other work slowed most of round 1 and one gap of round 2: round 2 is kept
    assert least_disturbed([[5.0, 6.0, 7.0], [1.0, 2.0, 30.0], [3.0, 3.0, 3.0]]) == [1.0, 2.0, 30.0]
    assert least_disturbed([[0.9], [0.4], [0.7]]) == [0.4]  # one time to first token per round
