"""Static against dynamic scheduling on live device slots, and how well `rollflow rl-sim` predicts
the dynamic run from the static one.

Runs examples/demo/dynamic.yaml twice (cluster.auto_scheduler false, then true) on 127.0.0.1: manager,
weight server, built-in engines and the elastic actor, one process per device slot. Prints each
run's step times and the dynamic run's moves (kind, count, mean and max seconds; RLinf reports GPU
switches within 1 s, DynaRL 0.5-5 s per reallocation).

Then the prediction, calibrated on one run and judged on the other: it profiles one built-in engine
(`rollflow profile engine`) and simulates the same `cluster:` section with `rollflow rl-sim`, every
phase cost taken from the static run alone (seconds per mini-batch of training, the reference
forward pass at the same FLOP rate, seconds per weight sync, tokens per sample; resharding the
actor at rl-sim's default rate, since a static run never grows it). Nothing measured in the
dynamic run feeds the prediction of the dynamic run. The goals are the prediction's errors: the
dynamic run's mean step time, and the dynamic run's speed-up over the static one (static / dynamic
mean step time), each within its bound of what was measured live. The first step of each run is a
warm-up (its rollout waits on engines serving their first requests), left out of the calibration
and of the judged means on both sides alike; beside them the validity of
both runs (no token regenerated, every generated token trained, the same tokens trained by both,
no failed move).

    .venv/bin/python benchmarks/dynamic_live.py
    .venv/bin/python benchmarks/dynamic_live.py --quick   # 3 steps of 8 prompts x 2 samples, 64 tokens
    .venv/bin/python benchmarks/dynamic_live.py --steps 4 --output-dir outputs/bench/dynamic_live

Each run's summary.json and the dynamic run's gantt.png go under `--output-dir`. Writes
`dynamic_live.json` into `--results-dir` (see benchmarks/results.py) and exits non-zero when a
goal is missed.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.results import Results, benchmark_parser, results_dir
from rollflow.config import validate_config
from rollflow.perf.profile.hf_config import load_model_config, model_shape_section
from rollflow.runtime.demo.config import load_demo_config
from rollflow.runtime.demo.dynamic import check_dynamic, run_dynamic_demo
from rollflow.runtime.engines.tiny_model import write_tiny_model
from rollflow.runtime.launch.process import rollflow_command as rollflow
from rollflow.runtime.launch.servers import ENV, start_engine
from rollflow.sim.rl.config import RLSimConfig
from rollflow.sim.rl.costs import StepCosts
from rollflow.sim.rl.runner import simulate_steps

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "demo" / "dynamic.yaml"


FULL = {"steps": 3, "prompts_per_step": 16, "micro_batch_groups": 4, "max_new_tokens": 128}
QUICK = {"steps": 3, "prompts_per_step": 8, "micro_batch_groups": 2, "max_new_tokens": 64}
"""The example's workload, and `--quick`'s: 4 mini-batches a step either way, so the actor grows
1 -> 2 -> 4 in both."""

WARMUP_STEPS = 1
"""Steps left out of the calibration and of the judged means, on both sides: the first step's
rollout waits on engines serving their first requests (4-5 s against about 1 s after it, in a
quick run), a start-up cost rl-sim does not model."""

SPEEDUP_ERROR = 0.10
"""Goal: rl-sim's static/dynamic speed-up within 10% of the live one."""
STEP_TIME_ERROR = 0.25
"""Goal: rl-sim's dynamic mean step time within 25% of the live one."""


def live_run(out: Path, auto_scheduler: bool, overrides: list[str]) -> dict:
    overrides = [f"cluster.auto_scheduler={str(auto_scheduler).lower()}", *overrides]
    config = load_demo_config(EXAMPLE, overrides, str(out))
    check_dynamic(config)
    return run_dynamic_demo(config, out)


def profile_engine(model: Path, out: Path) -> tuple[Path, dict[str, float]]:
    """A built-in engine's iteration times as Vidur-format tables under `out` (what rl-sim's rollout
    reads), and the seconds it takes to free its memory and take it back (`release_s`, `resume_s`:
    what the dynamic run's moves cost, measured here, never in the run predicted); SystemExit with the
    profiler's last words when it fails."""
    engine = start_engine(model, out, name="profiled", extra_args=("--threads", "1"))
    try:
        tables = out / "profile"
        argv = rollflow(
            "profile", "engine", "--url", engine.url, "--kind", "builtin",
            "--model-config", str(model / "config.json"), "--out", str(tables),
            "--batch-sizes", "1,2,4,8", "--prompt-lengths", "16,64", "--decode-tokens", "16",
            "--memory-moves",
        )  # fmt: skip
        done = subprocess.run(argv, env=ENV, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(
                f"rollflow profile engine failed ({done.returncode}): {done.stderr.strip()[-500:]}"
            )
        return tables, memory_moves(done.stdout)
    finally:
        engine.stop()


def memory_moves(profile_stdout: str) -> dict[str, float]:
    """The `scheduling.release_s` and `resume_s` that `rollflow profile engine --memory-moves` printed."""
    for line in profile_stdout.splitlines():
        if "(simulate them with scheduling." in line:
            settings = line.rsplit("(simulate them with ", 1)[1].rstrip(")").split()
            return {k.removeprefix("scheduling."): float(v) for k, v in (s.split("=") for s in settings)}
    raise SystemExit(
        f"rollflow profile engine printed no memory release and resume:\n{profile_stdout[-500:]}"
    )


def simulated(
    config, static: dict, tables: Path, moves: dict[str, float], auto_scheduler: bool
) -> list[float]:
    """rl-sim's step times for the live config, every phase cost measured in the static run (the
    calibration) or by the profiler (the engines' iterations, and `moves`: an engine's memory release
    and resume); the actor's resharding at rl-sim's default rate."""
    train, cluster = config.train, config.cluster
    num_minibatches = train.prompts_per_step // (train.micro_batch_groups * train.mini_batch_micro_batches)
    steps = static["steps"][WARMUP_STEPS:]
    samples = train.prompts_per_step * train.n_samples
    output_tokens = statistics.mean(s["tokens_trained"] for s in steps) / samples
    train_s = statistics.mean(s["train_s"] for s in steps) / num_minibatches  # one mini-batch, one slot
    sync_s = statistics.mean(s["update_weights_s"] for s in steps)
    raw = {
        "steps": len(steps),
        "model": "tiny",
        "model_shape": model_shape_section(load_model_config(train.model)),
        "cluster": cluster.model_dump() | {"auto_scheduler": auto_scheduler},
        "scheduling": moves,
        "workload": {
            "num_prompts": train.prompts_per_step,
            "samples_per_prompt": train.n_samples,
            "prompt_tokens": 8,
            "output_median_tokens": max(1, round(output_tokens)),
            "output_sigma": 0.3,
            "max_new_tokens": train.max_new_tokens,
        },
        "rollout": {
            "scheduler": {"kind": "sarathi", "chunk_size": 256, "batch_size_cap": 8},
            "execution": {
                "kind": "tables",
                "compute_table": str(tables / "mlp.csv"),
                "attention_table": str(tables / "attention.csv"),
                "max_batch_size": 8,
            },
        },
        "training": {"num_minibatches": num_minibatches, "optimizer_step_s": 0.0},
        "inference": {"num_models": 1 if "inference" in cluster.component_placement else 0},
        "weight_sync": {"fixed_s": sync_s, "link_gb_per_s": 1e6},
        "output": {"progress": False, "gantt": False, "chrome_trace": False},
    }
    sim = validate_config(RLSimConfig, raw)
    costs = StepCosts.from_config(sim)
    tokens = samples * output_tokens / num_minibatches
    mfu = costs.train_flops_per_token_param * costs.num_params * tokens / (costs.peak_flops_per_gpu * train_s)
    raw["training"]["mfu"] = min(1.0, mfu)
    raw["inference"]["mfu"] = min(1.0, mfu)  # a reference forward pass: a third of a training pass's FLOPs
    return [round(step.step_time_s, 2) for step in simulate_steps(validate_config(RLSimConfig, raw))]


def main() -> None:
    parser = benchmark_parser(__doc__)
    parser.add_argument(
        "--steps", type=int, help=f"training steps per run ({FULL['steps']}; --quick: {QUICK['steps']})"
    )
    parser.add_argument("--output-dir", type=Path, default=Path("outputs/bench/dynamic_live"))
    args = parser.parse_args()
    workload = (QUICK if args.quick else FULL) | ({"steps": args.steps} if args.steps else {})
    if workload["steps"] <= WARMUP_STEPS:
        parser.error(f"--steps must be more than {WARMUP_STEPS}: the first step is a warm-up, not judged")
    overrides = [f"train.{key}={value}" for key, value in workload.items()]
    results = Results("dynamic_live", results_dir(args))
    out = args.output_dir
    config = load_demo_config(EXAMPLE, overrides, str(out))
    if not Path(config.train.model).is_dir():
        write_tiny_model(Path(config.train.model))
    static = live_run(out / "static", False, overrides)
    dynamic = live_run(out / "dynamic", True, overrides)
    with tempfile.TemporaryDirectory() as scratch:  # a fresh profile each run, never an old one
        tables, memory = profile_engine(Path(config.train.model), Path(scratch))
        predicted = {
            "static": simulated(config, static, tables, memory, False),
            "dynamic": simulated(config, static, tables, memory, True),
        }
    live = {"static": static["step_time_s"], "dynamic": dynamic["step_time_s"]}
    mean = {  # after the warm-up steps
        (source, name): statistics.mean(times[name][WARMUP_STEPS:])
        for source, times in (("live", live), ("rl-sim", predicted))
        for name in ("static", "dynamic")
    }
    speedup = {source: mean[source, "static"] / mean[source, "dynamic"] for source in ("live", "rl-sim")}
    after = f"after step {WARMUP_STEPS}"
    columns = [
        "run",
        "live step times (s)",
        "rl-sim (s)",
        f"live mean {after} (s)",
        f"rl-sim mean {after} (s)",
    ]
    columns.append("rl-sim error")
    rows = []
    for name, role in (("static", "calibration"), ("dynamic", "predicted")):
        error = mean["rl-sim", name] / mean["live", name] - 1
        rows.append(
            [
                f"{name} ({role})",
                " ".join(f"{t:.2f}" for t in live[name]),
                " ".join(f"{t:.2f}" for t in predicted[name]),
                round(mean["live", name], 2),
                round(mean["rl-sim", name], 2),
                f"{error:+.1%}",
            ]
        )
    print(" | ".join(columns))
    for row in rows:
        print(" | ".join(map(str, row)))
    print(f"static / dynamic mean step time: live {speedup['live']:.2f}x, rl-sim {speedup['rl-sim']:.2f}x")
    moves: dict[str, list[float]] = {}
    for step in dynamic["steps"]:
        for move in step["moves"]:
            moves.setdefault(move["kind"], []).append(move["seconds"])
    print(f"\n{'move':<24} {'count':>5} {'mean s':>8} {'max s':>8}")
    move_rows = []
    for kind, seconds in sorted(moves.items()):
        move_rows.append([kind, len(seconds), round(statistics.mean(seconds), 3), round(max(seconds), 3)])
        print(f"{kind:<24} {len(seconds):>5} {statistics.mean(seconds):>8.3f} {max(seconds):>8.3f}")
    results.figures = {
        "workload": workload,
        "live": live,
        "rl_sim": predicted,
        "speedup_static_over_dynamic": speedup,
        "profiled_memory_moves_s": memory,
        "moves": moves,
    }
    results.table(
        "Step times: rl-sim calibrated on the static run, predicting the dynamic one", columns, rows
    )
    results.table("The dynamic run's moves", ["move", "count", "mean s", "max s"], move_rows)
    results.goal(
        "rl-sim's static/dynamic speed-up, relative error against live",
        abs(speedup["rl-sim"] / speedup["live"] - 1),
        "<=",
        SPEEDUP_ERROR,
        headline=True,
    )
    results.goal(
        "rl-sim's dynamic mean step time, relative error against live",
        abs(mean["rl-sim", "dynamic"] / mean["live", "dynamic"] - 1),
        "<=",
        STEP_TIME_ERROR,
        headline=True,
    )
    runs = (static, dynamic)
    results.goal("tokens regenerated, both runs", sum(r["tokens_regenerated"] for r in runs), "==", 0)
    results.goal(
        "steps whose generated tokens differ from those trained, both runs",
        sum(s["tokens_generated"] != s["tokens_trained"] for r in runs for s in r["steps"]),
        "==",
        0,
    )
    results.goal(
        "steps whose trained tokens differ between the static and the dynamic run",
        sum(
            a["tokens_trained"] != b["tokens_trained"]
            for a, b in zip(static["steps"], dynamic["steps"], strict=True)
        ),
        "==",
        0,
    )
    results.goal("moves that failed", sum(not m["ok"] for s in dynamic["steps"] for m in s["moves"]), "==", 0)
    sys.exit(results.finish())


if __name__ == "__main__":
    main()
