"""Partial rollout on a fleet that `rollflow launch` starts: a local, a remote and a spot engine, with a
weight server. Between two steps, the spot engine that made a carried sample's newest tokens is
preempted as the launcher does it live (SIGKILL, deregistered once its process is found gone) and a
new spot engine joins on the newest weights, pulled from the weight server; the carried sample resumes
elsewhere from its tokens, and every token keeps the span (weight version, engine) that made it.

The trainer runs in this process, as `rollflow demo run` runs it; the manager, the weight server and
the engines are processes of their own. The preemption is one of the trainer's `rollout_start_hooks`:
it runs after the last push and before the carried groups are resumed.
"""

from __future__ import annotations

import copy
import json

from rollflow.runtime.launch.launcher import Launcher
from rollflow.runtime.trainer.config import TrainConfig
from rollflow.runtime.trainer.loop import Trainer
from rollflow.runtime.trainer.partial import is_unfinished
from rollflow.runtime.trainer.rollouts import oldest_version
from rollflow.runtime.weights.token import TOKEN_ENV as WEIGHTS_TOKEN_ENV
from tests.runtime.launch.helpers import launch_config

PROMPTS_PER_STEP = 4
N_SAMPLES = 4
MAX_STALENESS = 1
STEPS = 3


class PreemptCarryingSpot:
    """A rollout-start hook: the first time a carried sample's newest tokens come from a spot engine,
    preempt that engine and have a new spot engine join, as a spot provider and the launcher would."""

    def __init__(self, launch: Launcher, trainer: Trainer) -> None:
        self.launch = launch
        self.trainer = trainer
        self.record: dict | None = None

    def __call__(self, train_version: int) -> None:
        if self.record is not None:
            if "again" not in self.record:  # as the step after the preemption carried it, if it did
                carried = {s["sample_id"]: s for group in self.trainer.carry.groups for s in group}
                self.record["again"] = copy.deepcopy(carried.get(self.record["sample_id"]))
            return
        spot = {e.url: e for e in self.launch.engines.values() if e.kind == "spot"}
        for sample in (s for group in self.trainer.carry.groups for s in group):
            if (
                not (is_unfinished(sample) and sample["spans"])
                or sample["spans"][-1]["engine_url"] not in spot
            ):
                continue
            if train_version - oldest_version(sample) > MAX_STALENESS:
                continue  # restarted from its prompt, not resumed from its tokens
            engine = spot[sample["spans"][-1]["engine_url"]]
            self.launch.preempt(engine.engine_id)
            self.launch.check_processes()  # its process is gone: deregistered
            joined = self.launch.add_engine(engine.pool)
            self.record = {
                "step": train_version + 1,
                "killed": engine.url,
                "joined": joined.url,
                "joined_version": joined.weight_version,
                "sample_id": sample["sample_id"],
                "spans": copy.deepcopy(sample["spans"]),
            }
            return


def test_a_carried_sample_whose_spot_engine_is_preempted_between_steps_resumes_elsewhere(
    tmp_path, tiny_model, monkeypatch
):
    model = str(tiny_model)
    pools = [
        {"kind": "local", "model": model, "capacity": 2},
        {"kind": "remote", "model": model, "capacity": 2},
        {"kind": "spot", "weights_url": "launched", "tokenizer": model, "capacity": 2},
    ]
    config = launch_config(tmp_path / "launch", pools, weights={"enabled": True, "publish": model})
    output = tmp_path / "run"
    with Launcher(config) as launch:
        monkeypatch.setenv(WEIGHTS_TOKEN_ENV, launch.weights_token)
        train = TrainConfig(
            manager_url=launch.manager_url,
            weights_url=launch.weights_url,
            model=model,
            n_samples=N_SAMPLES,
            prompts_per_step=PROMPTS_PER_STEP,
            micro_batch_groups=2,
            mini_batch_micro_batches=1,
            max_new_tokens=24,
            lr=0.0005,
            steps=STEPS,
            partial_rollout=8,
            max_staleness=MAX_STALENESS,
            output_dir=str(output),
        )
        trainer = Trainer(train, resume=False)
        preempt = PreemptCarryingSpot(launch, trainer)
        trainer.rollout_start_hooks.append(preempt)
        steps = []
        trainer.run(steps.append)
        workers = {w["url"]: w for w in launch.manager.workers()}
        left = {s["sample_id"] for g in trainer.carry.groups for s in g}

    record = preempt.record
    assert record is not None, "no carried sample had its newest tokens from the spot engine"
    # the preempted engine is gone from the manager; the new one joined on the version just pushed
    assert record["killed"] not in workers
    assert record["joined_version"] == record["step"] - 1
    assert {w["kind"] for w in workers.values()} == {"local", "remote", "spot"}
    assert all(w["weight_version"] == STEPS for w in workers.values())

    assert [m.samples for m in steps] == [PROMPTS_PER_STEP * N_SAMPLES] * STEPS
    assert all(m.samples_carried > 0 for m in steps)
    trained = [json.loads(line) for line in (output / "trained_samples.jsonl").read_text().splitlines()]
    ids = [r["sample_id"] for r in trained]
    assert len(ids) == len(set(ids)) and not left & set(ids)  # none trained twice, none both
    for r in trained:
        assert all(0 <= (r["step"] - 1) - s["weight_version"] <= MAX_STALENESS for s in r["spans"])

    # the carried sample went on after the tokens it had, on engines other than the preempted one:
    # trained in the step it was resumed in, or carried on again (its group not finished by then; as
    # carried, before a later step may restart it from its prompt under the staleness bound)
    before = record["spans"]
    sample_id = record["sample_id"]
    after = next((r for r in trained if r["sample_id"] == sample_id and r["step"] == record["step"]), None)
    if after is None:
        if "again" in record:
            after = record["again"]
        else:  # preempted before the last step: what it carried is the run's end
            after = next(s for g in trainer.carry.groups for s in g if s["sample_id"] == sample_id)
    assert after is not None, "the preempted engine's carried sample was neither trained nor carried on"
    assert after["spans"][: len(before)] == before
    assert after["spans"][-1]["end"] > before[-1]["end"]
    assert record["killed"] not in {s["engine_url"] for s in after["spans"][len(before) :]}
    # every kind of engine made tokens that were trained, the joined spot engine among them
    used = {s["engine_url"] for r in trained for s in r["spans"]}
    assert {w["kind"] for url, w in workers.items() if url in used} == {"local", "remote", "spot"}
    assert record["joined"] in used
