"""What the profiling tests share: the tiny model, written once per module."""

import pytest

from tests.perf.profiling import run_rollflow


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("models") / "tiny"
    proc = run_rollflow("engine", "init-model", str(path))
    assert proc.returncode == 0, proc.stderr
    return path
