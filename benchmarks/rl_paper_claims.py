"""rollflow's RL step simulator against the claims of the RLinf and RLBoost papers.

    .venv/bin/python benchmarks/rl_paper_claims.py
    .venv/bin/python benchmarks/rl_paper_claims.py --quick    # fewer shapes, smaller speed case

- RLinf: step time of dynamic scheduling (migrate + pre_process + wait_before_last_iter, and
  migrate alone) against static disaggregated placement, with and without pipelining, as the
  response-length tail, group size, mini-batch count and GPU count vary around a base shape.
  Goals: the paper's lower bound, 20% shorter steps, against static placement for every shape
  and, over the shapes' median, against static placement with pipelining.
- RLBoost: an on-demand cluster alone against the same cluster plus preemptible rollout
  instances: training throughput (goal: the best configuration reaches the paper's lower bound,
  1.51x) and tokens per dollar (recorded with the spot price at which the paper's +28% would
  hold; not a goal: at $1.0 spot the simulation finds tokens per dollar worse, see
  docs/guides/rl-simulator.md).
- Preemption: token-level migration against restart from the prompt, side by side (goal:
  migration regenerates no token).
- Speed: wall time to simulate one 64-GPU step of 512 x 16 samples, against the serving
  simulator running the same rollout alone (same process; each side's best of `--repeats`
  rounds taken in turns). Recorded, not judged: the docs make no claim about it. The serving
  simulator runs its compiled loop, the RL step the Python one (rollflow/sim/_loop.c covers
  serving only), so the ratio says what compiling the RL pool would buy.

Every row is a `rollflow rl-sim` config (examples/rl/*.yaml plus dotted overrides, recorded).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from rollflow.config import load_config
from rollflow.sim.rl.accounting import summarize_run
from rollflow.sim.rl.config import RLSimConfig
from rollflow.sim.rl.runner import simulate_steps
from rollflow.sim.simulator import ServingSimulator
from rollflow.sim.workload import build_requests

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import Results, add_results_dir, results_dir

REPO = Path(__file__).resolve().parents[1]
RLINF = REPO / "examples/rl/rlinf_dynamic.yaml"
RLBOOST = REPO / "examples/rl/rlboost_spot.yaml"

MIN_RLINF_GAIN = 0.20  # RLinf: 20-50% shorter steps
MIN_RLBOOST_SPEEDUP = 1.51  # RLBoost: 1.51-1.97x training throughput
RLBOOST_COST_GAIN = 1.28  # RLBoost: 28-49% better cost efficiency

RLINF_POLICIES = {
    "static": ["scheduling.kind=static", "placement.pipelining=false"],
    "static-pipelined": ["scheduling.kind=static"],
    "dynamic": [],
    "dynamic+pre+wait": ["scheduling.pre_process=true", "scheduling.wait_before_last_iter=true"],
}


def run(path: Path, overrides: list[str]) -> dict:
    config = load_config(RLSimConfig, path, [*overrides, "output.progress=false"])
    start = time.perf_counter()
    steps = simulate_steps(config)
    return summarize_run(config, steps, time.perf_counter() - start)


def placement(num_gpus: int) -> list[str]:
    """A quarter of the GPUs for the actor, half for rollout, a quarter for inference."""
    q = num_gpus // 4
    return [
        f"num_gpus={num_gpus}",
        f"placement.actor=0-{q - 1}",
        f"placement.rollout={q}-{3 * q - 1}",
        f"placement.inference={3 * q}-{num_gpus - 1}",
    ]


def rlinf(results: Results, quick: bool) -> None:
    base = {"sigma": 1.0, "group": 16, "minibatches": 4, "gpus": 16}
    shapes = [base]
    shapes += [base | {"sigma": s} for s in ((0.5,) if quick else (0.5, 1.5))]
    if not quick:
        shapes += [base | {"group": g} for g in (8, 32)]
        shapes += [base | {"minibatches": m} for m in (2, 8)]
        shapes += [base | {"gpus": g} for g in (32, 64)]
    rows, against_static, against_pipelined = [], [], []
    for shape in shapes:
        prompts = 2048 // shape["group"] * shape["gpus"] // 16
        overrides = [
            f"workload.output_sigma={shape['sigma']}",
            f"workload.samples_per_prompt={shape['group']}",
            f"workload.num_prompts={prompts}",
            f"training.num_minibatches={shape['minibatches']}",
            *placement(shape["gpus"]),
        ]
        times = {
            name: run(RLINF, [*overrides, *extra])["step_time_s"] for name, extra in RLINF_POLICIES.items()
        }
        best = min(times["dynamic"], times["dynamic+pre+wait"])
        against_static.append(1 - best / times["static"])
        against_pipelined.append(1 - best / times["static-pipelined"])
        label = (
            f"sigma {shape['sigma']}, G={shape['group']}, {prompts}x{shape['group']} samples, "
            f"{shape['minibatches']} mini-batches, {shape['gpus']} GPUs"
        )
        rows.append([label, *(round(t, 1) for t in times.values()),
                     f"{against_static[-1]:.0%}", f"{against_pipelined[-1]:.0%}"])  # fmt: skip
        print(f"RLinf: {label}: {times}", flush=True)
    results.table(
        "RLinf: step time (s) by policy",
        ["workload shape", *RLINF_POLICIES, "best vs static", "best vs static-pipelined"],
        rows,
    )
    results.goal(
        f"RLinf: smallest step reduction of dynamic scheduling against static placement, {len(shapes)} shapes (%)",
        100 * min(against_static),
        ">=",
        100 * MIN_RLINF_GAIN,
    )
    results.goal(
        f"RLinf: median step reduction of dynamic scheduling against static pipelined placement, "
        f"{len(shapes)} shapes (%)",
        100 * statistics.median(against_pipelined),
        ">=",
        100 * MIN_RLINF_GAIN,
        headline=True,
    )


def rlboost(results: Results, quick: bool) -> None:
    shapes = {
        "median 1k, max 8k": ["workload.output_median_tokens=1024", "workload.max_new_tokens=8192"],
        "median 2k, max 16k": ["workload.output_median_tokens=2048", "workload.max_new_tokens=16384"],
    }
    budgets = {
        "adaptive": ["spot.offload.initial_budget_s=20"],
        "fixed 15 s": ["spot.offload.initial_budget_s=15", "spot.offload.gain=0"],
    }
    if quick:
        shapes, budgets = (
            {"median 2k, max 16k": shapes["median 2k, max 16k"]},
            {"adaptive": budgets["adaptive"]},
        )
    rows, speedups, cost_gains = [], [], []
    for shape, lengths in shapes.items():
        common = [*lengths, "steps=4", "spot.availability.mean_lifetime_s=3600"]
        alone = run(RLBOOST, [*common, "spot.instances=0"])
        for spot in (16, 24) if quick else (8, 16, 24):
            for budget, settings in budgets.items():
                boosted = run(RLBOOST, [*common, *settings, f"spot.instances={spot}"])
                speedups.append(boosted["throughput_tokens_per_s"] / alone["throughput_tokens_per_s"])
                cost_gains.append(alone["cost_usd_per_mtok"] / boosted["cost_usd_per_mtok"] - 1)
                rows.append([f"{shape}, 8 reserved + {spot} preemptible", budget, round(alone["step_time_s"]),
                             round(boosted["step_time_s"]), f"{speedups[-1]:.2f}x", f"{cost_gains[-1]:+.0%}",
                             round(break_even_spot_price(alone, boosted, RLBOOST_COST_GAIN), 2)])  # fmt: skip
                print(f"RLBoost: {rows[-1]}", flush=True)
    results.table(
        "RLBoost: adding preemptible rollout (migrate, mean life 1 h, $2.5 on-demand, $1.0 spot per GPU-hour)",
        ["response lengths, cluster", "local budget", "on-demand step (s)", "with spot step (s)", "throughput",
         "tokens per $", f"spot $/GPU-h for +{RLBOOST_COST_GAIN - 1:.0%} tokens per $"],
        rows,
    )  # fmt: skip
    results.figures["rlboost_tokens_per_dollar_gain_pct"] = [100 * min(cost_gains), 100 * max(cost_gains)]
    results.goal(
        "RLBoost: best training throughput gain from preemptible rollout (x)",
        max(speedups),
        ">=",
        MIN_RLBOOST_SPEEDUP,
        headline=True,
    )


def break_even_spot_price(alone: dict, boosted: dict, gain: float) -> float:
    """Spot $/GPU-hour at which adding preemptible rollout improves tokens per dollar by `gain`."""
    tokens = sum(s["trained_tokens"] for s in boosted["steps"])
    reserved = sum(s["reserved_gpu_s"] for s in boosted["steps"]) / 3600
    spot = sum(s["spot_gpu_s"] for s in boosted["steps"]) / 3600
    on_demand_price = (
        alone["cost_usd_per_step"]
        * alone["num_steps"]
        / (sum(s["reserved_gpu_s"] for s in alone["steps"]) / 3600)
    )
    target_cost = tokens * alone["cost_usd_per_mtok"] / 1e6 / gain
    return max(0.0, (target_cost - reserved * on_demand_price) / spot)


def preemption(results: Results, quick: bool) -> None:
    rows, migrated_regenerated = [], 0
    for lifetime in (300,) if quick else (300, 900):
        common = [f"spot.availability.mean_lifetime_s={lifetime}", "spot.instances=16"]
        for mode in ("migrate", "restart"):
            summary = run(RLBOOST, [*common, f"spot.on_preemption={mode}"])
            if mode == "migrate":
                migrated_regenerated += summary["regenerated_tokens"]
            rows.append([f"mean life {lifetime} s", mode, summary["preemptions"], summary["preempted_sequences"],
                         summary["regenerated_tokens"], summary["reprefill_tokens"],
                         round(summary["step_time_s"], 1), round(summary["throughput_tokens_per_s"])])  # fmt: skip
            print(f"preemption: {rows[-1]}", flush=True)
    results.table(
        "Preemption: migration vs restart (8 reserved + 16 preemptible, 4 steps)",
        ["availability", "on preemption", "preemptions", "sequences hit", "regenerated tokens",
         "re-prefilled tokens", "step (s)", "tokens/s"],
        rows,
    )  # fmt: skip
    results.goal(
        "tokens regenerated after preemption with token-level migration", migrated_regenerated, "==", 0
    )


def speed(results: Results, quick: bool, repeats: int) -> None:
    """One step against the serving simulator on the same rollout, each timed `repeats` times in
    turns, each side's best kept."""
    gpus, prompts = (32, 256) if quick else (64, 512)
    overrides = [
        *placement(gpus),
        f"workload.num_prompts={prompts}",
        "workload.samples_per_prompt=16",
        "steps=1",
    ]
    rows, ratios = [], []
    for name in ("static-pipelined", "dynamic+pre+wait"):
        config = load_config(RLSimConfig, RLINF, [*overrides, *RLINF_POLICIES[name], "output.progress=false"])
        serving_config = config.rollout_sim_config()
        serving_config = serving_config.model_copy(
            update={"cluster": serving_config.cluster.model_copy(update={"replicas": gpus // 2})}
        )
        rl_walls, serving_walls = [], []
        for _ in range(repeats):
            start = time.perf_counter()
            (step,) = simulate_steps(config)
            rl_walls.append(time.perf_counter() - start)
            start = time.perf_counter()
            ServingSimulator(serving_config, build_requests(config.workload, config.seed)).run()
            serving_walls.append(time.perf_counter() - start)
        rl_wall, serving_wall = min(rl_walls), min(serving_walls)
        ratios.append(rl_wall / serving_wall)
        rows.append([f"{gpus} H100, {prompts} x 16 samples, {name}", round(step.step_time_s, 1), round(rl_wall, 2),
                     round(serving_wall, 2), f"{ratios[-1]:.2f}x", f"{step.step_time_s / rl_wall:.0f}x"])  # fmt: skip
        print(f"speed: {rows[-1]}", flush=True)
    results.table(
        f"Speed: one {gpus}-GPU step, best of {repeats} rounds per side",
        ["step", "simulated (s)", "RL step wall (s)", "serving-only rollout wall (s)", "RL vs serving",
         "simulated / wall"],
        rows,
    )  # fmt: skip
    results.figures["rl_step_wall_over_serving"] = ratios


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_results_dir(parser)
    parser.add_argument(
        "--repeats", type=int, default=None, help="speed rounds per side (default 3; --quick: 1)"
    )
    args = parser.parse_args()
    results = Results("rl_paper_claims", results_dir(args))
    rlinf(results, args.quick)
    rlboost(results, args.quick)
    preemption(results, args.quick)
    speed(results, args.quick, args.repeats or (1 if args.quick else 3))
    sys.exit(results.finish())


if __name__ == "__main__":
    main()
