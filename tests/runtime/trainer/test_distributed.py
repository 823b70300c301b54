"""`rollflow train` under torchrun: real gloo ranks on 127.0.0.1 give the single-process gradients,
metrics and weights, and a whole run trains, pushes and resumes as without torchrun."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from tests.runtime.processes import ENV, REPO, free_port
from tests.runtime.trainer import ddp_ranks

WORLD_SIZE = 2


def rank_env(rank: int, port: int) -> dict[str, str]:
    """What torchrun sets for a rank, on the loopback interface."""
    return {
        **ENV,
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(WORLD_SIZE),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "GLOO_SOCKET_IFNAME": "lo",
    }


@pytest.fixture(scope="module")
def ranks_output(tiny_model, tmp_path_factory):
    """The files the two ranks of ddp_ranks wrote."""
    out = tmp_path_factory.mktemp("ddp-ranks")
    port = free_port()
    argv = [sys.executable, "-m", "tests.runtime.trainer.ddp_ranks", str(tiny_model), str(out)]
    ranks = [
        subprocess.Popen(argv, cwd=REPO, env=rank_env(r, port), stderr=subprocess.PIPE, text=True)
        for r in range(WORLD_SIZE)
    ]
    for rank, process in enumerate(ranks):
        _, stderr = process.communicate(timeout=300)
        assert process.returncode == 0, f"rank {rank}: {stderr[-3000:]}"
    return out


@pytest.fixture(scope="module", params=["grpo", "ppo"])
def single(request, tiny_model, tmp_path_factory):
    """The same calls in one process without torchrun: (algorithm, output folder)."""
    from rollflow.runtime.trainer.loop import Trainer

    algorithm = request.param
    out = tmp_path_factory.mktemp(f"single-{algorithm}")
    torch.manual_seed(0)
    trainer = Trainer(ddp_ranks.trainer_config(str(tiny_model), out, algorithm), resume=False)
    ddp_ranks.run(trainer, out, rank=0)
    return algorithm, out


def assert_close(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert actual.keys() == expected.keys()
    for key in expected:
        torch.testing.assert_close(actual[key], expected[key], atol=1e-5, rtol=1e-5, msg=key)


@pytest.mark.parametrize("case", list(ddp_ranks.CASES))
def test_two_ranks_give_the_single_process_gradients_and_metrics(ranks_output, single, case):
    algorithm, single_out = single
    expected = torch.load(single_out / f"{case}.rank0.pt")
    assert any(g.abs().max() > 1e-4 for g in expected["grads"].values())  # a gradient worth comparing
    if algorithm == "ppo":
        assert any(k.startswith("critic.") for k in expected["grads"])
    for rank in range(WORLD_SIZE):
        assert_close(
            torch.load(ranks_output / algorithm / f"{case}.rank{rank}.pt")["grads"], expected["grads"]
        )
    totals = torch.load(ranks_output / algorithm / f"{case}.rank0.pt")["totals"]
    assert totals["tokens"] == expected["totals"]["tokens"]
    assert totals["rewards"] == pytest.approx(expected["totals"]["rewards"])
    for name in ("kl", "entropy", "policy_loss", "value_loss", "clip_fraction"):
        assert totals[name] == pytest.approx(expected["totals"][name], abs=1e-5), name


def test_two_ranks_step_to_the_single_process_weights(ranks_output, single, tiny_model):
    algorithm, single_out = single
    expected = torch.load(single_out / "stepped.rank0.pt")
    before = ddp_ranks.initial_parameters(str(tiny_model), algorithm)
    moved = max((expected[k] - before[k]).abs().max().item() for k in expected)
    assert moved > 5e-5  # a rank that skipped the step would be this far off
    for rank in range(WORLD_SIZE):
        assert_close(torch.load(ranks_output / algorithm / f"stepped.rank{rank}.pt"), expected)
