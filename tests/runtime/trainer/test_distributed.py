"""`rollflow train` under torchrun: real gloo ranks on 127.0.0.1, under DDP or FSDP2, give the
single-process gradients, metrics and weights, and a whole run trains, pushes and resumes as without
torchrun."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from tests.runtime.processes import ENV, REPO, free_port, http
from tests.runtime.trainer import parallel_ranks
from tests.runtime.trainer.test_train_e2e import base_config, engine_versions, rows

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


@pytest.fixture(scope="module", params=["ddp", "fsdp"])
def ranks_output(request, tiny_model, tmp_path_factory):
    """The files the two ranks of parallel_ranks wrote, with `parallelism` ddp or fsdp."""
    out = tmp_path_factory.mktemp(f"{request.param}-ranks")
    port = free_port()
    module = "tests.runtime.trainer.parallel_ranks"
    argv = [sys.executable, "-m", module, str(tiny_model), str(out), request.param]
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
    trainer = Trainer(parallel_ranks.trainer_config(str(tiny_model), out, algorithm), resume=False)
    parallel_ranks.run(trainer, out, rank=0)
    for all_ready in (True, False):  # the rollouts all finished before the trainer asked, or just in time
        torch.manual_seed(0)
        folder = out / ("all_ready" if all_ready else "just_in_time")
        folder.mkdir()
        config = parallel_ranks.trainer_config(str(tiny_model), folder, algorithm, lr=parallel_ranks.STEP_LR)
        stepper = Trainer(config, resume=False)
        parallel_ranks.run_step(stepper, folder, rank=0, all_ready=all_ready)
    return algorithm, out


def assert_close(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert actual.keys() == expected.keys()
    for key in expected:
        torch.testing.assert_close(actual[key], expected[key], atol=1e-5, rtol=1e-5, msg=key)


@pytest.mark.parametrize("case", list(parallel_ranks.CASES))
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
    before = parallel_ranks.initial_parameters(str(tiny_model), algorithm)
    moved = max((expected[k] - before[k]).abs().max().item() for k in expected)
    assert moved > 5e-5  # a rank that skipped the step would be this far off
    for rank in range(WORLD_SIZE):
        assert_close(torch.load(ranks_output / algorithm / f"stepped.rank{rank}.pt"), expected)


@pytest.mark.parametrize("arrival", ["all_ready", "just_in_time"])
def test_a_training_step_learns_the_same_on_two_ranks_as_in_one_process(
    ranks_output, single, tiny_model, arrival
):
    # one process finds every group finished (or each micro-batch's just finished) when it asks;
    # rank 0 asks as each micro-batch's groups finish: the same micro-batches and optimizer steps either way
    algorithm, single_out = single
    expected = torch.load(single_out / arrival / "step_totals.rank0.pt")["totals"]
    actual = torch.load(ranks_output / algorithm / "step_totals.rank0.pt")["totals"]
    assert expected["tokens"] == sum(len(s["output_ids"]) for g in parallel_ranks.STEP_GROUPS for s in g)
    assert expected["kl"] > 0  # the last micro-batch ran after the step's first optimizer step
    assert actual["tokens"] == expected["tokens"] and actual["rewards"] == pytest.approx(expected["rewards"])
    assert (actual["rejected"], actual["resumed"]) == (expected["rejected"], expected["resumed"])
    for name in ("kl", "entropy", "policy_loss", "value_loss", "clip_fraction"):
        assert actual[name] == pytest.approx(expected[name], abs=1e-5, rel=1e-4), name
    weights = torch.load(single_out / arrival / "step_weights.rank0.pt")
    before = parallel_ranks.initial_parameters(str(tiny_model), algorithm)
    assert max((weights[k] - before[k]).abs().max().item() for k in weights) > 3e-5  # both steps moved them
    for rank in range(WORLD_SIZE):
        assert_close(torch.load(ranks_output / algorithm / f"step_weights.rank{rank}.pt"), weights)


@pytest.mark.parametrize("ranks_output", ["fsdp"], indirect=True)  # ddp's whole ones: test_train_e2e
def test_fsdp_ranks_resume_the_weights_and_optimizer_state_their_sharded_checkpoint_holds(ranks_output):
    for algorithm in ("grpo", "ppo"):
        checkpoint = ranks_output / algorithm / "checkpoints" / "step_1"
        assert (checkpoint / "shards" / ".metadata").is_file() and not (checkpoint / "optimizer.pt").exists()
        for rank in range(WORLD_SIZE):
            saved = torch.load(ranks_output / algorithm / f"resumed.rank{rank}.pt")
            assert saved["written"]["optimizer"]  # Adam's moments exist after the step
            for part in ("parameters", "optimizer"):
                assert saved["resumed"][part].keys() == saved["written"][part].keys()
                for key, value in saved["written"][part].items():
                    torch.testing.assert_close(saved["resumed"][part][key], value, atol=0, rtol=0, msg=key)


def torchrun_argv(config: dict, tmp_path, *args: str, env: dict | None = None) -> tuple[list[str], dict]:
    """`.venv/bin/torchrun --nproc-per-node 2 --no-python .venv/bin/rollflow train ...` as the README
    gives it, on loopback: its command line and environment."""
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(config))
    bin_dir = Path(sys.executable).parent
    argv = [
        str(bin_dir / "torchrun"),
        f"--nproc-per-node={WORLD_SIZE}",
        "--master-addr=127.0.0.1",
        f"--master-port={free_port()}",
        "--no-python",
        str(bin_dir / "rollflow"),
        "train",
        "--config",
        str(path),
        *args,
    ]
    return argv, {**ENV, "GLOO_SOCKET_IFNAME": "lo", **(env or {})}


def torchrun(config: dict, tmp_path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """The torchrun job of `torchrun_argv`, run to its end."""
    argv, full_env = torchrun_argv(config, tmp_path, *args, env=env)
    return subprocess.run(argv, cwd=REPO, env=full_env, capture_output=True, text=True, timeout=300)


def torchrun_train(
    config: dict, tmp_path, *args: str, env: dict | None = None
) -> subprocess.CompletedProcess:
    result = torchrun(config, tmp_path, *args, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def test_torchrun_two_ranks_train_push_weights_and_resume_auto(processes, tiny_model, tmp_path):
    manager = processes.manager(engines=[{"url": processes.engine().url}])
    output = tmp_path / "run"
    # 3 groups per micro-batch do not divide over 2 ranks; the last micro-batch of a step has 1 group
    # (rank 1 joins with nothing), and 2 micro-batches per mini-batch leave the step's last one partial
    config = base_config(
        manager, tiny_model, output, prompts_per_step=4, micro_batch_groups=3, mini_batch_micro_batches=2
    )

    first = torchrun_train(config, tmp_path, "--resume", "never")
    assert "data parallel over 2 ranks (gloo, cpu)" in first.stderr
    assert [int(r["step"]) for r in rows(output)] == [1, 2]
    assert all(int(r["samples"]) == 16 and int(r["tokens"]) > 0 for r in rows(output))
    assert all(float(r["kl"]) >= 0 and float(r["entropy"]) > 0 for r in rows(output))
    assert engine_versions(manager) == [2]
    assert (output / "weights" / "v2" / "config.json").is_file()

    resumed = torchrun_train({**config, "steps": 3}, tmp_path, "--resume", "auto")
    assert "resumed from" in resumed.stderr and "step 2" in resumed.stderr
    assert [int(r["step"]) for r in rows(output)] == [1, 2, 3]
    assert int(rows(output)[-1]["samples_rejected_stale"]) == 0
    assert engine_versions(manager) == [3]


def test_torchrun_fsdp_ranks_publish_whole_versions_checkpoint_shards_and_resume_auto(
    processes, tiny_model, tmp_path
):
    from safetensors import safe_open

    from rollflow.runtime.weights import WeightStore
    from rollflow.runtime.weights.checkpoint import published_versions
    from tests.runtime.launch.helpers import BackgroundWeightServer

    engine = processes.engine()
    manager = processes.manager(engines=[{"url": engine.url, "engine_type": "builtin"}])
    server = BackgroundWeightServer(WeightStore(tmp_path / "store"), token="publish-secret")
    token = {"ROLLFLOW_WEIGHTS_TOKEN": "publish-secret"}
    output = tmp_path / "run"
    config = base_config(
        manager, tiny_model, output, micro_batch_groups=3, parallelism="fsdp", weights_url=server.url
    )
    try:
        first = torchrun_train(config, tmp_path, "--resume", "never", env=token)
        assert (
            "data parallel over 2 ranks (gloo, cpu), fsdp: each rank holds 1/2 of the parameters"
            in first.stderr
        )
        assert [int(r["step"]) for r in rows(output)] == [1, 2]
        assert all(int(r["samples"]) == 16 and int(r["tokens"]) > 0 for r in rows(output))
        shards = output / "checkpoints" / "step_2" / "shards"
        assert (shards / ".metadata").is_file() and len(list(shards.glob("*.distcp"))) == WORLD_SIZE
        resumed = torchrun_train({**config, "steps": 3}, tmp_path, "--resume", "auto", env=token)
        versions = published_versions(server.url)
    finally:
        server.close()
    assert "resumed from" in resumed.stderr and "step 2" in resumed.stderr
    assert [int(r["step"]) for r in rows(output)] == [1, 2, 3]
    assert int(rows(output)[-1]["samples_rejected_stale"]) == 0
    # each version gathered whole on rank 0, published, and pulled by the engine
    assert versions == (0, 1, 2, 3) and engine_versions(manager) == [3]
    assert http("GET", engine.url + "/get_weight_version")[1]["weight_version"] == 3
    with (
        safe_open(tiny_model / "model.safetensors", "pt") as initial,
        safe_open(output / "weights" / "v3" / "model.safetensors", "pt") as trained,
    ):
        names = list(initial.keys())
        assert sorted(trained.keys()) == sorted(names)
        assert all(trained.get_tensor(k).shape == initial.get_tensor(k).shape for k in names)
        assert any(not torch.equal(trained.get_tensor(k), initial.get_tensor(k)) for k in names)


def test_torchrun_job_fails_with_rank_0_error_instead_of_hanging(tiny_model, tmp_path):
    # no manager listens: rank 0 fails at its first request while rank 1 waits on it in a collective;
    # torchrun then stops rank 1 (or rank 1 sees rank 0 gone first), and the job ends with rank 0's error
    url = f"http://127.0.0.1:{free_port()}"
    config = {
        "manager_url": url,
        "model": str(tiny_model),
        "n_samples": 2,
        "output_dir": str(tmp_path / "run"),
    }
    failed = torchrun(config, tmp_path)
    assert failed.returncode != 0
    assert f"cannot reach the manager at {url}" in failed.stderr, failed.stderr[-3000:]


def test_a_rank_left_waiting_fails_after_the_timeout_naming_it(tmp_path):
    # rank 0 joins the group, then sends nothing: rank 1 must give up after distributed_timeout_s
    script = (
        "import os, sys, time\n"
        "from rollflow.runtime.trainer.distributed import init_from_env\n"
        "parallel = init_from_env('cpu', timeout_s=3)\n"
        "if parallel.is_leader:\n"
        "    time.sleep(20)\n"
        "else:\n"
        "    parallel.receive()\n"
    )
    port = free_port()
    argv = [sys.executable, "-c", script]
    leader = subprocess.Popen(argv, cwd=REPO, env=rank_env(0, port), stderr=subprocess.DEVNULL)
    try:
        waiting = subprocess.run(
            argv, cwd=REPO, env=rank_env(1, port), capture_output=True, text=True, timeout=60
        )
    finally:
        leader.kill()
        leader.wait()
    assert waiting.returncode != 0
    assert "rank 1/2: a collective failed" in waiting.stderr and "distributed_timeout_s=3" in waiting.stderr
