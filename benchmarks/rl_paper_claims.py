"""rollflow's RL step simulator against the claims of the RLinf and RLBoost papers.

    .venv/bin/python benchmarks/rl_paper_claims.py
    .venv/bin/python benchmarks/rl_paper_claims.py --quick    # fewer shapes, smaller speed case

- RLinf: step time of dynamic scheduling (migrate + pre_process + wait_before_last_iter, and
  migrate alone) against static disaggregated placement, with and without pipelining, as the
  response-length tail, group size, mini-batch count and GPU count vary around a base shape.
  Goals: the paper's lower bound, 20% shorter steps, against static placement for every shape
  and, over the shapes' median, against static placement with pipelining.
- RLBoost: an on-demand cluster alone (on-policy, the paper's baseline) against the same cluster
  plus preemptible rollout instances, in four rollout modes (on-policy as the paper's unmodified
  algorithms, off-policy, partial rollout, both) over response lengths, reserved-to-preemptible
  ratios (1:1-1:3), mean instance lifetimes (5 min, 1 h) and preemptible-to-on-demand price ratios
  (0.1-0.4; tokens per dollar at each read from the same run's GPU-seconds). The paper's abstract
  states its figures, baseline, techniques and unmodified algorithms, not these ranges: they are
  assumptions, and the "settled" table gives, per condition, the range of rollflow's figures beside
  the paper's. Goal: the best configuration reaches the paper's lower throughput bound, 1.51x;
  tokens per dollar are recorded, not judged (docs/guides/rl-simulator.md says which price gives
  the paper's +28-49%).
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

import itertools
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from rollflow.config import load_config
from rollflow.sim.rl.accounting import summarize_run
from rollflow.sim.rl.config import RLSimConfig
from rollflow.sim.rl.runner import simulate_steps
from rollflow.sim.simulator import ServingSimulator
from rollflow.sim.workload import build_requests

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import Results, benchmark_parser, results_dir

REPO = Path(__file__).resolve().parents[1]
RLINF = REPO / "examples/rl/rlinf_dynamic.yaml"
RLBOOST = REPO / "examples/rl/rlboost_spot.yaml"

MIN_RLINF_GAIN = 0.20  # RLinf: 20-50% shorter steps
MIN_RLBOOST_SPEEDUP = 1.51  # RLBoost: 1.51-1.97x training throughput
RLBOOST_COST_GAIN = 1.28  # RLBoost: 28-49% better cost efficiency
# RLBoost's abstract (arXiv 2510.19225) is the only part of the paper the benchmark can cite: it states the
# figures, the baseline (the on-demand cluster alone), the techniques (adaptive rollout offload, pull-based
# weight transfer, token-level migration) and that RL algorithms stay unmodified (on-policy). Its response
# lengths, reserved-to-preemptible ratios, instance lifetimes and prices are swept here as assumptions,
# named as such in the table.
RLBOOST_PAPER_SPEEDUP = "1.51-1.97x"
RLBOOST_PAPER_COST = "+28-49%"
RLBOOST_MODES = {
    "on-policy (the paper's algorithm)": [],
    "off-policy 1": ["off_policy=1"],
    "partial rollout +16 prompts": ["partial_rollout=16"],
    "partial rollout +16, off-policy 1": ["partial_rollout=16", "off_policy=1"],
}
RLBOOST_SHAPES = {
    "median 1k, max 8k": ["workload.output_median_tokens=1024", "workload.max_new_tokens=8192"],
    "median 2k, max 16k": ["workload.output_median_tokens=2048", "workload.max_new_tokens=16384"],
}
RLBOOST_LIFETIMES_S = (300, 3600)
RLBOOST_SPOT_INSTANCES = (8, 16, 24)  # beside 8 reserved GPUs: 1:1, 1:2, 1:3
# Spot $/GPU-hour over on-demand $/GPU-hour: 0.1 stands for the abstract's "spare capacity in production
# clusters", 0.2-0.4 for public-cloud spot discounts (0.4: examples/rl/rlboost_spot.yaml's $1.0 against $2.5).
RLBOOST_PRICE_RATIOS = (0.1, 0.2, 0.3, 0.4)

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
    """The on-demand cluster alone against it plus preemptible rollout, for every rollout mode, response
    length shape, reserved-to-preemptible ratio and mean instance lifetime; tokens per dollar at each
    spot-to-on-demand price ratio follow from the same run's GPU-seconds (cost is linear in the prices)."""
    shapes = {"median 2k, max 16k": RLBOOST_SHAPES["median 2k, max 16k"]} if quick else RLBOOST_SHAPES
    lifetimes = (3600,) if quick else RLBOOST_LIFETIMES_S
    spots = (8, 24) if quick else RLBOOST_SPOT_INSTANCES
    rows, by_mode = [], {mode: [] for mode in RLBOOST_MODES}
    for (shape, lengths), lifetime in itertools.product(shapes.items(), lifetimes):
        common = [*lengths, "steps=6", f"spot.availability.mean_lifetime_s={lifetime}",
                  "spot.offload.initial_budget_s=20"]  # fmt: skip
        alone = run(RLBOOST, [*common, "spot.instances=0"])
        for mode, settings in RLBOOST_MODES.items():
            alone_in_mode = run(RLBOOST, [*common, *settings, "spot.instances=0"])
            for spot in spots:
                boosted = run(RLBOOST, [*common, *settings, f"spot.instances={spot}"])
                row = RLBoostRow(shape, lifetime, spot, mode, alone, alone_in_mode, boosted)
                by_mode[mode].append(row)
                rows.append(row.cells())
                print(f"RLBoost: {rows[-1]}", flush=True)
    results.table(
        f"RLBoost: on-demand alone against adding preemptible rollout (paper: {RLBOOST_PAPER_SPEEDUP} "
        f"throughput, {RLBOOST_PAPER_COST} tokens per $), 8 reserved H100s, migrate on preemption, 6 steps",
        ["response lengths", "mean life (s)", "preemptible", "rollout", "throughput", "of which spot",
         *(f"tokens per $, spot {r:.0%} of on-demand" for r in RLBOOST_PRICE_RATIOS),
         f"same, spot {RLBOOST_PRICE_RATIOS[-1]:.0%}, billed only busy", "spot price (of on-demand) for +28%",
         "spot utilization"],
        rows,
    )  # fmt: skip
    results.table(
        "RLBoost, settled: the paper's figures beside the range of rollflow's over the RLBoost sweep, per condition",
        ["condition", "stated by the paper", "paper", "rollflow: throughput",
         *(f"rollflow: tokens per $, spot {r:.0%} of on-demand" for r in RLBOOST_PRICE_RATIOS)],
        settled_rows(by_mode),
    )  # fmt: skip
    best = max((row for mode_rows in by_mode.values() for row in mode_rows), key=lambda row: row.speedup)
    results.figures["rlboost_best_speedup_setting"] = [best.shape, best.lifetime, best.spot, best.mode]
    results.figures["rlboost_tokens_per_dollar_gain_pct"] = {
        f"spot {ratio:.0%}": [100 * min(r.cost_gain(ratio) for rs in by_mode.values() for r in rs),
                              100 * max(r.cost_gain(ratio) for rs in by_mode.values() for r in rs)]
        for ratio in RLBOOST_PRICE_RATIOS
    }  # fmt: skip
    results.goal(
        "RLBoost: best training throughput gain from preemptible rollout (x)",
        best.speedup,
        ">=",
        MIN_RLBOOST_SPEEDUP,
        headline=True,
    )


@dataclass(frozen=True)
class RLBoostRow:
    """One setting of the RLBoost sweep: the runs it compares and the figures read from them."""

    shape: str  # response length distribution
    lifetime: int  # mean preemptible instance lifetime (s)
    spot: int  # preemptible instances beside the 8 reserved GPUs
    mode: str  # rollout mode (a key of RLBOOST_MODES)
    alone: dict  # the on-demand cluster alone, on-policy: the paper's baseline
    alone_in_mode: dict  # the on-demand cluster alone in this rollout mode
    boosted: dict  # the on-demand cluster plus the preemptible instances in this mode

    @property
    def speedup(self) -> float:
        return self.boosted["throughput_tokens_per_s"] / self.alone["throughput_tokens_per_s"]

    @property
    def spot_speedup(self) -> float:
        """The part of the gain the preemptible instances make (the mode's own gain taken out)."""
        return self.boosted["throughput_tokens_per_s"] / self.alone_in_mode["throughput_tokens_per_s"]

    def cost_gain(self, price_ratio: float, busy_only: bool = False) -> float:
        """Tokens per dollar against the baseline, minus 1, with spot at `price_ratio` x on-demand."""
        return (
            tokens_per_dollar(self.boosted, price_ratio, busy_only) / tokens_per_dollar(self.alone, 1.0) - 1
        )

    def break_even_ratio(self, gain: float) -> float:
        """The spot-to-on-demand price ratio at which tokens per dollar improve by `gain`."""
        tokens, reserved, spot = gpu_hours(self.boosted)
        target_cost = tokens / tokens_per_dollar(self.alone, 1.0) / (1 + gain)
        return (target_cost - reserved) / spot

    def break_even_cell(self) -> str:
        """The price ratio for the paper's lower cost figure, or why there is none: below that
        throughput gain even free preemptible GPUs cannot give it."""
        ratio = self.break_even_ratio(RLBOOST_COST_GAIN - 1)
        return f"{ratio:.0%}" if ratio > 0 else f"none (throughput < {RLBOOST_COST_GAIN}x)"

    def cells(self) -> list:
        return [self.shape, self.lifetime, f"8 + {self.spot}", self.mode, f"{self.speedup:.2f}x",
                f"{self.spot_speedup:.2f}x", *(f"{self.cost_gain(r):+.0%}" for r in RLBOOST_PRICE_RATIOS),
                f"{self.cost_gain(RLBOOST_PRICE_RATIOS[-1], busy_only=True):+.0%}",
                self.break_even_cell(),
                f"{self.boosted['spot_gpu_utilization']:.0%}"]  # fmt: skip


def gpu_hours(summary: dict) -> tuple[float, float, float]:
    """Trained tokens, reserved GPU-hours and preemptible GPU-hours (paid: alive) of a run."""
    steps = summary["steps"]
    return (
        sum(s["trained_tokens"] for s in steps),
        sum(s["reserved_gpu_s"] for s in steps) / 3600,
        sum(s["spot_gpu_s"] for s in steps) / 3600,
    )


def tokens_per_dollar(summary: dict, price_ratio: float, busy_only: bool = False) -> float:
    """Tokens per dollar at on-demand $1 and spot `price_ratio` per GPU-hour; `busy_only` bills a
    preemptible GPU only while it rolls out (the paper's accounting is not stated; this bounds it)."""
    tokens, reserved, spot = gpu_hours(summary)
    if busy_only:
        spot *= summary["spot_gpu_utilization"]
    return tokens / (reserved + spot * price_ratio)


def settled_rows(by_mode: dict[str, list[RLBoostRow]]) -> list[list[str]]:
    """Per condition (rollout mode, then lifetime, then ratio, then billing), the range of the sweep's figures."""

    def span(values: list[float], fmt: str) -> str:
        return f"{min(values):{fmt}} to {max(values):{fmt}}"

    def row(condition: str, stated: str, rs: list[RLBoostRow], busy_only: bool = False) -> list[str]:
        gains = [span([r.cost_gain(p, busy_only) for r in rs], "+.0%") for p in RLBOOST_PRICE_RATIOS]
        return [condition, stated, f"{RLBOOST_PAPER_SPEEDUP}, {RLBOOST_PAPER_COST}",
                span([r.speedup for r in rs], ".2f") + "x", *gains]  # fmt: skip

    def assumed(condition: str, rs: list[RLBoostRow], busy_only: bool = False) -> list[str]:
        """A row of partial rollout with off-policy under a condition the paper does not state."""
        return row(f"partial + off-policy, {condition}", "no: assumed", rs, busy_only)

    every = [r for rs in by_mode.values() for r in rs]
    both = by_mode["partial rollout +16, off-policy 1"]
    rows = [row(mode, "yes (unmodified algorithm)" if not settings else "no: rollflow's addition", by_mode[mode])
            for mode, settings in RLBOOST_MODES.items()]  # fmt: skip
    rows += [
        assumed(f"mean life {t} s", [r for r in both if r.lifetime == t])
        for t in sorted({r.lifetime for r in every})
    ]
    rows += [
        assumed(f"8 reserved + {n} preemptible", [r for r in both if r.spot == n])
        for n in sorted({r.spot for r in every})
    ]
    rows.append(assumed("preemptible GPUs billed only while rolling out", both, busy_only=True))
    return rows


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
    parser = benchmark_parser(__doc__)
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
