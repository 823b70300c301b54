"""`rollflow train`: GRPO or PPO against a running rollout manager."""

from __future__ import annotations

import argparse

from rollflow.cli_util import add_config_arguments, add_resume_argument, set_command

EXAMPLES = """examples:
  rollflow train --config examples/train/grpo_tiny.yaml
  rollflow train --config examples/train/grpo_tiny.yaml algorithm=ppo steps=20 output_dir=outputs/ppo
  rollflow train --config examples/train/grpo_tiny.yaml --resume never off_policy=true max_staleness=1
  torchrun --nproc-per-node 2 --no-python rollflow train --config examples/train/grpo_tiny.yaml device=cuda
  torchrun --nproc-per-node 2 --no-python rollflow train --config examples/train/grpo_tiny.yaml parallelism=fsdp
  rollflow train --config examples/train/grpo_tiny.yaml cluster.component_placement.actor=0-1 cluster.component_placement.rollout=2

the manager and its engines must be running first (README, section Trainer).
"""


def register(train: argparse.ArgumentParser) -> None:
    """`rollflow train` is one command, not a group of them."""
    set_command(train, _train)
    add_config_arguments(train, "YAML config (see examples/train/)", "algorithm=ppo steps=20")
    add_resume_argument(
        train,
        "continue from the latest checkpoint in output_dir if there is one",
        "start from `model`, deleting output_dir's earlier checkpoints, weights, metrics.csv and "
        "tensorboard/ (default auto)",
    )


def _train(args: argparse.Namespace, started_at: float) -> None:
    """Train with GRPO or PPO on micro-batches streamed from a rollout manager; after each step the
    new weights go to every engine through the manager. Writes metrics.csv, TensorBoard logs,
    weights/v{N}/ and checkpoints/step_{N}/ under output_dir.
    """
    import sys
    from pathlib import Path

    from rollflow.config import load_config
    from rollflow.runtime.logs import setup_logging
    from rollflow.runtime.trainer.config import TrainConfig

    config = load_config(TrainConfig, args.config, args.overrides)
    if not Path(config.model).is_dir():
        from rollflow.errors import UserError

        raise UserError(f"config error: model: no checkpoint folder at {config.model}")
    setup_logging("text")
    from rollflow.runtime.trainer.distributed import init_from_env

    # None outside torchrun
    parallel = init_from_env(config.device, config.distributed_timeout_s, config.parallelism)
    if parallel is not None and config.cluster is not None:
        from rollflow.errors import UserError

        raise UserError("config error: cluster: starts its own actor processes; run without torchrun")
    leader = parallel is None or parallel.is_leader
    if args.resume == "never" and leader:
        from rollflow.runtime.trainer.checkpoints import clear_outputs

        clear_outputs(Path(config.output_dir))
    from rollflow.runtime.trainer.loop import Trainer
    from rollflow.runtime.trainer.progress import show_progress

    finished = False
    try:
        trainer = Trainer(config, resume=args.resume == "auto", parallel=parallel)
        if config.cluster is not None:
            _start_actor(trainer)
            if "inference" in config.cluster.component_placement:
                from rollflow.runtime.inference.workers import start_inference

                start_inference(trainer, config.cluster)
        if leader:  # rank 0 shows progress and writes the metrics
            with show_progress(config.steps, trainer.step, sys.stderr.isatty()) as on_step:
                trainer.run(on_step)
        else:
            trainer.run()
        step = trainer.step
        del trainer  # its DDP/FSDP modules hold the process group, which close() frees
        finished = True
    finally:
        if parallel is not None:
            parallel.close(wait_for_peers=finished)
    if leader:
        print(f"trained to step {step}; metrics in {Path(config.output_dir) / 'metrics.csv'}")


def _start_actor(trainer) -> None:
    """The placement's actor, at its placed size: only a live executor (`rollflow demo run`) moves devices."""
    import logging

    from rollflow.runtime.trainer.elastic import spec_from_cluster, start_elastic

    cluster = trainer.config.cluster
    if cluster.auto_scheduler:
        logging.getLogger(__name__).info(
            "cluster.auto_scheduler: rollflow train keeps the actor on its %d device(s); "
            "`rollflow demo run` moves devices between components",
            cluster.ranges()["actor"].count,
        )
    start_elastic(trainer, spec_from_cluster(cluster, may_grow=False))
