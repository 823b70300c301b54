"""rollflow's RL step simulator against the claims of the RLinf and RLBoost papers.

python benchmarks/rl_paper_claims.py [--only rlinf|rlboost|preemption|speed] [--json FILE]

- RLinf: step time of dynamic scheduling (migrate + pre_process + wait_before_last_iter, and
  migrate alone) against static disaggregated placement, with and without pipelining, as the
  response-length tail, group size, mini-batch count and GPU count vary around a base shape.
- RLBoost: an on-demand cluster alone against the same cluster plus preemptible rollout
  instances: training throughput and tokens per dollar.
- Preemption: token-level migration against restart from the prompt, side by side.
- Speed: wall time to simulate one 64-GPU step of 512 x 16 samples, against the serving
  simulator running the same rollout alone (same process, same run).

Every row is a `rollflow rl-sim` config (examples/rl/*.yaml plus dotted overrides, printed).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from rollflow.config import load_config
from rollflow.sim.rl.accounting import summarize_run
from rollflow.sim.rl.config import RLSimConfig
from rollflow.sim.rl.runner import simulate_steps
from rollflow.sim.simulator import ServingSimulator
from rollflow.sim.workload import build_requests

REPO = Path(__file__).resolve().parents[1]
RLINF = REPO / "examples/rl/rlinf_dynamic.yaml"
RLBOOST = REPO / "examples/rl/rlboost_spot.yaml"

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


def rlinf_rows() -> list[dict]:
    base = {"sigma": 1.0, "group": 16, "minibatches": 4, "gpus": 16}
    shapes = [base]
    shapes += [base | {"sigma": s} for s in (0.5, 1.5)]
    shapes += [base | {"group": g} for g in (8, 32)]
    shapes += [base | {"minibatches": m} for m in (2, 8)]
    shapes += [base | {"gpus": g} for g in (32, 64)]
    rows = []
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
        rows.append({"shape": shape, "prompts": prompts, "overrides": overrides, "step_time_s": times})
        best = min(times["dynamic"], times["dynamic+pre+wait"])
        print(
            f"| sigma {shape['sigma']}, G={shape['group']}, {prompts}x{shape['group']} samples, "
            f"{shape['minibatches']} mini-batches, {shape['gpus']} GPUs "
            f"| {times['static']:.1f} | {times['static-pipelined']:.1f} | {times['dynamic']:.1f} "
            f"| {times['dynamic+pre+wait']:.1f} | {1 - best / times['static']:.0%} "
            f"| {1 - best / times['static-pipelined']:.0%} |",
            flush=True,
        )
    return rows


def rlboost_rows() -> list[dict]:
    rows = []
    shapes = {
        "median 1k, max 8k": ["workload.output_median_tokens=1024", "workload.max_new_tokens=8192"],
        "median 2k, max 16k": ["workload.output_median_tokens=2048", "workload.max_new_tokens=16384"],
    }
    budgets = {
        "adaptive": ["spot.offload.initial_budget_s=20"],
        "fixed 15 s": ["spot.offload.initial_budget_s=15", "spot.offload.gain=0"],
    }
    for shape, lengths in shapes.items():
        common = [*lengths, "steps=4", "spot.availability.mean_lifetime_s=3600"]
        alone = run(RLBOOST, [*common, "spot.instances=0"])
        for spot in (8, 16, 24):
            for budget, settings in budgets.items():
                boosted = run(RLBOOST, [*common, *settings, f"spot.instances={spot}"])
                speedup = boosted["throughput_tokens_per_s"] / alone["throughput_tokens_per_s"]
                cost_gain = alone["cost_usd_per_mtok"] / boosted["cost_usd_per_mtok"] - 1
                rows.append(
                    {
                        "shape": shape,
                        "spot_instances": spot,
                        "budget": budget,
                        "on_demand": alone,
                        "with_spot": boosted,
                    }
                )
                print(
                    f"| {shape}, 8 reserved + {spot} preemptible | {budget} | {alone['step_time_s']:.0f} "
                    f"| {boosted['step_time_s']:.0f} | {speedup:.2f}x | {cost_gain:+.0%} "
                    f"| {break_even_spot_price(alone, boosted, 1.28):.2f} |",
                    flush=True,
                )
    return rows


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


def preemption_rows() -> list[dict]:
    rows = []
    for lifetime in (300, 900):
        common = [f"spot.availability.mean_lifetime_s={lifetime}", "spot.instances=16"]
        results = {
            mode: run(RLBOOST, [*common, f"spot.on_preemption={mode}"]) for mode in ("migrate", "restart")
        }
        rows.append({"mean_lifetime_s": lifetime, **results})
        for mode, summary in results.items():
            print(
                f"| mean life {lifetime} s | {mode} | {summary['preemptions']} | {summary['preempted_sequences']} "
                f"| {summary['regenerated_tokens']} "
                f"| {summary['reprefill_tokens']} | {summary['step_time_s']:.1f} "
                f"| {summary['throughput_tokens_per_s']:.0f} |",
                flush=True,
            )
    return rows


def speed_rows() -> list[dict]:
    rows = []
    overrides = [*placement(64), "workload.num_prompts=512", "workload.samples_per_prompt=16", "steps=1"]
    for name in ("static-pipelined", "dynamic+pre+wait"):
        config = load_config(RLSimConfig, RLINF, [*overrides, *RLINF_POLICIES[name], "output.progress=false"])
        start = time.perf_counter()
        (step,) = simulate_steps(config)
        rl_wall = time.perf_counter() - start
        serving_config = config.rollout_sim_config()
        serving_config = serving_config.model_copy(
            update={"cluster": serving_config.cluster.model_copy(update={"replicas": 32})}
        )
        start = time.perf_counter()
        ServingSimulator(serving_config, build_requests(config.workload, config.seed)).run()
        serving_wall = time.perf_counter() - start
        rows.append(
            {"policy": name, "rl_wall_s": rl_wall, "serving_wall_s": serving_wall, "step_s": step.step_time_s}
        )
        print(
            f"| 64 H100, 512 x 16 samples, {name} | {step.step_time_s:.1f} | {rl_wall:.2f} | {serving_wall:.2f} "
            f"| {rl_wall / serving_wall:.2f}x | {step.step_time_s / rl_wall:.0f}x |",
            flush=True,
        )
    return rows


SECTIONS = {
    "rlinf": (
        "RLinf: step time (s) by policy",
        "| workload shape | static | static-pipelined | dynamic | dynamic+pre+wait | best vs static "
        "| best vs static-pipelined |\n|---|---:|---:|---:|---:|---:|---:|",
        rlinf_rows,
    ),
    "rlboost": (
        "RLBoost: adding preemptible rollout (migrate, mean life 1 h, $2.5 on-demand, $1.0 spot per GPU-hour)",
        "| response lengths, cluster | local budget | on-demand step (s) | with spot step (s) | throughput "
        "| tokens per $ | spot $/GPU-h for +28% tokens per $ |\n|---|---|---:|---:|---:|---:|---:|",
        rlboost_rows,
    ),
    "preemption": (
        "Preemption: migration vs restart (8 reserved + 16 preemptible, 4 steps)",
        "| availability | on preemption | preemptions | sequences hit | regenerated tokens | re-prefilled tokens "
        "| step (s) | tokens/s |\n|---|---|---:|---:|---:|---:|---:|---:|",
        preemption_rows,
    ),
    "speed": (
        "Speed: one 64-GPU step",
        "| step | simulated (s) | RL step wall (s) | serving-only rollout wall (s) | RL vs serving "
        "| simulated / wall |\n|---|---:|---:|---:|---:|---:|",
        speed_rows,
    ),
}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", choices=list(SECTIONS), action="append")
    parser.add_argument("--json", type=Path, help="also write every row here")
    args = parser.parse_args()
    results = {}
    for name in args.only or list(SECTIONS):
        title, header, rows = SECTIONS[name]
        print(f"\n{title}\n\n{header}", flush=True)
        results[name] = rows()
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
