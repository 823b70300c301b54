"""The RL simulator's outputs stay what they were: each case's steps and run summary equal, to the
bit, the ones `tests/sim/rl/golden/steps.json` recorded, on the compiled core and on its Python twin.

The cases cover each part of a step (lanes, progress, reserved and spot instances, offload, resource
decisions, partial rollout, the manager's relay) and their mixes, so a refactor that changes what
any of them does fails here. A change that is meant to change the outputs rewrites the file:

    ROLLFLOW_UPDATE_GOLDEN=1 .venv/bin/pytest -q tests/sim/rl/test_golden.py

and the diff of steps.json shows what changed. The spot lives come from a trace file, so no case
depends on how a platform's libm rounds a random draw.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import pytest

from rollflow.native import PURE_PYTHON_ENV
from rollflow.sim.rl.accounting import summarize_run
from rollflow.sim.rl.runner import simulate_steps
from tests.sim.rl.factories import DISAGGREGATED, rl_config

GOLDEN = Path(__file__).parent / "golden"
STEPS_FILE = GOLDEN / "steps.json"
UPDATE_ENV = "ROLLFLOW_UPDATE_GOLDEN"
MEASURED = ("wall_time_s", "peak_memory_mib")  # of the process, not of the simulation

DYNAMIC = [*DISAGGREGATED, "placement.pipelining=true", "scheduling.kind=dynamic"]
SPOT = [
    "spot.instances=4",
    "spot.availability.kind=trace",
    f"spot.availability.file={GOLDEN / 'spot_lives.csv'}",
    "spot.availability.notice_s=1",
    "spot.startup_s=3",
    "spot.offload.initial_budget_s=4",
]
MANAGER = ["manager.processes=1", "manager.cpu_us_per_token=400"]
CASES: dict[str, list[str]] = {
    "collocated": ["steps=2"],
    "static-pipelined": ["steps=2", *DISAGGREGATED, "placement.pipelining=true"],
    "dynamic-both-policies": [
        "steps=2",
        *DYNAMIC,
        "scheduling.pre_process=true",
        "scheduling.wait_before_last_iter=true",
    ],
    "dynamic-off-policy": ["steps=3", *DYNAMIC, "scheduling.pre_process=true", "off_policy=1"],
    "spot-migrate": ["steps=3", *SPOT],
    "spot-restart-off-policy": ["steps=3", *SPOT, "spot.on_preemption=restart", "off_policy=1"],
    "spot-partial": ["steps=3", *SPOT, "partial_rollout=4"],
    "partial-dynamic-off-policy": ["steps=3", *DYNAMIC, "partial_rollout=4", "off_policy=1"],
    "manager-bound": ["steps=2", *DYNAMIC, *MANAGER],
    "manager-spot-partial": ["steps=2", *SPOT, *MANAGER, "partial_rollout=2"],
}


def _outputs(overrides: list[str]) -> dict[str, Any]:
    """A case's run summary and every step's result, as JSON reads them back."""
    config = rl_config(*overrides)
    steps = simulate_steps(config)
    summary = summarize_run(config, steps, 0.0)
    for key in MEASURED:
        summary.pop(key)
    # the relay's capacity names where its cost came from; the case fixes it, the record need not
    results = [dataclasses.asdict(dataclasses.replace(step, manager=None)) for step in steps]
    return json.loads(json.dumps({"summary": summary, "steps": results}))


def _dumps(recorded: dict[str, Any]) -> str:
    """JSON with one line per summary key and per step field: a diff names what changed, and the
    file stays a fraction of its indented size."""

    def fields(record: dict[str, Any], indent: str) -> str:
        return ",\n".join(
            f"{indent}{json.dumps(k)}: {json.dumps(v, sort_keys=True)}" for k, v in sorted(record.items())
        )

    cases = []
    for name, outputs in sorted(recorded.items()):
        steps = ",\n".join(f"   {{\n{fields(step, '    ')}\n   }}" for step in outputs["steps"])
        summary = fields(outputs["summary"], "   ")
        cases.append(
            f' {json.dumps(name)}: {{\n  "summary": {{\n{summary}\n  }},\n  "steps": [\n{steps}\n  ]\n }}'
        )
    return "{\n" + ",\n".join(cases) + "\n}\n"


def _first_difference(expected: Any, got: Any, path: str = "") -> str | None:
    """Where two JSON values first differ, as a path and the two values."""
    if isinstance(expected, dict) and isinstance(got, dict):
        for key in sorted(expected.keys() | got.keys()):
            if key not in expected or key not in got:
                return f"{path}.{key}: only in {'the golden file' if key in expected else 'this run'}"
            found = _first_difference(expected[key], got[key], f"{path}.{key}")
            if found:
                return found
        return None
    if isinstance(expected, list) and isinstance(got, list):
        if len(expected) != len(got):
            return f"{path}: {len(expected)} items in the golden file, {len(got)} now"
        for i, (a, b) in enumerate(zip(expected, got, strict=True)):
            found = _first_difference(a, b, f"{path}[{i}]")
            if found:
                return found
        return None
    return None if expected == got else f"{path}: golden {expected!r}, now {got!r}"


@pytest.fixture(scope="module")
def golden() -> dict[str, Any]:
    if os.environ.get(UPDATE_ENV):
        recorded = {name: _outputs(overrides) for name, overrides in CASES.items()}
        STEPS_FILE.write_text(_dumps(recorded))
        pytest.skip(f"{UPDATE_ENV} is set: wrote {STEPS_FILE}")
    return json.loads(STEPS_FILE.read_text())


@pytest.mark.parametrize("core", ["compiled", "python"])
@pytest.mark.parametrize("name", CASES)
def test_the_simulators_outputs_are_the_recorded_ones(monkeypatch, golden, name, core):
    if core == "python":
        monkeypatch.setenv(PURE_PYTHON_ENV, "1")
    else:
        pytest.importorskip("rollflow.sim._loop", reason="compiled loop not built (make compiled)")
        monkeypatch.delenv(PURE_PYTHON_ENV, raising=False)
    assert name in golden, f"case {name} is not in {STEPS_FILE}; set {UPDATE_ENV}=1 to record it"
    outputs = _outputs(CASES[name])
    difference = _first_difference(golden[name], outputs)
    assert difference is None, (
        f"{name} ({core}): {difference}. If the change is meant, set {UPDATE_ENV}=1 to record it."
    )


# what each case is there to exercise, read from its recorded summary
COVERS: dict[str, Any] = {
    "spot": lambda s: s["preemptions"] > 0 and s["preempted_sequences"] > 0 and s["migrated_sequences"] > 0,
    "restart": lambda s: s["regenerated_tokens"] > 0,
    "partial": lambda s: s["carried_samples"] > 0 and s["reprefill_tokens"] > 0,
    "dynamic": lambda s: (
        s["migrated_sequences"] > 0
        and any(
            step["actor_gpus_per_minibatch"][-1] > step["actor_gpus_per_minibatch"][0] for step in s["steps"]
        )
    ),
    "off-policy": lambda s: s["max_sample_staleness"] >= 1,
    "manager": lambda s: s["manager_max_sample_wait_s"] > 0,
}


@pytest.mark.parametrize("name", CASES)
def test_each_recorded_case_exercises_the_parts_it_is_named_for(golden, name):
    summary = golden[name]["summary"]
    for part, exercised in COVERS.items():
        if part in name:
            assert exercised(summary), f"case {name} no longer exercises {part}: change its overrides"
