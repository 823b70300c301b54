"""A Ray actor that no node takes: the launcher's error names what is short, asked against free and held."""

import pytest

pytest.importorskip("ray")

from rollflow.runtime.launch.ray_slots import shortfall


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
