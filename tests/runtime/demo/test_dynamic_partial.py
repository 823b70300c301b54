"""`rollflow demo run --config examples/demo/dynamic.yaml train.partial_rollout=4`: RLinf's auto scheduler
on real processes while each step carries its tail into the next. Within each step rollout engines are
released to the actor (their samples drained onto the others, with their tokens) and wake at step end;
the samples a step carries were made on engines that the actor then took and handed back, and the next
step resumes them from their tokens, every span keeping its engine and weight version."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from tests.runtime.demo.helpers import demo, dynamic_config
from tests.runtime.demo.test_dynamic_demo import LR

PROMPTS_PER_STEP = 8
N_SAMPLES = 2
STEPS = 2


def _carried(out: Path, step: int) -> list[dict]:
    state = json.loads((out / "train" / "checkpoints" / f"step_{step}" / "state.json").read_text())
    return [sample for group in state["carried"] for sample in group]


def test_carried_samples_survive_engines_moving_to_the_actor_and_back(tmp_path, tiny_model):
    config = dynamic_config(tmp_path, tiny_model, auto_scheduler=True, lr=LR)
    out = tmp_path / "out"
    done = demo(
        "run",
        "--config",
        str(config),
        "--output-dir",
        str(out),
        f"train.steps={STEPS}",
        f"train.prompts_per_step={PROMPTS_PER_STEP}",
        "train.partial_rollout=4",
        "train.max_staleness=1",
        "train.checkpoint_every=1",
        "train.max_new_tokens=64",
        timeout=900,  # two steps take about 2 minutes; a loaded machine takes several times that
    )
    assert done.returncode == 0, done.stderr[-4000:]
    summary = json.loads((out / "summary.json").read_text())
    with open(out / "train" / "metrics.csv") as file:
        rows = list(csv.DictReader(file))

    # every step trains its quota whole and carries samples; engines went to the actor and came back
    assert [int(r["samples"]) for r in rows] == [PROMPTS_PER_STEP * N_SAMPLES] * STEPS
    assert all(int(r["samples_carried"]) > 0 for r in rows)
    for step in summary["steps"]:
        assert step["engines_released"], step["moves"]
        assert all(m["ok"] for m in step["moves"]), step["moves"]
        assert {m["kind"] for m in step["moves"]} >= {"resume_engine"}
    released_in_step_1 = set(summary["steps"][0]["engines_released"])

    trained = [
        json.loads(line) for line in (out / "train" / "trained_samples.jsonl").read_text().splitlines()
    ]
    assert len({r["sample_id"] for r in trained}) == len(trained)  # none trained twice
    for record in trained:
        assert all(0 <= (record["step"] - 1) - s["weight_version"] <= 1 for s in record["spans"])

    # what step 1 carried with tokens went on in step 2 after those tokens: trained, or carried again
    later = {r["sample_id"]: r for r in trained if r["step"] == 2} | {
        s["sample_id"]: s for s in _carried(out, 2)
    }
    with_tokens = [s for s in _carried(out, 1) if s["spans"]]
    assert with_tokens
    for sample in with_tokens:
        after = later[sample["sample_id"]]
        assert after["spans"][: len(sample["spans"])] == sample["spans"]
    # among them, samples whose tokens came from an engine the actor took in step 1 and gave back:
    # resumed in step 2 on the new weights
    on_moved = [s for s in with_tokens if {span["engine_id"] for span in s["spans"]} & released_in_step_1]
    assert on_moved
    resumed = [
        span
        for s in on_moved
        if s["finish_reason"] == "abort"
        for span in later[s["sample_id"]]["spans"][len(s["spans"]) :]
    ]
    assert resumed and all(span["weight_version"] == 1 for span in resumed)
    # and the engines handed back made tokens again in step 2
    assert released_in_step_1 & {
        s["engine_id"] for r in trained if r["step"] == 2 for s in r["spans"] if s["weight_version"] == 1
    }
