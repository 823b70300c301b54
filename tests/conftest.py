"""Fixtures over Vidur's public data in ../shared (tests that need it skip when it is absent), and
how the suite splits over pytest-xdist workers (`make test` runs it with `-n`, see the Makefile)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rollflow.perf.grid_cache import CACHE_DIR_ENV
from tests.factories import LLAMA7B_MLP, SHARED, VIDUR_DATA


@pytest.fixture(scope="session")
def vidur_data() -> Path:
    if not LLAMA7B_MLP.is_file():
        pytest.skip("Vidur's public data is not at ../shared/data/vidur")
    return VIDUR_DATA


@pytest.fixture(scope="session")
def attention_table(tmp_path_factory: pytest.TempPathFactory, vidur_data: Path) -> Path:
    """Llama-2-7B/A100 attention table written by the shared tool (Vidur's data has none)."""
    out = tmp_path_factory.mktemp("tables") / "attention.csv"
    tool = SHARED / "tools" / "attention_table.py"
    subprocess.run(
        [
            sys.executable,
            str(tool),
            "--embd",
            "4096",
            "--q-heads",
            "32",
            "--kv-heads",
            "32",
            "--tp",
            "1,2",
            str(out),
        ],
        check=True,
        capture_output=True,
    )
    return out


@pytest.fixture(scope="session", autouse=True)
def grid_cache_dir(tmp_path_factory: pytest.TempPathFactory):
    """Tests (and the commands they start) cache operator grids in a folder of their own, not the user's."""
    previous = os.environ.get(CACHE_DIR_ENV)
    os.environ[CACHE_DIR_ENV] = str(tmp_path_factory.mktemp("grid_cache"))
    yield
    if previous is None:
        os.environ.pop(CACHE_DIR_ENV, None)
    else:
        os.environ[CACHE_DIR_ENV] = previous


# The folders whose tests start servers, engines, trainers or the commands of a page: `make test-fast`
# leaves them out (`-m "not process"`). A module elsewhere that runs the CLI as a subprocess says so
# itself with `pytestmark = pytest.mark.process`.
_PROCESS_FOLDERS = ("tests/runtime/", "tests/integration/", "tests/docs/")

# Session fixtures made once per run, not once per worker: the tests using one share a group.
_ONE_PER_RUN = {"vllm_server": "vllm"}  # a vLLM server takes minutes to start on CPU

# Fixtures wider than a test but narrower than a session. Under `--dist loadgroup` a test with no
# group is sent to any worker, so the tests sharing one of these would each make it again on their
# own worker (a module's engines started once per worker instead of once).
_SHARED_SCOPES = ("package", "module", "class")


def _shared_scope_group(item: pytest.Item) -> str | None:
    """The package or module whose fixture the test shares, if any (the widest such scope wins)."""
    info = getattr(item, "_fixtureinfo", None)  # pytest keeps no public view of a test's fixtures
    used = [defs[-1] for defs in info.name2fixturedefs.values() if defs] if info else []
    for scope in _SHARED_SCOPES:
        for fixture in used:
            if fixture.scope == scope:
                # a package fixture's baseid is its conftest's folder; a module's tests share the file
                return fixture.baseid if scope == "package" else item.nodeid.split("::")[0]
    return None


def pytest_itemcollected(item: pytest.Item) -> None:
    """Mark the tests of the process folders `process`, and group the tests that share a costly
    fixture on one xdist worker (`--dist loadgroup`).

    The vLLM server's tests share one worker; so do a module's (or package's) tests that share a
    fixture of that scope. A test that names its group (`@pytest.mark.xdist_group("ray")`) keeps
    it. Every other test runs on any worker; a session fixture (the shared engine) is made once per
    worker that needs it, the tiny models once per run (tests/once.py). This runs as each test is
    collected, before xdist reads the groups (in its own pytest_collection_modifyitems).
    """
    if item.nodeid.startswith(_PROCESS_FOLDERS):
        item.add_marker(pytest.mark.process)
    if item.get_closest_marker("xdist_group") is not None:
        return
    names = [group for fixture, group in _ONE_PER_RUN.items() if fixture in item.fixturenames]
    group = names[0] if names else _shared_scope_group(item)
    if group is not None:
        item.add_marker(pytest.mark.xdist_group(group))
