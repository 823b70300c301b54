"""The shipped router examples load, and their policy files route their clusters."""

import pytest

from rollflow.config import load_config
from rollflow.learn.config import LearnConfig
from rollflow.learn.evaluate import run_router
from rollflow.policy.learned import load_learned_router
from tests.factories import REPO

EXAMPLES = sorted((REPO / "examples" / "router").glob("*.yaml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_policy_routes_its_cluster(path, monkeypatch):
    monkeypatch.chdir(REPO)
    config = load_config(LearnConfig, path)
    router = load_learned_router(config.policy_file)
    assert router.spec.num_instances == config.cluster.num_replicas
    latencies = run_router(config, router, [1], 200)
    assert len(latencies["e2e"]) == 200 and latencies["e2e"].min() > 0


def test_both_examples_ship():
    assert {p.stem for p in EXAMPLES} == {"heterogeneous", "homogeneous"}
