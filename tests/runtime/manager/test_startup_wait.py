"""A manager whose config lists engines that are still loading waits for them; one that never
comes up ends the manager with one line naming it and the timeout key."""

from __future__ import annotations

import yaml

from rollflow.runtime.launch.servers import run_rollflow
from tests.runtime.manager.helpers import workers
from tests.runtime.processes import free_port, start_engine


def test_the_manager_waits_for_configured_engines_that_are_still_loading(processes, tmp_path):
    engine = start_engine(
        processes.model, tmp_path, wait=False, forked=False
    )  # imports and loads for seconds
    processes.started.append(engine)
    manager = processes.manager(engines=[{"url": engine.url, "engine_type": "builtin"}])
    assert [w["state"] for w in workers(manager).values()] == ["healthy"]
    assert "waiting for engine" in manager.log()


def test_an_engine_that_never_comes_up_is_a_one_line_error(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    config = tmp_path / "manager.yaml"
    config.write_text(yaml.safe_dump({"engine_startup_timeout_s": 1.5, "engines": [{"url": url}]}))
    result = run_rollflow(
        "manager", "serve", "--config", str(config), "--port", str(free_port()), timeout=120
    )
    assert result.returncode != 0
    assert url in result.stderr and "engine_startup_timeout_s" in result.stderr, result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"rollflow: engine at {url} is unreachable: connection refused (waited 1.5s, engine_startup_timeout_s); "
        "start the engine first, or correct or remove engines.0 of the config"
    )
    assert "Traceback" not in result.stderr and "Unclosed client session" not in result.stderr, result.stderr
