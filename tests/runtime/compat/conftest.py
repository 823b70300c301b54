"""One manager and two built-in engines shared by every client family's tests: the manager starts
with no engine, and each module registers them the way its client does (and unregisters them when it
is done), so the cluster is as it was found between modules."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from tests.runtime.conftest import ProcessFactory
from tests.runtime.processes import Process, http


@dataclass
class Cluster:
    manager: Process
    engines: list[Process]

    @property
    def engine_urls(self) -> list[str]:
        return [engine.url for engine in self.engines]


@pytest.fixture(scope="package")
def cluster(tmp_path_factory, tiny_model):
    factory = ProcessFactory(tmp_path_factory.mktemp("compat"), tiny_model)
    engines = [factory.engine(), factory.engine()]
    manager = factory.manager()
    yield Cluster(manager, engines)
    factory.stop_all()


@pytest.fixture(scope="module")
def operator_registered(cluster: Cluster):
    """The manager with the engines registered by its operator, for client families that are given
    the servers' addresses and never register engines themselves; unregistered at the module's end."""
    for url in cluster.engine_urls:
        assert (
            http("POST", cluster.manager.url + "/workers", {"url": url, "engine_type": "builtin"})[0] == 201
        )
    yield cluster.manager
    for worker in http("GET", cluster.manager.url + "/workers")[1]["workers"]:
        assert http("DELETE", f"{cluster.manager.url}/workers/{worker['id']}")[0] == 200
