"""The dynamic-scheduling demo: RLinf's auto scheduler on real processes, device slots moving within each step.

    summary = run_dynamic_demo(load_demo_config("examples/demo/dynamic.yaml"), Path("outputs/dynamic"))

The config's `cluster:` section (RLinf's keys) places the components on device slots; one engine
serves each rollout slot (and, with `use_pre_process_policy`, each actor slot at step start), the
actor is an elastic group of one trainer process per slot it may ever hold. With `auto_scheduler`
the executor applies the policy's moves live; without it the same run is static. Writes
summary.json (per step: actor_sizes, engines_released, moves, tokens) and gantt.png.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from rollflow.errors import UserError
from rollflow.runtime.demo.config import DemoFile
from rollflow.runtime.dynamic.executor import DynamicExecutor
from rollflow.runtime.dynamic.snapshot import EngineSlot, LiveLayout
from rollflow.runtime.launch.launcher import Launcher
from rollflow.runtime.trainer.metrics import StepMetrics
from rollflow.runtime.weights.token import TOKEN_ENV as WEIGHTS_TOKEN_ENV

COUNTERS = {
    "tokens_generated": "rollflow_generated_tokens_total",
    "tokens_regenerated": "rollflow_regenerated_tokens_total",
}


def engine_devices(config: DemoFile) -> list[tuple[int, bool]]:
    """(first device, borrowed from the actor) of each engine the placement needs, in device order."""
    cluster = config.cluster
    ranges = cluster.ranges()
    borrowed = cluster.auto_scheduler and cluster.use_pre_process_policy
    actor = [(d, True) for d in ranges["actor"].devices()] if borrowed else []
    return actor + [(d, False) for d in ranges["rollout"].devices()]


def run_dynamic_demo(config: DemoFile, output_dir: Path) -> dict:
    """Run the demo; returns what summary.json holds."""
    from rollflow.runtime.demo.run import prepare_model
    from rollflow.runtime.dynamic.gantt import plot_live_gantt
    from rollflow.runtime.dynamic.trainer import DynamicTrainer
    from rollflow.runtime.inference.workers import start_inference
    from rollflow.runtime.trainer.checkpoints import clear_outputs
    from rollflow.runtime.trainer.config import TrainConfig
    from rollflow.runtime.trainer.elastic import spec_from_cluster, start_elastic

    cluster = config.cluster
    prepare_model(config)
    clear_outputs(Path(config.train.output_dir))
    output_dir.mkdir(parents=True, exist_ok=True)
    devices = engine_devices(config)
    engine_pool = config.launch.engines[0].model_copy(
        update={"count": len(devices), "threads": cluster.threads_per_device}
    )
    launch_config = config.launch.model_copy(update={"engines": [engine_pool]})
    steps: list[StepMetrics] = []
    with Launcher(launch_config) as launch:
        if launch.weights_token is not None:
            os.environ[WEIGHTS_TOKEN_ENV] = launch.weights_token
        train_config = TrainConfig.model_validate(
            config.train.model_dump()
            | {
                "manager_url": launch.manager_url,
                "manager_token": config.launch.manager.token,
                "weights_url": launch.weights_url,
                "cluster": cluster.model_dump(),
                "device": "cpu" if cluster.device == "cpu" else "cuda:0",
            }
        )
        trainer = DynamicTrainer(train_config, resume=False)
        actor = start_elastic(trainer, spec_from_cluster(cluster))
        ranges = cluster.ranges()
        inference = ranges.get("inference")
        pool = start_inference(trainer, cluster) if inference is not None else None
        executor = None
        if cluster.auto_scheduler:
            slots = tuple(
                EngineSlot(engine_id, device, 1, borrowed)
                for engine_id, (device, borrowed) in zip(sorted(launch.engines), devices, strict=True)
            )
            layout = LiveLayout(
                num_devices=cluster.total_devices,
                actor_devices=ranges["actor"].count,
                actor_model_parallel=1,
                engines=slots,
                inference_range=None if inference is None else (inference.start, inference.count),
            )
            executor = DynamicExecutor(
                cluster.scheduler(),
                launch.manager,
                layout,
                RankedActor(actor),
                inference_done=None if pool is None else lambda: pool.step_done,
                # the pool releases its devices itself once every sample is processed; the move is its time
                release_inference=None if pool is None else lambda: pool.releases[-1],
            )
            trainer.follow(executor)
        trainer.run(steps.append)
        counters = trainer.step_counters
    summary = summarize(config, steps, counters, executor, actor)
    (output_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    if executor is not None:
        title = (
            f"{len(steps)} GRPO steps on {cluster.total_devices} device slots, auto scheduler: "
            f"{sum(len(s['moves']) for s in summary['steps'])} moves, "
            f"{summary['tokens_regenerated']} tokens regenerated"
        )
        plot_live_gantt(
            output_dir / "gantt.png",
            cluster.total_devices,
            executor.ledger,
            executor.steps,
            trainer.timer.spans,
            executor.clock0,
            title,
        )
    print(
        f"wrote {output_dir / 'summary.json'}" + (f" and {output_dir / 'gantt.png'}" if executor else ""),
        file=sys.stderr,
    )
    return summary


class RankedActor:
    """The elastic actor as the executor drives it: devices are ranks; a failed join raises."""

    def __init__(self, actor) -> None:
        self._actor = actor

    @property
    def num_devices(self) -> int:
        return self._actor.active_ranks

    def resize(self, num_devices: int) -> None:
        self._actor.resize(num_devices)
        move = self._actor.moves[-1]
        if not move.ok:
            raise RuntimeError(f"a rank was lost while joining: {move.reason}")


def summarize(config: DemoFile, steps: list[StepMetrics], counters: list[dict], executor, actor) -> dict:
    records = executor.steps if executor is not None else []
    per_step = []
    previous = dict.fromkeys(COUNTERS, 0.0)
    for index, metrics in enumerate(steps):
        now = {key: counters[index].get(name, 0.0) for key, name in COUNTERS.items()}
        record = (
            records[index].to_json() if records else {"actor_sizes": [], "engines_released": [], "moves": []}
        )
        per_step.append(
            {
                "step": metrics.step,
                "actor_sizes": actor.sizes_by_step[index]
                if index < len(actor.sizes_by_step)
                else record["actor_sizes"],
                "engines_released": record["engines_released"],
                "moves": [
                    {k: m[k] for k in ("kind", "seconds", "ok", "trigger", "devices", "detail")}
                    for m in record["moves"]
                ],
                "tokens_generated": int(now["tokens_generated"] - previous["tokens_generated"]),
                "tokens_regenerated": int(now["tokens_regenerated"] - previous["tokens_regenerated"]),
                "tokens_trained": metrics.tokens,
                "samples": metrics.samples,
                "reward_mean": metrics.reward_mean,
                "step_time_s": round(metrics.step_time_s, 3),
                "rollout_wait_s": round(metrics.rollout_wait_s, 3),
                "train_s": round(metrics.train_s, 3),
                "update_weights_s": round(metrics.update_weights_s, 3),
            }
        )
        previous = now
    cluster = config.cluster
    return {
        "cluster": cluster.model_dump(),
        "scheduler": cluster.scheduler().name,
        "steps": per_step,
        "tokens_generated": sum(s["tokens_generated"] for s in per_step),
        "tokens_regenerated": sum(s["tokens_regenerated"] for s in per_step),
        "tokens_trained": sum(s["tokens_trained"] for s in per_step),
        "step_time_s": [s["step_time_s"] for s in per_step],
    }


def check_dynamic(config: DemoFile) -> None:
    """One-line errors for a dynamic demo config the run could not follow."""
    if config.train.cluster is not None:
        raise UserError(
            "config error: train.cluster: give the cluster section once, at the top level (cluster:)"
        )
    if len(config.launch.engines) != 1:
        raise UserError(
            "config error: launch.engines: a dynamic demo takes exactly one engine pool as the template of "
            f"every rollout engine (got {len(config.launch.engines)})"
        )
    train = config.train
    groups = train.micro_batch_groups * train.mini_batch_micro_batches
    if train.prompts_per_step % groups:
        raise UserError(
            f"config error: train.prompts_per_step: {train.prompts_per_step} is not a whole number of "
            f"mini-batches of {groups} groups"
        )
    config.cluster.check_actor_size(groups * train.n_samples, key="cluster")


def print_dynamic(summary: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"rollflow demo: {summary['scheduler']} scheduling on device slots")
    for column in (
        "step",
        "time",
        "actor sizes",
        "released",
        "moves (count x mean s)",
        "tokens gen/train/regen",
    ):
        table.add_column(column, no_wrap=True)
    for step in summary["steps"]:
        by_kind: dict[str, list[float]] = {}
        for move in step["moves"]:
            by_kind.setdefault(move["kind"] + ("" if move["ok"] else " (failed)"), []).append(move["seconds"])
        moves = "\n".join(f"{kind} {len(s)} x {sum(s) / len(s):.2f}" for kind, s in by_kind.items())
        table.add_row(
            str(step["step"]),
            f"{step['step_time_s']:.1f} s",
            " ".join(map(str, step["actor_sizes"])),
            " ".join(map(str, step["engines_released"])) or "-",
            moves or "-",
            f"{step['tokens_generated']} / {step['tokens_trained']} / {step['tokens_regenerated']}",
        )
    Console(width=max(Console().width, 110)).print(table)
