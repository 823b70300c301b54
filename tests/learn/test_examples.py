"""The shipped router examples load, and their policy files route their clusters."""

from pathlib import Path

import pytest

from rollflow.config import load_config
from rollflow.learn.compare import policy_path
from rollflow.learn.config import LearnConfig
from rollflow.learn.evaluate import run_router
from rollflow.policy.learned import load_learned_router
from tests.factories import REPO

EXAMPLES = sorted((REPO / "examples" / "router").glob("*.yaml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_policy_routes_its_cluster(path, monkeypatch):
    monkeypatch.chdir(REPO)
    config = load_config(LearnConfig, path)
    router = load_learned_router(path.with_suffix(".policy.npz"))  # the shipped policy beside the config
    assert router.spec.num_instances == config.cluster.num_replicas
    latencies = run_router(config, router, [1], 200)
    assert len(latencies["e2e"]) == 200 and latencies["e2e"].min() > 0


def test_both_examples_ship():
    assert {p.stem for p in EXAMPLES} == {"heterogeneous", "homogeneous"}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_training_an_example_writes_under_outputs_not_over_the_shipped_policy(path, monkeypatch):
    monkeypatch.chdir(REPO)
    config = load_config(LearnConfig, path)
    assert policy_path(config) == Path(config.output_dir) / "policy.npz"
    assert policy_path(config).parts[0] == "outputs"
