"""The same small partial-rollout run live and simulated: samples carried, tokens carried, staleness.

Live: `rollflow train` on the tiny model, two built-in engines running 2 samples each at a time (the
manager's `capacity`), 4 prompts x 4 samples per step, `partial_rollout: 8`, 3 steps, on-policy.
Simulated: `rollflow rl-sim`'s runner on the same shape: 2 rollout instances of 2 sequences each, the
same batch, groups, N and steps, and output lengths drawn from the ones the live run generated.

Exact: the samples each step carries (its N groups, whole). Within a tolerance: the tokens carried, and
the trained tokens by staleness, which depend on timing and on the order the carried samples' resumes
reach the engines. Live, each is a `/generate` of its own, all sent at once from a pool of threads, so
that order is a race: between the trainer's group order and none at all. The simulator shuffles it
(`rollflow.sim.rl.partial.resume_order`); the test simulates both ends, ordered and shuffled under 8
seeds, and allows each step `TIMING` tokens beyond them. At the stop each of the 4 slots may be up to
one sample ahead of or behind the simulated schedule, as the engines' per-token times jitter on a
shared CPU and live stops a beat after the batch fills (the last group travels to the trainer, which
then sends the aborts) where the simulator stops at once; and while the aborts go out, a queued
sample may take a slot an abort freed and make its first token before its own abort comes.
"""

from __future__ import annotations

import json

from rollflow.config import validate_config
from rollflow.sim.rl import step as sim_step
from rollflow.sim.rl.config import RLSimConfig
from rollflow.sim.rl.runner import simulate_steps
from tests.runtime.trainer.test_train_e2e import base_config, rows, train

PROMPTS, GROUP, EXTRA, STEPS, MAX_NEW_TOKENS = 4, 4, 8, 3, 24
ENGINES, CAPACITY = 2, 2
SLOTS = ENGINES * CAPACITY
# tokens a step's stop may differ by: one sample per slot, one token per carried sample
TIMING = SLOTS * MAX_NEW_TOKENS + EXTRA * GROUP


def _simulated(lengths_csv, seed: int) -> list:
    raw = {
        "seed": seed,
        "steps": STEPS,
        "num_gpus": ENGINES,
        "partial_rollout": EXTRA,
        "workload": {
            "num_prompts": PROMPTS,
            "samples_per_prompt": GROUP,
            "prompt_tokens": 8,
            "output": "trace",
            "output_trace": str(lengths_csv),
            "max_new_tokens": MAX_NEW_TOKENS,
        },
        "rollout": {"router": "least_outstanding", "scheduler": {"kind": "vllm", "batch_size_cap": CAPACITY}},
        "training": {"num_minibatches": 2},
        "output": {"progress": False, "gantt": False, "chrome_trace": False},
    }
    return simulate_steps(validate_config(RLSimConfig, raw))


def _stale(by_staleness: dict) -> int:
    return sum(count for staleness, count in by_staleness.items() if int(staleness) > 0)


def test_partial_rollout_live_carries_what_the_simulator_carries(
    processes, tiny_model, tmp_path, monkeypatch
):
    engines = [processes.engine() for _ in range(ENGINES)]
    manager = processes.manager(engines=[{"url": e.url, "capacity": CAPACITY} for e in engines])
    output = tmp_path / "run"
    config = base_config(
        manager,
        tiny_model,
        output,
        steps=STEPS,
        prompts_per_step=PROMPTS,
        n_samples=GROUP,
        max_new_tokens=MAX_NEW_TOKENS,
        partial_rollout=EXTRA,
        max_staleness=STEPS,  # no carried sample restarts: the simulator keeps every token too
    )
    train(config, tmp_path, "--resume", "never")
    live = rows(output)
    summary = json.loads((output / "summary.json").read_text())
    trained = [json.loads(line) for line in (output / "trained_samples.jsonl").read_text().splitlines()]
    lengths = tmp_path / "lengths.csv"
    lengths.write_text("num_decode_tokens\n" + "".join(f"{r['num_output']}\n" for r in trained))

    shuffled = [_simulated(lengths, seed) for seed in range(8)]
    monkeypatch.setattr(sim_step, "resume_order", lambda unfinished, *_: unfinished)  # group order
    ordered = [_simulated(lengths, seed) for seed in range(8)]
    runs = shuffled + ordered

    for index, row in enumerate(live):
        assert int(row["samples_carried"]) == EXTRA * GROUP
        assert {run[index].carried_samples for run in runs} == {EXTRA * GROUP}
        low = min(run[index].tokens_carried for run in runs)
        high = max(run[index].tokens_carried for run in runs)
        assert low - TIMING <= int(row["tokens_carried"]) <= high + TIMING, (index, row, low, high)
    # resumes out of group order leave more tokens behind than in order: the shuffle is what moves them
    assert max(sum(s.tokens_carried for s in run) for run in shuffled) > max(
        sum(s.tokens_carried for s in run) for run in ordered
    )

    # trained tokens a version or more stale: the carried tokens of the groups the next step trained
    stale = [sum(_stale(s.tokens_by_staleness) for s in run) for run in runs]
    assert (
        min(stale) - (STEPS - 1) * TIMING
        <= _stale(summary["tokens_by_staleness"])
        <= max(stale) + (STEPS - 1) * TIMING
    )
    live_tokens = sum(summary["tokens_by_staleness"].values())
    simulated = [sum(sum(s.tokens_by_staleness.values()) for s in run) for run in runs]
    assert min(simulated) * 0.9 <= live_tokens <= max(simulated) * 1.1  # lengths drawn, not the same samples
