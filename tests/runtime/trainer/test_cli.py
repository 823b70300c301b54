"""`rollflow train` input errors: one line naming the problem, exit status 2."""

import subprocess

from rollflow.config import load_config
from rollflow.runtime.launch.servers import run_rollflow
from rollflow.runtime.trainer.config import TrainConfig
from tests.runtime.processes import REPO, free_port

EXAMPLE = REPO / "examples" / "train" / "grpo_tiny.yaml"


def run(*args: str) -> subprocess.CompletedProcess:
    return run_rollflow("train", *args)


def test_the_example_config_is_valid():
    assert load_config(TrainConfig, EXAMPLE).algorithm == "grpo"


def test_a_config_typo_is_one_line_naming_the_key():
    proc = run("--config", str(EXAMPLE), "kl_coeff=0.1")
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0
    assert "kl_coeff: unknown key; did you mean 'kl_coef'?" in proc.stderr


def test_an_unknown_weights_codec_is_one_line_naming_the_key():
    proc = run("--config", str(EXAMPLE), "weights_url=http://127.0.0.1:1", "weights_codec=delta+gzip")
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0
    assert "weights_codec: Value error, unknown codec 'delta+gzip'" in proc.stderr


def test_an_unknown_parallelism_is_one_line_naming_the_key_and_the_choices():
    proc = run("--config", str(EXAMPLE), "parallelism=zero3")
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0
    assert "parallelism: Input should be 'ddp' or 'fsdp' (got 'zero3')" in proc.stderr


def test_an_unknown_weights_transport_is_one_line_naming_the_key_and_the_choices():
    proc = run("--config", str(EXAMPLE), "weights_transport=nccl")
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0
    assert "weights_transport: Input should be 'http' or 'mooncake' (got 'nccl')" in proc.stderr


def test_fsdp_with_an_elastic_actor_is_one_line_saying_to_drop_one():
    placement = ("cluster.component_placement.actor=0-1", "cluster.component_placement.rollout=2")
    proc = run("--config", str(EXAMPLE), "parallelism=fsdp", *placement)
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0
    assert "parallelism: fsdp runs under torchrun, but `cluster:` starts an elastic actor" in proc.stderr


def test_no_manager_listening_is_one_line_naming_the_url(tiny_model, tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    proc = run(
        "--config", str(EXAMPLE), f"model={tiny_model}", f"manager_url={url}", f"output_dir={tmp_path}"
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        f"rollflow: cannot reach the manager at {url}: connection refused; start one (`rollflow manager serve`) "
        "or point manager_url ($ROLLFLOW_MANAGER_URL) at a running one"
    )
