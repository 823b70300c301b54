"""`parallelism: fsdp` with `weights_transport: mooncake` as a user runs it: torchrun with 2 CPU
ranks trains against a manager with built-in engines; every version is read by the engines straight
from the two ranks' Mooncake memory, with no rank gathering the model and no weight bytes on the
weight server, and the engines end generating what a single process loaded with the trained weights
generates."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path

import safetensors.torch
import torch

from rollflow.runtime.weights.shards import ShardedManifest
from rollflow.runtime.weights.slices import split_dim
from tests.runtime.engines.helpers import PROMPT, reference_greedy
from tests.runtime.manager.helpers import greedy_reference, wait_until, workers
from tests.runtime.processes import ENV, REPO, descendants, http
from tests.runtime.trainer.test_distributed import torchrun_argv, torchrun_train
from tests.runtime.trainer.test_train_e2e import base_config, engine_versions, rows
from tests.runtime.weights.factories import start_server_process
from tests.runtime.weights.proxy import ChunkProxy

TOKEN = {"ROLLFLOW_WEIGHTS_TOKEN": "publish-secret"}


def trained_checkpoint(output, tiny_model, out_dir):
    """The policy of the run's last checkpoint (its FSDP shards, read offline by DCP) as a model folder."""
    import shutil

    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    whole = out_dir / "whole.pt"
    dcp_to_torch_save(output / "checkpoints" / "step_2" / "shards", whole)
    state = torch.load(whole, weights_only=False)["model"]
    policy = {k.removeprefix("policy."): v.contiguous() for k, v in state.items() if k.startswith("policy.")}
    folder = out_dir / "reference"
    shutil.copytree(tiny_model, folder)
    safetensors.torch.save_file({k: v.clone() for k, v in policy.items()}, str(folder / "model.safetensors"))
    return folder, policy


def test_fsdp_ranks_lend_their_shards_and_engines_end_on_version_2_generating_as_one_process(
    processes, tiny_model, tmp_path
):
    engines = [processes.engine(), processes.engine()]
    manager = processes.manager(engines=[{"url": e.url, "engine_type": "builtin"} for e in engines])
    store = tmp_path / "store"
    server, url = start_server_process(store, env=ENV | TOKEN)  # no --mooncake: it serves no bytes
    output = tmp_path / "run"
    config = base_config(
        manager, tiny_model, output, parallelism="fsdp", weights_url=url, weights_transport="mooncake"
    )
    try:
        run = torchrun_train(config, tmp_path, "--resume", "never", env=TOKEN)
        _, body = http("GET", url + "/v1/sharded/2")
        manifest = ShardedManifest.from_json(json.dumps(body))
        _, versions = http("GET", url + "/v1/versions")
    finally:
        server.kill()
        server.wait()
    assert [int(r["step"]) for r in rows(output)] == [1, 2]
    assert engine_versions(manager) == [2, 2]
    assert versions["latest"] == 2
    assert "each rank exports its own shard of every version" in run.stderr
    # each rank exported its own rows, which add up to the model once: none held the whole model
    for version in (1, 2):
        exported = {
            int(rank): int(nbytes)
            for rank, nbytes in re.findall(rf"rank (\d) exported version {version}: (\d+) bytes", run.stderr)
        }
        assert exported.keys() == {0, 1}, run.stderr[-3000:]
        assert sum(exported.values()) == manifest.model_nbytes
        assert max(exported.values()) < 0.75 * manifest.model_nbytes
    assert set(manifest.sessions) == {0, 1} and manifest.delta_base == 1
    assert {piece.rank for plan in manifest.tensors for piece in plan.pieces} == {0, 1}
    # nothing gathered (the gathered path writes weights/vN), no weight bytes on the weight server: the
    # engines' versions came from the ranks
    assert not (output / "weights" / "v2").exists() and not (output / "weights" / "v1").exists()
    assert not list((store / "versions").iterdir()) and not list((store / "payloads").iterdir())
    reference, policy = trained_checkpoint(output, tiny_model, tmp_path)
    initial = safetensors.torch.load_file(str(tiny_model / "model.safetensors"))
    assert any(not torch.equal(policy[k], initial[k]) for k in initial)  # the run trained
    expected = reference_greedy(reference, PROMPT, 12)[0]
    for engine in engines:
        assert "pulling over http" not in engine.log_path.read_text()
        assert greedy_reference(engine, PROMPT, 12) == expected


def test_fsdp_ranks_reshard_for_a_tensor_parallel_engine_which_ends_on_version_2_generating_as_one_process(
    processes, tiny_model, tmp_path
):
    """A TP-2 engine and a TP-1 one beside it: each TP rank reads its own rows of the dim-0 splits
    straight from the trainer ranks (about half of those bytes each) and both end as one process."""
    tp2 = processes.engine(extra_args=("--tensor-parallel", "2", "--log-level", "info"))
    tp1 = processes.engine(extra_args=("--log-level", "info"))
    manager = processes.manager(engines=[{"url": e.url, "engine_type": "builtin"} for e in (tp2, tp1)])
    server, url = start_server_process(tmp_path / "store", env=ENV | TOKEN)
    output = tmp_path / "run"
    config = base_config(
        manager, tiny_model, output, parallelism="fsdp", weights_url=url, weights_transport="mooncake"
    )
    try:
        torchrun_train(config, tmp_path, "--resume", "never", env=TOKEN)
        _, body = http("GET", url + "/v1/sharded/1")
        first = ShardedManifest.from_json(json.dumps(body))
    finally:
        server.kill()
        server.wait()
    assert [int(r["step"]) for r in rows(output)] == [1, 2]
    assert engine_versions(manager) == [2, 2]
    reference, _ = trained_checkpoint(output, tiny_model, tmp_path)
    expected = reference_greedy(reference, PROMPT, 12)[0]
    for engine in (tp2, tp1):
        assert "pulling over http" not in engine.log_path.read_text()
        assert greedy_reference(engine, PROMPT, 12) == expected
    # version 1 is read in full (the engines' model folder is no published version: no delta base):
    # the TP-1 engine reads every block once; each TP-2 rank reads the tensors split on dim 1 and
    # the replicated ones whole, and only its half of the rows of those split on dim 0
    tp2_ranks, tp2_weights = pulled_nbytes(tp2, 1)
    tp1_ranks, tp1_weights = pulled_nbytes(tp1, 1)
    assert tp2_weights < 0.55 * tp1_weights  # rank 0's weights are its slices: half of all but the norms
    split_rows = sum(_full_nbytes(plan) for plan in first.tensors if split_dim(plan.name) == 0)
    read_whole = sum(_full_nbytes(plan) for plan in first.tensors if split_dim(plan.name) != 0)
    assert tp1_ranks == [split_rows + read_whole]
    assert len(tp2_ranks) == 2, tp2_ranks
    for nbytes in tp2_ranks:
        assert 0.4 * split_rows < nbytes - read_whole < 0.6 * split_rows, (tp2_ranks, split_rows, read_whole)
    assert sum(tp2_ranks) - 2 * read_whole == split_rows


def pulled_nbytes(engine, version: int) -> tuple[list[int], int]:
    """The bytes each tensor-parallel rank of `engine` read for `version`, and the bytes of rank 0's
    weights, from its log (--log-level info)."""
    found = re.findall(
        rf"pulled version {version} \(.*? over mooncake, .*? (\d+) bytes of weights, "
        r".*bytes by tensor-parallel rank \[([\d, ]+)\]",
        engine.log_path.read_text(),
    )
    assert len(found) == 1, engine.log_path.read_text()[-3000:]
    weights, by_rank = found[0]
    return [int(n) for n in by_rank.split(",")], int(weights)


def _full_nbytes(plan) -> int:
    """Wire bytes of every full record of a tensor: what reading all of it takes."""
    return sum(block.full.wire_nbytes for piece in plan.pieces for block in piece.blocks)


def torchrun_process(config: dict, tmp_path, *args: str, env: dict) -> subprocess.Popen:
    """The torchrun job of `torchrun_train`, started in the background."""
    argv, full_env = torchrun_argv(config, tmp_path, *args, env=env)
    return subprocess.Popen(argv, cwd=REPO, env=full_env, stderr=subprocess.PIPE, text=True)


def rank_pid(torchrun_pid: int, rank: int) -> int:
    """The pid of torchrun's worker with RANK=`rank`."""
    for pid in descendants(torchrun_pid) - {torchrun_pid}:
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in environ:
            return pid
    raise AssertionError(f"torchrun {torchrun_pid} has no rank {rank}")


def test_a_rank_killed_mid_transfer_leaves_the_engine_on_its_old_version_out_of_the_pool_and_resume_recovers(
    processes, tiny_model, tmp_path
):
    target, other = processes.engine(), processes.engine()
    manager = processes.manager(engines=[{"url": e.url, "engine_type": "builtin"} for e in (target, other)])
    server, server_url = start_server_process(tmp_path / "store", env=ENV | TOKEN)
    proxy = ChunkProxy(server_url, mode="hold_sharded")
    output = tmp_path / "run"
    config = base_config(
        manager, tiny_model, output, parallelism="fsdp", weights_url=proxy.url, weights_transport="mooncake"
    )
    try:
        job = torchrun_process(config, tmp_path, "--resume", "never", env=TOKEN)
        # an engine holds version 1's manifest and is about to read the ranks' memory: kill rank 1
        assert proxy.chunk_requested.wait(300), "no engine asked for version 1's manifest"
        held = wait_until(
            lambda: [url for url, w in workers(manager).items() if w["state"] == "updating"], what="an update"
        )
        os.kill(rank_pid(job.pid, 1), signal.SIGKILL)
        proxy.release()
        job.communicate(timeout=300)
        assert job.returncode != 0  # torchrun stops the job: FSDP cannot step without rank 1's shard
        [reader] = held
        stayed = other if reader == target.url else target
        # the reader stays on version 0 (its reads failed, and the trainer that asked is gone), and
        # the manager routes to the other engine, on version 0
        assert http("GET", reader + "/get_weight_version")[1]["weight_version"] == 0
        assert workers(manager)[stayed.url]["state"] == "healthy"
        request = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 4}}
        status, body = http("POST", manager.url + "/generate", request)
        assert status == 200, body
        assert {(s["engine_url"], s["weight_version"]) for s in body["meta_info"]["spans"]} == {
            (stayed.url, 0)
        }
        # recovery as documented: the same job again with --resume auto (no checkpoint was written: it
        # starts over) trains to version 2
        torchrun_train(config, tmp_path, "--resume", "auto", env=TOKEN)
    finally:
        proxy.close()
        server.kill()
        server.wait()
    reference, _ = trained_checkpoint(output, tiny_model, tmp_path)
    expected = reference_greedy(reference, PROMPT, 12)[0]
    assert http("GET", stayed.url + "/get_weight_version")[1]["weight_version"] == 2
    assert greedy_reference(stayed, PROMPT, 12) == expected
