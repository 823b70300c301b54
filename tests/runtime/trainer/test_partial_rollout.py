"""`rollflow train` with `partial_rollout`: a manager, two built-in engines, the tiny model, 3 steps.

Each step over-samples 8 groups, trains the first 4 to finish and carries the rest, aborted with their
tokens, into the next step; between steps 1 and 2 the engine that made a carried sample's newest tokens
is killed, and the sample is finished on the other engine from its tokens.
"""

from __future__ import annotations

import json
import time

import pytest

from rollflow.policy.oversample import Oversampler
from tests.runtime.trainer.partial_plugin import PIDS_ENV, RUN_ENV
from tests.runtime.trainer.test_train_e2e import base_config, rows, train

PROMPTS_PER_STEP = 4
N_SAMPLES = 4
MAX_STALENESS = 1


def _waves(processes, tiny_model, output, manager_options: dict | None = None, **train) -> tuple[list, dict]:
    """(two engines, the config of a run through a manager over them): two samples at a time per
    engine, so a step's samples run in waves and its tail is cut off; this file's group sizes."""
    engines = [processes.engine() for _ in range(2)]
    manager = processes.manager(
        engines=[{"url": e.url, "capacity": 2} for e in engines], **(manager_options or {})
    )
    config = base_config(
        manager,
        tiny_model,
        output,
        prompts_per_step=PROMPTS_PER_STEP,
        n_samples=N_SAMPLES,
        max_new_tokens=24,
        max_staleness=MAX_STALENESS,
        **train,
    )
    return engines, config


def _trained(output) -> list[dict]:
    return [json.loads(line) for line in (output / "trained_samples.jsonl").read_text().splitlines()]


def _checkpoint_state(output, step: int) -> dict:
    return json.loads((output / "checkpoints" / f"step_{step}" / "state.json").read_text())


def _checkpoint_carried(output, step: int) -> list[list[dict]]:
    return _checkpoint_state(output, step)["carried"]


def test_partial_rollout_carries_samples_across_steps_and_an_engine_killed_between_steps(
    processes, tiny_model, tmp_path
):
    output = tmp_path / "run"
    engines, config = _waves(  # the step's 48 samples run in waves
        processes,
        tiny_model,
        output,
        {"health_interval_s": 0.5},
        steps=3,
        partial_rollout=8,
        prompts="tests.runtime.trainer.partial_plugin:prompts_killing_an_engine",
    )
    env = {PIDS_ENV: json.dumps({e.url: e.proc.pid for e in engines}), RUN_ENV: str(output)}
    train(config, tmp_path, "--resume", "never", env=env)

    steps = rows(output)
    assert [int(r["step"]) for r in steps] == [1, 2, 3]
    # every step trains 4 groups whole, and carries some samples into the next
    assert all(int(r["samples"]) == PROMPTS_PER_STEP * N_SAMPLES for r in steps)
    assert all(int(r["samples_carried"]) > 0 and int(r["tokens_carried"]) > 0 for r in steps)
    carried = {step: _checkpoint_carried(output, step) for step in (1, 2, 3)}
    for step, groups in carried.items():
        assert sum(len(g) for g in groups) == int(steps[step - 1]["samples_carried"])
        assert all(len(g) == N_SAMPLES for g in groups)  # carried whole

    trained = _trained(output)
    ids = [record["sample_id"] for record in trained]
    assert len(ids) == len(set(ids)) == 3 * PROMPTS_PER_STEP * N_SAMPLES  # none trained twice
    # none lost: each sample carried out of a step is trained later or still carried at the run's end
    left = {s["sample_id"] for g in carried[3] for s in g}
    assert not left & set(ids)
    for step in (1, 2):
        for sample in (s for g in carried[step] for s in g):
            assert sample["sample_id"] in set(ids) | left
    # each carried token's version is recorded, and within the bound of the policy that trained it
    resumed = [r for r in trained if r["carried"]]
    assert resumed and {r["step"] for r in resumed} == {2, 3}
    for record in resumed:
        spans = record["spans"]
        assert [s["start"] for s in spans] == [0] + [s["end"] for s in spans[:-1]]
        assert spans[-1]["end"] == record["num_output"]
        for span in spans:
            assert span["weight_version"] is not None
            assert 0 <= (record["step"] - 1) - span["weight_version"] <= MAX_STALENESS
    assert any(len({s["weight_version"] for s in r["spans"]}) > 1 for r in resumed)  # across versions

    # the sample cut off on the killed engine went on on the other one, after the tokens it had: as
    # step 2 trained it, or as step 2 carried it again (its group not finished yet)
    killed = json.loads((output / "killed.json").read_text())
    again = [s for g in carried[2] for s in g if s["sample_id"] == killed["sample_id"]]
    after = again[0] if again else next(r for r in trained if r["sample_id"] == killed["sample_id"])
    assert again or after["step"] == 2
    before = killed["spans"]
    assert after["spans"][: len(before)] == before
    assert after["spans"][-1]["end"] > before[-1]["end"]
    others = {e.url for e in engines} - {killed["url"]}
    assert {s["engine_url"] for s in after["spans"][len(before) :]} == others

    summary = json.loads((output / "summary.json").read_text())
    assert summary["samples_carried"] == sum(int(r["samples_carried"]) for r in steps)
    assert summary["tokens_carried"] == sum(int(r["tokens_carried"]) for r in steps)
    assert summary["samples_left_carried"] == len(left)
    staleness = {int(k): v for k, v in summary["tokens_by_staleness"].items()}
    assert set(staleness) <= set(range(MAX_STALENESS + 1)) and staleness[1] > 0
    assert sum(staleness.values()) == sum(int(r["tokens"]) for r in steps)


def test_partial_rollout_off_policy_starts_the_next_rollout_as_this_one_ends_and_a_resume_goes_on_with_the_carried(
    processes, tiny_model, tmp_path
):
    output = tmp_path / "run"
    _, config = _waves(processes, tiny_model, output, partial_rollout=4, off_policy=True)
    train(config, tmp_path, "--resume", "never")
    steps = rows(output)
    assert [int(r["samples"]) for r in steps] == [PROMPTS_PER_STEP * N_SAMPLES] * 2
    assert all(int(r["samples_carried"]) > 0 for r in steps)
    trained = _trained(output)
    assert len({r["sample_id"] for r in trained}) == len(trained)
    for record in trained:
        assert all(0 <= (record["step"] - 1) - s["weight_version"] <= MAX_STALENESS for s in record["spans"])
    # step 2's rollout started as step 1's ended, before step 1's weights were pushed: samples carried
    # out of step 1 went on making tokens on version 0
    spans_at_carry = {s["sample_id"]: s["spans"] for g in _checkpoint_carried(output, 1) for s in g}
    went_on = [
        span
        for record in trained
        if record["step"] == 2 and record["sample_id"] in spans_at_carry
        for span in record["spans"][len(spans_at_carry[record["sample_id"]]) :]
    ]
    assert any(span["weight_version"] == 0 for span in went_on)

    # --resume auto goes on with the groups the last step carried (in its checkpoint): none is lost
    left = {s["sample_id"] for g in _checkpoint_carried(output, 2) for s in g}
    train({**config, "steps": 3}, tmp_path, "--resume", "auto")
    trained = _trained(output)
    in_step_3 = {r["sample_id"] for r in trained if r["step"] == 3}
    carried_on = {s["sample_id"] for g in _checkpoint_carried(output, 3) for s in g}
    assert left <= in_step_3 | carried_on and left & in_step_3
    assert len({r["sample_id"] for r in trained}) == len(trained)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"partial_rollout": -1}, "partial_rollout"),
        ({"partial_rollout": 2, "environment": "rollflow.runtime.trainer.tasks:calculator"}, "environment"),
    ],
)
def test_partial_rollout_config_errors_name_the_key(changes, message, tiny_model):
    from pydantic import ValidationError

    from rollflow.runtime.trainer.config import TrainConfig

    with pytest.raises(ValidationError, match=message) as info:
        TrainConfig(model=str(tiny_model), **changes)
    assert "partial_rollout" in str(info.value)


def test_partial_rollout_auto_asks_the_simulators_policy_with_the_groups_trained_before(
    processes, tiny_model, tmp_path
):
    """`partial_rollout: auto` live: each step's extra groups are what the shared policy (the one
    `rollflow rl-sim` asks) chooses from the lengths of the groups trained in the steps before, and
    after `--resume auto` too: the lengths travel in the checkpoint (step 3 runs in a resumed run)."""
    output = tmp_path / "run"
    _, config = _waves(processes, tiny_model, output, steps=2, partial_rollout="auto")
    train(config, tmp_path, "--resume", "never")
    trained = _trained(output)
    sampler = Oversampler("auto", PROMPTS_PER_STEP)
    steps = rows(output)
    assert [int(r["step"]) for r in steps] == [1, 2] and steps[0]["extra_groups"] == "0"
    for row in steps:
        assert int(row["extra_groups"]) == sampler.plan().num_extra
        assert int(row["samples_carried"]) == int(row["extra_groups"]) * N_SAMPLES
        records = [r for r in trained if r["step"] == int(row["step"])]  # its groups, one after another
        assert len(records) == PROMPTS_PER_STEP * N_SAMPLES
        sampler.observe(
            max(r["num_output"] for r in records[i : i + N_SAMPLES])
            for i in range(0, len(records), N_SAMPLES)
        )
    # the checkpoint holds the window the policy read: steps 1 and 2's trained groups
    state = _checkpoint_state(output, 2)
    assert state["group_lengths"] == list(sampler.snapshot().group_lengths)

    # --resume auto plans its first step from the checkpoint's window, not from none (N = 0): the tiny
    # model's groups all reach max_new_tokens, so a window with a tail is written there to tell the two
    tail = [4] * PROMPTS_PER_STEP + [24] * PROMPTS_PER_STEP
    resumed = Oversampler("auto", PROMPTS_PER_STEP)
    resumed.observe(tail)
    assert resumed.plan().num_extra > 0
    (output / "checkpoints" / "step_2" / "state.json").write_text(
        json.dumps({**state, "group_lengths": tail})
    )
    train({**config, "steps": 3}, tmp_path, "--resume", "auto")
    step_3 = rows(output)[-1]
    assert step_3["step"] == "3" and int(step_3["extra_groups"]) == resumed.plan().num_extra
    assert int(step_3["samples_carried"]) == int(step_3["extra_groups"]) * N_SAMPLES


def test_carried_groups_that_fill_the_quota_before_the_fresh_batch_exists_carry_it_whole(processes):
    """Groups a step carried whole (surplus groups that finished) arrive as soon as the step starts:
    when they fill its quota before the fresh batch is submitted, the rollout's end waits for that
    batch and aborts it, and every fresh group is carried into the next step."""
    from rollflow.runtime.manager.client import ManagerClient
    from rollflow.runtime.trainer.partial import PartialStep

    engine = processes.engine()
    client = ManagerClient(processes.manager(engines=[{"url": engine.url}]).url)
    sampling = {"max_new_tokens": 8, "temperature": 0.0}

    def finished(group_index: int) -> dict:
        return {"state": "finished", "finish_reason": "length", "group_index": group_index,
                "output_ids": [7, 8], "output_logprobs": [-0.1, -0.2], "spans": []}  # fmt: skip

    def submit_fresh():
        time.sleep(0.5)  # the carried groups arrive meanwhile: they need no resume
        return client.submit([[3, 4, 5], [6, 7, 8]], n=2, **sampling)

    ended: list[list[list[dict]]] = []
    carried = [[finished(0), finished(0)], [finished(1), finished(1)]]
    step = PartialStep(client, carried, submit_fresh, 2, sampling, quota=2, on_end=ended.append)
    trained = [group for groups in step.micro_batches(min_groups=1) for group in groups]
    assert trained == carried
    [leftover] = ended
    assert sorted(group[0]["group_index"] for group in leftover) == [0, 1]  # the fresh batch, whole
    assert all(sample["state"] == "finished" for group in leftover for sample in group)
