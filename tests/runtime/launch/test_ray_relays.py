"""`backend: ray` on two Ray nodes, both on 127.0.0.1: `rollflow launch` puts one relay on each
node that runs engines, registers each engine with its own node's relay, and the engines' streams
reach the manager through them.

The two nodes are Ray's own test cluster (`ray.cluster_utils.Cluster`): `ray start` refuses a
second node while RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, and with it set to 1 it moves every address
off loopback."""

from __future__ import annotations

import os

import pytest

from rollflow.runtime.launch.launcher import Launcher
from tests.runtime.launch.helpers import launch_config
from tests.runtime.launch.ray_cluster import listening_addresses
from tests.runtime.processes import descendants

ray = pytest.importorskip("ray")

pytestmark = pytest.mark.xdist_group("ray")  # one Ray cluster on the machine at a time (tests/conftest.py)


@pytest.fixture
def two_nodes():
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 2, "resources": {"first_node": 2}, "include_dashboard": False},
    )
    try:
        cluster.add_node(num_cpus=2, resources={"second_node": 2})
        yield cluster
    finally:
        cluster.shutdown()


def test_launch_puts_one_relay_on_each_engine_node_and_streams_go_through_them(
    tmp_path, tiny_model, two_nodes
):
    # what this test process listened on before (an earlier test's Mooncake engine, which binds every
    # interface whatever it is told) is not the launch's
    listened_before = set(listening_addresses({os.getpid()}))
    pools = [
        {"count": 1, "model": str(tiny_model), "placement": {"resources": {"first_node": 1}}},
        {"count": 1, "model": str(tiny_model), "placement": {"resources": {"second_node": 1}}},
    ]
    ray_section = {
        "address": two_nodes.address,
        "node_ip_address": "127.0.0.1",
        "manager_placement": {"resources": {"first_node": 1}},
    }
    manager = {"port": 0, "token": "relay-test-token"}
    config = launch_config(
        tmp_path, pools, backend="ray", ray=ray_section, startup_timeout_s=300, manager=manager
    )
    with Launcher(config) as launch:
        engine_nodes = {engine.slot.node_id for engine in launch.engines.values()}
        assert len(engine_nodes) == 2  # an engine on each node
        assert set(launch.relays.by_node) == engine_nodes  # and a relay on each
        relay_of_node = {node: relay.address for node, relay in launch.relays.by_node.items()}
        registered = {worker["url"]: worker["relay"] for worker in launch.manager.workers()}
        for engine in launch.engines.values():
            assert registered[engine.url] == relay_of_node[engine.slot.node_id]

        batch = launch.manager.submit([[5, 6, 7], [8, 9, 10], [11, 12, 13]], n=2, max_new_tokens=24)
        samples = [s for groups in batch.micro_batches(min_groups=3) for group in groups for s in group]
        assert len(samples) == 6 and all(s["state"] == "finished" for s in samples)
        assert {span["engine_id"] for s in samples for span in s["spans"]} == set(launch.engines)
        for (
            relay
        ) in launch.relays.by_node.values():  # each served the manager, which greeted it with its token
            assert "relay: manager" in relay.slot.log_tail(), relay.slot.log_tail()

        addresses = [a for a in listening_addresses(descendants(os.getpid())) if a not in listened_before]
        assert len(addresses) >= 7  # Ray's own, the manager, two engines, two relays
        assert all(a.startswith(("127.0.0.1:", "[::ffff:127.0.0.1]:")) for a in addresses), addresses
