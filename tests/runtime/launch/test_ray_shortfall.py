"""A Ray actor that no node takes: the launcher's error names what is short, asked against free and held,
and only an actor that is short of room fails fast (one with room may be waiting for a slow worker)."""

import pytest

pytest.importorskip("ray")

from rollflow.runtime.launch.ray_slots import is_short, shortfall


def test_shortfall_names_the_cpus_asked_free_and_held():
    options = {"num_cpus": 1.0, "resources": {"engine_slot": 1.0}, "label_selector": {}}
    message = shortfall(
        options, available={"CPU": 0.0, "engine_slot": 2.0}, total={"CPU": 2.0, "engine_slot": 4.0}
    )
    assert "CPU: asked 1, 0 free of 2 (short)" in message
    assert "engine_slot: asked 1, 2 free of 4;" in message  # enough of it: not marked short
    assert "ray start --num-cpus N" in message


def test_shortfall_names_a_resource_the_cluster_lacks_and_the_labels_asked():
    options = {
        "num_cpus": 0.0,
        "resources": {"gpu_slot": 1.0},
        "label_selector": {"rollflow.io/preemptible": "true"},
    }
    message = shortfall(options, available={"CPU": 2.0}, total={"CPU": 2.0})
    assert "gpu_slot: asked 1, 0 free of 0 (short)" in message
    assert "CPU" not in message.split(";")[0]  # asked for none
    assert "node labels {'rollflow.io/preemptible': 'true'}" in message


@pytest.mark.parametrize(
    ("available", "short"),
    [
        ({"CPU": 7.0, "engine_slot": 1.0}, False),  # room: the actor waits for its worker
        ({"CPU": 0.5, "engine_slot": 1.0}, True),
        ({"CPU": 8.0}, True),  # a custom resource the cluster has none of free
    ],
)
def test_an_actor_is_short_only_when_a_resource_it_asks_for_lacks_free_room(available, short):
    options = {"num_cpus": 1.0, "resources": {"engine_slot": 1.0, "unused": 0.0}, "label_selector": {}}
    assert is_short(options, available) is short
