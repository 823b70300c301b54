"""One simulated RL step at the scale users plan: 1,024 GPUs (goals: <= 10 s wall, <= 1 GiB peak
memory) and 4,096 GPUs (it runs; its time recorded).

python benchmarks/rl_step_scale.py [--quick] [--results-dir DIR]

Each step runs as a user runs it, `rollflow rl-sim run ... steps=1 --no-plots` in a process of its
own (wall time, CPU time and peak memory are that process's): examples/rl/rlinf_dynamic.yaml
scaled to N GPUs (actor a quarter, rollout half, inference a quarter) and 8 prompts x 16 samples
per GPU. The 1,024-GPU step runs again on the pure-Python loop (ROLLFLOW_PURE_PYTHON=1), the
compiled core's reference: the two summaries must agree (timings aside), and the ratio of their
wall times is recorded. --quick: 128 and 256 GPUs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.results import REPO, Results, benchmark_parser, results_dir

CONFIG = REPO / "examples" / "rl" / "rlinf_dynamic.yaml"
PROMPTS_PER_GPU = 8
MEASURED = ("wall_time_s", "peak_memory_mib")  # a summary's timings, left out when comparing two


def run_step(num_gpus: int, out: Path, pure_python: bool = False) -> dict:
    """One step on `num_gpus` GPUs in its own process: its wall, CPU and peak memory, its summary."""
    quarter = num_gpus // 4
    cmd = [
        sys.executable, "-m", "rollflow.cli", "rl-sim", "run", "--config", str(CONFIG),
        f"num_gpus={num_gpus}", f"placement.actor=0-{quarter - 1}",
        f"placement.rollout={quarter}-{3 * quarter - 1}", f"placement.inference={3 * quarter}-{num_gpus - 1}",
        f"workload.num_prompts={PROMPTS_PER_GPU * num_gpus}", "steps=1", "--no-plots", "--output-dir", str(out),
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "ROLLFLOW_PURE_PYTHON"}
    if pure_python:
        env["ROLLFLOW_PURE_PYTHON"] = "1"
    log = out.with_suffix(".log")
    started = time.perf_counter()
    with log.open("w") as sink:
        proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    code = os.waitstatus_to_exitcode(status)
    if code:
        print(f"{num_gpus}-GPU step failed ({code}):\n{log.read_text()[-2000:]}", file=sys.stderr)
        return {"exit_code": code, "wall_s": wall}
    summary = json.loads((out / "summary.json").read_text())
    return {
        "exit_code": 0,
        "wall_s": wall,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "peak_memory_mib": usage.ru_maxrss / 1024,
        "simulation_wall_s": summary["wall_time_s"],
        "simulated_step_s": summary["step_time_s"],
        "samples": summary["samples_per_step"],
        "summary": {k: v for k, v in summary.items() if k not in MEASURED},
    }


def main() -> None:
    parser = benchmark_parser(__doc__)
    args = parser.parse_args()
    planned, large = (128, 256) if args.quick else (1024, 4096)
    results = Results("rl_step_scale", results_dir(args))
    with tempfile.TemporaryDirectory() as tmp:
        runs = {
            "compiled": run_step(planned, Path(tmp) / "compiled"),
            "python": run_step(planned, Path(tmp) / "python", pure_python=True),
            "large": run_step(large, Path(tmp) / "large"),
        }
    compiled, python, big = runs["compiled"], runs["python"], runs["large"]
    rows = []
    for key, gpus, loop in (
        ("compiled", planned, "compiled"),
        ("python", planned, "pure Python"),
        ("large", large, "compiled"),
    ):
        run = runs[key]
        prefix = f"{gpus}_gpus_{'python' if key == 'python' else 'compiled'}"
        for name in ("wall_s", "cpu_s", "peak_memory_mib", "simulation_wall_s", "simulated_step_s"):
            results.figures[f"{prefix}_{name}"] = run.get(name)
        rows.append(
            [gpus, run.get("samples"), loop, run.get("simulated_step_s"), run["wall_s"], run.get("cpu_s"), run.get("peak_memory_mib")]
        )  # fmt: skip
    results.table(
        "One simulated RL step (rlinf_dynamic.yaml scaled), each in its own process",
        ["GPUs", "samples", "loop", "simulated step (s)", "wall (s)", "CPU (s)", "peak memory (MiB)"],
        rows,
    )
    if not compiled["exit_code"] and not python["exit_code"]:
        results.figures[f"{planned}_gpus_speedup_vs_python"] = python["wall_s"] / compiled["wall_s"]
        results.figures[f"{planned}_gpus_cpu_speedup_vs_python"] = python["cpu_s"] / compiled["cpu_s"]
        differences = sum(
            compiled["summary"].get(k) != python["summary"].get(k)
            for k in compiled["summary"].keys() | python["summary"].keys()
        )
    else:
        differences = None
    results.goal(f"{planned}-GPU step wall time (s)", compiled["wall_s"] if not compiled["exit_code"] else None, "<=", 10, headline=True)  # fmt: skip
    results.goal(f"{planned}-GPU step peak memory (MiB)", compiled.get("peak_memory_mib"), "<=", 1024, headline=True)  # fmt: skip
    results.goal(
        f"{planned}-GPU step: summary keys that differ, compiled vs pure Python", differences, "==", 0
    )
    results.goal(f"{large}-GPU step exit status", big["exit_code"], "==", 0)
    sys.exit(results.finish())


if __name__ == "__main__":
    main()
