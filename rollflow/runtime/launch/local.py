"""The local backend: the manager, engines and trainer as processes on this machine (127.0.0.1).

    with LocalLauncher(config) as launch:      # manager up, every pool's engines up and registered
        launch.add_engine(config.engines[0])   # one more: pulls the newest weights if the pool says so
        launch.run()                           # until the trainer exits (or Ctrl-C); autoscales meanwhile

Nothing is restarted silently: an engine process that exits is deregistered from the manager
and reported in the log; a manager that exits ends the launch with an error. Leaving the
`with` block stops every process the launcher started.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from rollflow.policy.autoscale import AutoscaleSettings, EngineLoad, ScaleSnapshot, decide_scale
from rollflow.runtime.launch.config import EnginePool, LaunchSection
from rollflow.runtime.launch.join import pull_newest_model
from rollflow.runtime.launch.process import ChildProcess, LaunchError, free_port, rollflow_argv
from rollflow.runtime.manager.client import ManagerClient, ManagerError

logger = logging.getLogger(__name__)


@dataclass
class LaunchedEngine:
    engine_id: int  # the manager's id
    url: str
    kind: str
    weight_version: int
    process: ChildProcess


class LocalLauncher:
    def __init__(self, config: LaunchSection) -> None:
        self.config = config
        self.work_dir = Path(config.work_dir)
        self.manager_process: ChildProcess | None = None
        self.manager: ManagerClient | None = None
        self.engines: dict[int, LaunchedEngine] = {}
        self.trainer: ChildProcess | None = None
        self.num_joined = 0  # engines started after the initial ones
        self._num_started = 0
        self._steps_seen = 0

    def __enter__(self) -> LocalLauncher:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    @property
    def manager_url(self) -> str:
        assert self.manager is not None, "start() first"
        return self.manager.url

    def start(self) -> None:
        """Manager first, then every pool's engines (each registered once healthy)."""
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self._start_manager()
        for pool in self.config.engines:
            for _ in range(pool.count):
                self._start_engine(pool)

    def add_engine(self, pool: EnginePool) -> LaunchedEngine:
        """One more engine like the pool's (pulling the newest weights if it has a weights_url)."""
        engine = self._start_engine(pool)
        self.num_joined += 1
        return engine

    def remove_engine(self, engine_id: int) -> None:
        """Deregister from the manager (its samples resume elsewhere), then stop the process."""
        engine = self.engines.pop(engine_id)
        try:
            self.manager.remove_worker(engine_id)
        except ManagerError as exc:
            if exc.status != 404:
                raise
        engine.process.stop()
        logger.info("engine %d (%s) removed", engine_id, engine.url)

    def start_trainer(self) -> ChildProcess:
        command = self.config.trainer.command
        env = {"ROLLFLOW_MANAGER_URL": self.manager_url}
        if self.config.manager.token:
            env["ROLLFLOW_MANAGER_TOKEN"] = self.config.manager.token
        self.trainer = ChildProcess("trainer", command, self.work_dir / "trainer.log", env)
        return self.trainer

    def run(self, max_seconds: float | None = None) -> int:
        """Supervise until the trainer exits (its exit code is returned), or for `max_seconds`."""
        if self.config.trainer is not None and self.trainer is None:
            self.start_trainer()
        started = time.monotonic()
        while max_seconds is None or time.monotonic() - started < max_seconds:
            self.check_processes()
            if self.trainer is not None and self.trainer.exit_code() is not None:
                return self.trainer.exit_code()
            if self.config.autoscale.enabled:
                self.autoscale_once()
            time.sleep(self.config.autoscale.poll_interval_s)
        return 0

    def check_processes(self) -> None:
        """Deregister engines whose process exited; a dead manager ends the launch."""
        code = self.manager_process.exit_code()
        if code is not None:
            raise LaunchError(f"the manager exited with code {code}:\n{self.manager_process.log_tail()}")
        for engine_id, engine in list(self.engines.items()):
            code = engine.process.exit_code()
            if code is not None:
                logger.warning(
                    "engine %d (%s, %s) exited with code %s; not restarted",
                    engine_id,
                    engine.kind,
                    engine.url,
                    code,
                )
                self.remove_engine(engine_id)

    def autoscale_once(self) -> bool:
        """Apply the autoscale policy if the trainer reported a new step; True if it did."""
        steps, last = self.manager.last_step_report()
        if steps == self._steps_seen or last is None or last.get("rollout_s") is None:
            return False
        self._steps_seen = steps
        settings = self.config.autoscale
        loads = tuple(
            EngineLoad(w["id"], w["kind"], w["running"], w["id"] in self.engines)
            for w in self.manager.workers()
            if w["state"] in ("healthy", "updating")
        )
        plan = decide_scale(
            ScaleSnapshot(last["rollout_s"], loads),
            AutoscaleSettings(
                settings.target_rollout_s,
                settings.min_engines,
                settings.max_engines,
                settings.scale_down_below,
            ),
        )
        logger.info("autoscale: %s", plan.reason)
        pool = self.config.engines[settings.pool]
        for _ in range(plan.num_add):
            self.add_engine(pool)
        for engine_id in plan.remove:
            self.remove_engine(engine_id)
        return True

    def stop(self) -> None:
        """Stop the trainer, the engines, then the manager; waits for each."""
        if self.trainer is not None:
            self.trainer.stop()
        for engine in self.engines.values():
            engine.process.stop()
        self.engines.clear()
        if self.manager_process is not None:
            self.manager_process.stop()

    def _start_manager(self) -> None:
        config = self.config.manager
        port = config.port or free_port()
        config_path = self.work_dir / "manager.yaml"
        config_path.write_text(yaml.safe_dump(config.model_dump(mode="json", exclude={"token"})))
        argv = rollflow_argv("manager", "serve", "--config", str(config_path), "--port", str(port))
        env = {"ROLLFLOW_MANAGER_TOKEN": config.token} if config.token else {}
        self.manager_process = ChildProcess("manager", argv, self.work_dir / "manager.log", env)
        url = f"http://127.0.0.1:{port}"
        self.manager_process.wait_healthy(url + "/health", self.config.startup_timeout_s)
        self.manager = ManagerClient(url, token=config.token, timeout_s=60.0)
        logger.info("manager up on %s (pid %d)", url, self.manager_process.pid)

    def _start_engine(self, pool: EnginePool) -> LaunchedEngine:
        index = self._num_started
        self._num_started += 1
        name = f"engine{index}-{pool.kind}"
        model, version = pool.model, 0
        if pool.weights_url is not None:
            model_dir = self.work_dir / name / "model"
            version = pull_newest_model(pool.weights_url, pool.tokenizer, model_dir)
            model = str(model_dir)
        port = free_port()
        argv = rollflow_argv(
            "engine", "serve", "--model", model, "--port", str(port), "--weight-version", str(version)
        )
        argv += ["--threads", str(pool.threads)]
        process = ChildProcess(name, argv, self.work_dir / f"{name}.log")
        url = f"http://127.0.0.1:{port}"
        try:
            process.wait_healthy(url + "/health", self.config.startup_timeout_s)
            worker = self.manager.add_worker(url, pool.kind, "builtin", pool.capacity)
        except BaseException:
            process.stop()
            raise
        engine = LaunchedEngine(worker["id"], url, pool.kind, version, process)
        self.engines[engine.engine_id] = engine
        logger.info("%s up on %s as engine %d, weight version %d", name, url, engine.engine_id, version)
        return engine
