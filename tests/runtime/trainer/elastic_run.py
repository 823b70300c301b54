"""The leader of the elastic-actor tests, run as `python -m tests.runtime.trainer.elastic_run MODEL OUT`.

It builds the real Trainer, starts an elastic actor of three CPU device slots (base size 1) and trains
two steps over fixed rollouts as they arrive, asking the actor to grow 1 -> 2 -> 3 ranks across each
step's mini-batches (a `minibatch_end_hooks` hook, as the live executor does). In the second step rank 2
is killed as it rejoins: after rank 0 decided to send it the weights, before it holds them. Writes
parameters.pt and moves.json.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import torch

from rollflow.runtime.logs import setup_logging
from rollflow.runtime.trainer.elastic import ElasticSpec, start_elastic
from rollflow.runtime.trainer.loop import Trainer
from tests.runtime.trainer.parallel_ranks import FixedBatch, make_groups, parameters, trainer_config

# each step: micro-batches of 3, 3 and 2 groups, one optimizer step each (so three mini-batches)
STEP_GROUPS = [make_groups([2, 3, 2, 4, 3, 2, 2, 3], seed=10 + step) for step in range(2)]
MICRO_BATCH_GROUPS = 3
LR = 3e-5  # see parallel_ranks.STEP_LR: small enough that float noise on near-zero gradients stays in tolerance
GROWTH = {1: 2, 2: 3}  # mini-batches done -> actor size for the next one


def config(model: str, out: Path, algorithm: str):
    base = trainer_config(model, out, algorithm, lr=LR)
    return base.model_copy(update={"micro_batch_groups": MICRO_BATCH_GROUPS, "mini_batch_micro_batches": 1})


def train(trainer: Trainer) -> None:
    """Every step's rollouts, as they arrive."""
    for groups in STEP_GROUPS:
        trainer.train_on(FixedBatch(groups, all_ready=False))
        trainer.step += 1


def main() -> None:
    model, out = sys.argv[1], Path(sys.argv[2])
    setup_logging("text")
    torch.manual_seed(0)
    trainer = Trainer(config(model, out, "grpo"), resume=False)
    actor = start_elastic(
        trainer, ElasticSpec(("cpu",) * 3, base_ranks=1, threads_per_rank=1, join_timeout_s=30)
    )
    trainer.minibatch_end_hooks.append(lambda step, done: actor.resize(GROWTH.get(done, actor.active_ranks)))
    send_state = actor._send_state

    def die_while_rejoining(rank, state):
        if rank == 2 and trainer.step == 1:
            actor.ranks[rank].process.kill()
            actor.ranks[rank].process.wait()
        send_state(rank, state)

    actor._send_state = die_while_rejoining
    try:
        train(trainer)
    finally:
        actor.close()
    torch.save(parameters(trainer), out / "parameters.pt")
    moves = [dataclasses.asdict(move) for move in actor.moves]
    (out / "moves.json").write_text(json.dumps({"sizes": actor.sizes_by_step, "moves": moves}))


if __name__ == "__main__":
    main()
