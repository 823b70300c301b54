"""One rank of the gradient-equality test, run as
`python -m tests.runtime.trainer.parallel_ranks MODEL OUT ddp|fsdp` with torchrun's environment
(RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) set by the test.

Each rank builds the real Trainer on the real process group; rank 0 drives it as in a training step
(its learner's `train_micro_batch`, `optimizer_step`) and the others `obey` as under `rollflow train`. Every rank
saves its gradients after each micro-batch and its parameters after the optimizer step; rank 0 also
saves the step totals its metrics would be computed from. Then a fresh Trainer trains one whole
step's rollouts (`train_on`, several micro-batches and optimizer steps) as they arrive from a
`FixedBatch`, and every rank saves the step's totals and its parameters. Under fsdp, rank 0 then
writes that Trainer's (sharded) checkpoint and a third Trainer resumes from it: every rank saves the
resumed parameters and optimizer state beside the ones that were written. Sharded parameters,
gradients and optimizer state are saved whole (gathered from every rank).
"""

from __future__ import annotations

import random
import sys
from collections.abc import Iterator
from pathlib import Path

import torch

from rollflow.runtime.trainer.config import TrainConfig
from rollflow.runtime.trainer.distributed import Command, init_from_env
from rollflow.runtime.trainer.learner import StepTotals
from rollflow.runtime.trainer.loop import Trainer

SCALE = 0.5  # as with two micro-batches per mini-batch


def make_groups(sizes: list[int], seed: int) -> list[list[dict]]:
    """Groups of samples with prompts and outputs of varied lengths, and recorded log-probs that make
    some importance ratios clip."""
    rng = random.Random(seed)
    groups = []
    for size in sizes:
        prompt = [rng.randrange(260, 500) for _ in range(rng.randint(2, 5))]
        group = []
        for _ in range(size):
            output = [rng.randrange(260, 500) for _ in range(rng.randint(1, 9))]
            logprobs = [rng.uniform(-7.0, -5.0) for _ in output]
            group.append(
                {"prompt_ids": prompt, "output_ids": output, "output_logprobs": logprobs, "resumes": 0}
            )
        groups.append(group)
    return groups


# name -> groups: three groups do not divide over two ranks; one group leaves rank 1 an empty share
CASES = {"three_groups": make_groups([3, 2, 4], seed=1), "one_group": make_groups([3], seed=2)}

# one training step's rollouts: with 2 groups per micro-batch and 2 micro-batches per mini-batch,
# micro-batches of 2, 2 and 1 groups and two optimizer steps (the second after a partial mini-batch)
STEP_GROUPS = make_groups([2, 3, 2, 4, 3], seed=3)
MICRO_BATCH_GROUPS = 2
# Adam's second step divides by a root mean square of two gradients: on a weight whose gradients are
# both near 0, float noise from summing shares on two ranks moves it by up to about lr; this lr keeps
# that under the tolerance while two steps move weights 3 to 6 tolerances
STEP_LR = 3e-5


class FixedBatch:
    """Finished groups handed out as the manager's `/batches/{id}/next` packs them (its GroupPacker):
    each call waits until `min_groups` groups are ready (or all that remain), then takes up to
    `max_groups` of the ready ones. `all_ready`: every group finished before the trainer first asks
    (a trainer that fell behind); otherwise groups finish `min_groups` at a time, just as it asks.
    """

    def __init__(self, groups: list[list[dict]], all_ready: bool) -> None:
        self.groups = [[{**s, "state": "finished", "spans": []} for s in group] for group in groups]
        self.all_ready = all_ready

    def micro_batches(self, min_groups: int = 1, max_groups: int | None = None) -> Iterator[list[list[dict]]]:
        remaining = list(self.groups)
        ready = len(remaining) if self.all_ready else 0
        while remaining:
            ready = max(ready, min(min_groups, len(remaining)))
            taken = min(ready, max_groups or ready)
            yield remaining[:taken]
            remaining, ready = remaining[taken:], ready - taken


def trainer_config(
    model: str, output_dir: Path, algorithm: str, lr: float = 1e-4, parallelism: str = "ddp"
) -> TrainConfig:
    # Adam's first step is about lr x sign(gradient): a small lr keeps float noise on gradients near 0
    # (where the sign is a coin toss) below the tolerance, while every weight still moves 10x past it.
    return TrainConfig(
        model=model,
        output_dir=str(output_dir),
        algorithm=algorithm,
        n_samples=2,
        lr=lr,
        kl_coef=0.1,
        micro_batch_groups=MICRO_BATCH_GROUPS,
        mini_batch_micro_batches=2,
        parallelism=parallelism,
    )


def whole(tensor: torch.Tensor) -> torch.Tensor:
    """A copy of the whole tensor (collective for an FSDP shard: every rank must call it in turn)."""
    from torch.distributed.tensor import DTensor

    if isinstance(tensor, DTensor):
        return tensor.full_tensor().detach().clone()
    return tensor.detach().clone()


def gradients(trainer: Trainer) -> dict[str, torch.Tensor]:
    modules = {"policy": trainer.learner.policy, "critic": trainer.learner.critic}
    return {
        f"{name}.{key}": whole(param.grad)
        for name, module in modules.items()
        if module is not None
        for key, param in module.named_parameters()
        if param.grad is not None
    }


def parameters(trainer: Trainer) -> dict[str, torch.Tensor]:
    modules = {"policy": trainer.learner.policy, "critic": trainer.learner.critic}
    return {
        f"{name}.{key}": whole(param)
        for name, module in modules.items()
        if module is not None
        for key, param in module.named_parameters()
    }


def optimizer_moments(trainer: Trainer) -> dict[str, torch.Tensor]:
    """Adam's moments of every parameter, in the optimizer's order."""
    return {
        f"{i}.{moment}": whole(trainer.learner.optimizer.state[param][moment])
        for i, param in enumerate(trainer.learner.parameters)
        for moment in ("exp_avg", "exp_avg_sq")
    }


def totals_summary(totals: StepTotals) -> dict:
    """What the step's metrics row is computed from (all but the timings)."""
    names = ("kl", "entropy", "policy_loss", "value_loss", "clip_fraction")
    return {
        "rewards": sorted(totals.rewards),
        "tokens": totals.tokens,
        "rejected": totals.rejected,
        "resumed": totals.resumed,
        **{name: totals.token_mean(name) for name in names},
    }


def run(trainer: Trainer, out: Path, rank: int) -> None:
    """Each case's gradient (then zeroed), then one optimizer step over both cases' gradients."""
    leader = trainer.parallel is None or trainer.parallel.is_leader
    for name, groups in CASES.items():
        totals = StepTotals()
        if leader:
            trainer.learner.train_micro_batch(groups, totals, SCALE)
        else:
            assert trainer.learner.obey()
        torch.save(
            {"grads": gradients(trainer), "totals": totals_summary(totals)}, out / f"{name}.rank{rank}.pt"
        )
        trainer.learner.optimizer.zero_grad(set_to_none=True)
    for groups in CASES.values():
        if leader:
            trainer.learner.train_micro_batch(groups, StepTotals(), SCALE)
        else:
            assert trainer.learner.obey()
    if leader:
        trainer.learner.optimizer_step()
    else:
        assert trainer.learner.obey()
    torch.save(parameters(trainer), out / f"stepped.rank{rank}.pt")


def run_step(trainer: Trainer, out: Path, rank: int, all_ready: bool) -> None:
    """One training step over STEP_GROUPS as they arrive: its totals (rank 0) and parameters (every rank)."""
    if trainer.parallel is None or trainer.parallel.is_leader:
        totals = trainer.train_on(FixedBatch(STEP_GROUPS, all_ready))
        if trainer.parallel is not None:
            trainer.parallel.tell_all(Command.STOP)
        torch.save({"totals": totals_summary(totals)}, out / f"step_totals.rank{rank}.pt")
    else:
        while trainer.learner.obey():
            pass
    torch.save(parameters(trainer), out / f"step_weights.rank{rank}.pt")


def save_and_resume(trainer: Trainer, config: TrainConfig, out: Path, rank: int) -> None:
    """fsdp: rank 0 writes `trainer`'s checkpoint (every rank its shards); a new Trainer resumes from it."""
    written = {"parameters": parameters(trainer), "optimizer": optimizer_moments(trainer)}
    if trainer.parallel.is_leader:
        trainer.step = 1
        trainer.save_checkpoint()
        trainer.parallel.tell_all(Command.STOP)
    else:
        assert trainer.learner.obey()  # its shards of the checkpoint
        assert not trainer.learner.obey()  # stop
    resumed = Trainer(config, resume=True, parallel=trainer.parallel)
    assert resumed.step == 1
    state = {"parameters": parameters(resumed), "optimizer": optimizer_moments(resumed)}
    torch.save({"written": written, "resumed": state}, out / f"resumed.rank{rank}.pt")


def initial_parameters(model: str, algorithm: str) -> dict[str, torch.Tensor]:
    """The parameters before any step, named as `parameters` names them."""
    from rollflow.runtime.trainer.models import Critic, load_policy

    torch.manual_seed(0)
    modules = {"policy": load_policy(model), "critic": Critic(model) if algorithm == "ppo" else None}
    return {
        f"{name}.{key}": param.detach().clone()
        for name, module in modules.items()
        if module is not None
        for key, param in module.named_parameters()
    }


def main() -> None:
    model, out, parallelism = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    parallel = init_from_env("cpu", timeout_s=120, parallelism=parallelism)
    assert parallel is not None
    finished = False
    try:
        for algorithm in ("grpo", "ppo"):
            torch.manual_seed(0)
            folder = out / algorithm
            folder.mkdir(parents=True, exist_ok=True)
            config = trainer_config(model, folder, algorithm, parallelism=parallelism)
            trainer = Trainer(config, resume=False, parallel=parallel)
            run(trainer, folder, parallel.rank)
            # rank 0 asks as each micro-batch's groups finish (one process, below, gets them all at once)
            torch.manual_seed(0)
            config = trainer_config(model, folder, algorithm, lr=STEP_LR, parallelism=parallelism)
            stepper = Trainer(config, resume=False, parallel=parallel)
            run_step(stepper, folder, parallel.rank, all_ready=False)
            if parallelism == "fsdp":
                save_and_resume(stepper, config, folder, parallel.rank)
            del trainer, stepper  # their DDP/FSDP modules hold the process group
        finished = True
    finally:
        parallel.close(wait_for_peers=finished)


if __name__ == "__main__":
    main()
