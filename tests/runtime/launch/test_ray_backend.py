"""`backend: ray` on a local one-node Ray cluster bound to 127.0.0.1: the manager and engines run
in actors placed by resources and node labels, nothing listens beyond loopback, and a lost
actor is a preempted engine to the manager."""

from __future__ import annotations

import pytest

from rollflow.runtime.launch.launcher import Launcher
from tests.runtime.launch.helpers import launch_config
from tests.runtime.launch.ray_cluster import PREEMPTIBLE_LABEL, RayHead, listening_addresses
from tests.runtime.processes import http

ray = pytest.importorskip("ray")

pytestmark = pytest.mark.xdist_group("ray")  # one Ray head on the machine at a time (tests/conftest.py)


@pytest.fixture(scope="module")
def ray_head():
    head = RayHead()
    yield head
    head.stop()


def _serve_batch(launch: Launcher) -> list[dict]:
    batch = launch.manager.submit([[5, 6, 7], [8, 9, 10]], n=2, max_new_tokens=6)
    return [sample for groups in batch.micro_batches(min_groups=2) for group in groups for sample in group]


def test_ray_actors_serve_on_loopback_and_a_lost_spot_actor_is_deregistered(tmp_path, tiny_model, ray_head):
    pools = [
        {
            "kind": "local",
            "count": 1,
            "model": str(tiny_model),
            "placement": {"resources": {"engine_slot": 1}},
        },
        {"kind": "spot", "count": 1, "model": str(tiny_model)},  # goes to a node labelled preemptible
    ]
    ray_section = {
        "address": ray_head.address,
        "node_ip_address": "127.0.0.1",
        "preemptible_label": PREEMPTIBLE_LABEL,
    }
    # the default start timeout: Ray's workers and two engines importing torch share 2 loaded cores
    config = launch_config(tmp_path, pools, backend="ray", ray=ray_section, startup_timeout_s=300)
    with Launcher(config) as launch:
        samples = _serve_batch(launch)
        assert len(samples) == 4 and all(s["state"] == "finished" for s in samples)
        assert {s["spans"][-1]["engine_id"] for s in samples} == set(launch.engines)

        addresses = listening_addresses(ray_head.descendants())
        assert len(addresses) >= 5  # gcs, raylet, manager and both engines at least
        assert all(a.startswith(("127.0.0.1:", "[::ffff:127.0.0.1]:")) for a in addresses), addresses

        spot_id, spot = next((i, e) for i, e in launch.engines.items() if e.kind == "spot")
        ray.kill(spot.slot.actor)  # the node's process is gone, as when a spot node is reclaimed
        deadline_checks = 0
        while spot_id in launch.engines and deadline_checks < 50:
            launch.check_processes()
            deadline_checks += 1
        assert spot_id not in launch.engines
        assert spot_id not in {w["id"] for w in launch.manager.workers()}  # deregistered: the record is gone
        assert len(_serve_batch(launch)) == 4
        urls = [launch.manager_url] + [e.url for e in launch.engines.values()]
    for url in [*urls, spot.url]:
        with pytest.raises(OSError):
            http("GET", url + "/health", timeout=2)
