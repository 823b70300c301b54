"""benchmarks/gpu/run.py end to end on the CPU (`--device cpu --small`): every stage runs, prints its
progress line and writes its results file, whose goals the run's exit status follows. No GPU needed."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.runtime.processes import ENV, REPO

pytestmark = pytest.mark.process

FILES = ("gpu_profile_ops", "gpu_engine_vs_sim", "gpu_manager", "gpu_trainer_step")


def test_the_gpu_run_on_a_cpu_writes_every_stage_and_meets_its_goals(tmp_path, vidur_data):
    argv = [sys.executable, str(REPO / "benchmarks" / "gpu" / "run.py"), "--device", "cpu", "--small"]
    argv += ["--results-dir", str(tmp_path / "results"), "--work-dir", str(tmp_path / "work")]
    argv += ["--vidur-data", str(vidur_data)]
    proc = subprocess.run(argv, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for stage in ("profile ops", "engine vs sim", "manager", "trainer step"):
        assert f"] {stage}: done (" in proc.stdout
    documents = {name: json.loads((tmp_path / "results" / f"{name}.json").read_text()) for name in FILES}
    assert sorted(p.name for p in (tmp_path / "results").iterdir()) == sorted(f"{n}.json" for n in FILES)
    for document in documents.values():
        assert document["goals"] and all(goal["met"] for goal in document["goals"])
        assert document["figures"]["device"]["device"] == "cpu" and "error" not in document["figures"]
    ops = documents["gpu_profile_ops"]
    assert ops["peers"]["vidur"].startswith("microsoft/vidur@")
    assert ops["figures"]["points_compared"] == ops["figures"]["points_profiled"] > 0
    engine = documents["gpu_engine_vs_sim"]["figures"]
    for load in ("0.4", "0.8"):
        for metric in ("ttft", "tpot", "e2e"):
            point = engine["loads"][load][f"{metric}_p50"]
            assert point["measured_s"] > 0 and point["simulated_s"] > 0
    manager = documents["gpu_manager"]["figures"]
    assert manager["tokens_per_s_manager"] > 0 and manager["tokens_per_s_direct"] > 0
    assert documents["gpu_trainer_step"]["figures"]["engine_weight_versions_after"] == [1, 1]


def test_a_stage_that_fails_is_a_missed_goal_and_the_next_stages_still_run(tmp_path):
    """Without Vidur's data the profile stage fails (its peer did not run); the others still run."""
    argv = [sys.executable, str(REPO / "benchmarks" / "gpu" / "run.py"), "--device", "cpu", "--small"]
    argv += ["--results-dir", str(tmp_path / "results"), "--work-dir", str(tmp_path / "work")]
    argv += ["--vidur-data", str(tmp_path / "no-vidur")]
    proc = subprocess.run(argv, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 1
    assert "] profile ops: FAILED: Vidur's table is not at" in proc.stdout
    ops = json.loads((tmp_path / "results" / "gpu_profile_ops.json").read_text())
    assert ops["peers"] == {"vidur": None}
    assert [g["met"] for g in ops["goals"]] == [False]
    assert "] manager: done (" in proc.stdout and "] trainer step: done (" in proc.stdout
    engine = json.loads((tmp_path / "results" / "gpu_engine_vs_sim.json").read_text())
    assert "error" in engine["figures"]  # the Splitwise trace is missing too, after the engines started
