"""Start the manager, engines and trainer of a launch config, supervise them, and scale engines.

    with Launcher(config) as launch:            # manager up, every pool's engines up and registered
        launch.add_engine(config.engines[0])    # one more: pulls the newest weights if the pool says so
        launch.run()                            # until the trainer exits (or Ctrl-C); autoscales meanwhile

Each process runs in a slot: a child process here (`backend: local`) or a Ray actor on a node
chosen by its placement (`backend: ray`). Nothing is restarted silently: an engine whose
process exits (or whose actor or node is lost: a preempted engine) is deregistered from the
manager, so its samples resume elsewhere, and logged; a manager that exits ends the launch.
Leaving the `with` block stops every process the launcher started.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from rollflow.policy.autoscale import EngineLoad, ScaleSnapshot, decide_scale
from rollflow.runtime.http.listen import check_free
from rollflow.runtime.launch.config import LAUNCHED_WEIGHTS, EnginePool, LaunchSection, Placement
from rollflow.runtime.launch.engine_commands import EngineCommand, engine_command, set_weight_version
from rollflow.runtime.launch.process import LaunchError
from rollflow.runtime.launch.slots import LocalSlot, Slot, wait_answering
from rollflow.runtime.manager.client import ManagerClient, ManagerError
from rollflow.runtime.manager.token import TOKEN_ENV as MANAGER_TOKEN_ENV
from rollflow.runtime.weights.checkpoint import publish_checkpoint
from rollflow.runtime.weights.token import TOKEN_ENV as WEIGHTS_TOKEN_ENV

if TYPE_CHECKING:
    from rollflow.runtime.launch.relays import NodeRelays

logger = logging.getLogger(__name__)


@dataclass
class LaunchedEngine:
    engine_id: int  # the manager's id
    url: str
    kind: str
    weight_version: int
    slot: Slot
    pool: EnginePool  # the pool it was started from


class Launcher:
    def __init__(self, config: LaunchSection) -> None:
        self.config = config
        self.work_dir = Path(config.work_dir).resolve()
        self.manager_slot: Slot | None = None
        self.manager: ManagerClient | None = None
        self.weights_slot: Slot | None = None
        self.weights_url: str | None = None  # the launched weight server's, when launch.weights is enabled
        self.weights_token: str | None = None  # its publish token
        self.engines: dict[int, LaunchedEngine] = {}
        self.trainer: Slot | None = None
        self.num_joined = 0  # engines started after the initial ones
        self._num_started = 0
        self._steps_seen = 0
        self._ray_started = False
        self._lock = threading.Lock()  # engines register from several threads
        self.relays: NodeRelays | None = None  # backend ray with launch.ray.relays: one per engine node

    def __enter__(self) -> Launcher:
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
        """Manager and weight server first, then every pool's engines (each registered once healthy)."""
        if self.config.backend == "ray":
            self._connect_ray()
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self._start_manager()
        if self.config.backend == "ray" and self.config.ray.relays:
            from rollflow.runtime.launch.relays import NodeRelays

            manager = self.config.manager
            self.relays = NodeRelays(
                str(self.work_dir),
                manager.token,
                manager.stream_flush_ms,
                self.config.startup_timeout_s,
                self.config.ray.actor_start_timeout_s,
            )
        if self.config.weights.enabled:
            self._start_weight_server()
        starting: list[_StartingEngine] = []
        try:
            for pool in self.config.engines:
                starting += [self._spawn_engine(pool) for _ in range(pool.count)]
            if starting:
                # the engines load in parallel; waiting on each in turn would add their start-up times
                with ThreadPoolExecutor(max_workers=len(starting)) as executor:
                    for future in [executor.submit(self._register_engine, engine) for engine in starting]:
                        future.result()
        except BaseException:
            for engine in starting:
                engine.slot.stop()
            raise

    def add_engine(self, pool: EnginePool) -> LaunchedEngine:
        """One more engine like the pool's (pulling the newest weights if it has a weights_url)."""
        starting = self._spawn_engine(pool)
        try:
            engine = self._register_engine(starting)
        except BaseException:
            starting.slot.stop()
            raise
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
        engine.slot.stop()
        logger.info("engine %d (%s) removed", engine_id, engine.url)

    def preempt(self, engine_id: int) -> None:
        """Kill the engine's process at once, as a spot machine's loss would; it stays registered.

        The manager finds out the way it would in production (its streams break, health checks
        fail) and resumes the engine's samples elsewhere; `check_processes` then deregisters it.
        """
        engine = self.engines[engine_id]
        engine.slot.kill()
        logger.warning("engine %d (%s, %s) preempted", engine_id, engine.kind, engine.url)

    def start_trainer(self) -> Slot:
        trainer = self.config.trainer
        env = {"ROLLFLOW_MANAGER_URL": self.manager_url}
        if self.weights_url is not None:
            env["ROLLFLOW_WEIGHTS_URL"] = self.weights_url
        if self.weights_token is not None:
            env[WEIGHTS_TOKEN_ENV] = self.weights_token  # the trainer publishes each version
        if self.config.manager.token:
            env[MANAGER_TOKEN_ENV] = self.config.manager.token
        self.trainer = self._slot("trainer", trainer.placement)
        self.trainer.start(trainer.command, str(self.work_dir / "trainer.log"), env, rollflow=False, files={})
        return self.trainer

    def run(self) -> int:
        """Supervise until the trainer exits (its exit code is returned), or until interrupted."""
        if self.config.trainer is not None and self.trainer is None:
            self.start_trainer()
        while True:
            self.check_processes()
            if self.trainer is not None:
                code = self.trainer.exit_code()
                if code is not None:
                    return code
            if self.config.autoscale.enabled:
                self.autoscale_once()
            time.sleep(self.config.autoscale.poll_interval_s)

    def check_processes(self) -> None:
        """Deregister engines whose process (or actor, or node) is gone; a dead manager ends the launch."""
        code = self.manager_slot.exit_code()
        if code is not None:
            raise LaunchError(f"the manager exited with code {code}:\n{self.manager_slot.log_tail()}")
        for engine_id, engine in list(self.engines.items()):
            code = engine.slot.exit_code()
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
            for w in self.manager.live_workers()
        )
        plan = decide_scale(ScaleSnapshot(last["rollout_s"], loads), settings.settings())
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
            engine.slot.stop()
        self.engines.clear()
        if self.relays is not None:
            self.relays.stop()
        if self.weights_slot is not None:
            self.weights_slot.stop()
        if self.manager_slot is not None:
            self.manager_slot.stop()
        if self._ray_started:
            import ray

            ray.shutdown()
            self._ray_started = False

    def _connect_ray(self) -> None:
        from rollflow.ray_cluster import init_ray

        settings = self.config.ray
        init_ray(
            settings.address,
            "launch.ray.address",
            "set launch.backend=local to run on this machine",
            _node_ip_address=settings.node_ip_address,
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
        )
        self._ray_started = True

    def _slot(self, name: str, placement: Placement, kind: str | None = None) -> Slot:
        if self.config.backend == "local":
            return LocalSlot(name)
        from rollflow.runtime.launch.ray_slots import RaySlot

        selector = dict(placement.label_selector)
        if kind == "spot" and not selector:
            selector = {self.config.ray.preemptible_label: "true"}
        options = {
            "num_cpus": placement.num_cpus,
            "resources": placement.resources,
            "label_selector": selector,
        }
        return RaySlot(name, options, self.config.ray.actor_start_timeout_s)

    def _check_free(self, host: str, port: int, port_key: str) -> None:
        """A fixed port taken on this machine is the launch's one-line error naming the config key,
        not the child's error (naming its own --port) inside its log."""
        if self.config.backend == "local":
            check_free(host, port, port_key)

    def _wait_healthy(self, slot: Slot, url: str, path: str = "/health") -> None:
        def healthy() -> bool:
            try:
                with urllib.request.urlopen(url + path, timeout=2) as response:
                    return response.status == 200
            except (urllib.error.URLError, OSError):
                return False

        wait_answering(slot, healthy, url + path, self.config.startup_timeout_s)

    def _start_manager(self) -> None:
        config = self.config.manager
        self.manager_slot = self._slot("manager", self.config.ray.manager_placement)
        host = self.manager_slot.host
        self._check_free(host, config.port, "launch.manager.port")
        port = config.port or self.manager_slot.free_port()
        config_path = str(self.work_dir / "manager.yaml")
        config_text = yaml.safe_dump(config.model_dump(mode="json", exclude={"token"}))
        argv = ["manager", "serve", "--config", config_path, "--host", host, "--port", str(port)]
        env = {MANAGER_TOKEN_ENV: config.token} if config.token else {}
        log_path = str(self.work_dir / "manager.log")
        self.manager_slot.start(argv, log_path, env, rollflow=True, files={config_path: config_text})
        url = f"http://{host}:{port}"
        self._wait_healthy(self.manager_slot, url)
        # the launcher owns the manager's process: gone, it is not coming back, so no call waits for it
        self.manager = ManagerClient(url, token=config.token, timeout_s=60.0, reconnect_s=0)
        logger.info("manager up on %s", url)

    def _start_weight_server(self) -> None:
        """`rollflow weights serve` in its own slot, then version 0 published from `weights.publish`."""
        settings = self.config.weights
        store = self.work_dir / "weight_store"
        # the launch's own store: versions left by an earlier launch would be taken for this trainer's
        shutil.rmtree(store, ignore_errors=True)
        self.weights_slot = self._slot("weights", settings.placement)
        host = self.weights_slot.host
        self._check_free(host, settings.port, "launch.weights.port")
        port = settings.port or self.weights_slot.free_port()
        argv = ["weights", "serve", "--dir", str(store), "--host", host]
        argv += ["--port", str(port), "--keep-versions", str(settings.keep_versions)]
        argv += ["--mooncake", settings.mooncake] if settings.mooncake is not None else []
        # publishing needs a token: the user's, or one made for this launch (its trainer gets it too)
        self.weights_token = os.environ.get(WEIGHTS_TOKEN_ENV) or secrets.token_urlsafe(24)
        env = {WEIGHTS_TOKEN_ENV: self.weights_token}
        self.weights_slot.start(argv, str(self.work_dir / "weights.log"), env, rollflow=True, files={})
        url = f"http://{host}:{port}"
        self._wait_healthy(self.weights_slot, url, "/health")
        self.weights_url = url
        logger.info("weight server up on %s", url)
        if settings.publish is not None:
            publish_checkpoint(url, 0, settings.publish, self.weights_token)

    def _spawn_engine(self, pool: EnginePool) -> _StartingEngine:
        """Pull weights if the pool says so, then start the engine's process.

        Called on the thread that owns the launch: a child dies with the thread that started it
        (PR_SET_PDEATHSIG), so processes are never started from short-lived worker threads.
        """
        name = f"engine{self._num_started}-{pool.kind}"
        self._num_started += 1
        slot = self._slot(name, pool.placement, pool.kind)
        try:
            model, version = pool.model, 0
            if pool.weights_url is not None:
                model = str(self.work_dir / name / "model")
                weights_url = self.weights_url if pool.weights_url == LAUNCHED_WEIGHTS else pool.weights_url
                version = slot.pull_weights(weights_url, pool.tokenizer, model)
            port = slot.free_port()
            command = engine_command(pool, model, slot.host, port, version)
            log_path = str(self.work_dir / f"{name}.log")
            slot.start(command.argv, log_path, command.env, rollflow=command.rollflow, files={})
            relay = self.relays.address_for(slot) if self.relays is not None else None
        except BaseException:
            slot.stop()
            raise
        return _StartingEngine(name, pool, slot, f"http://{slot.host}:{port}", version, command, relay)

    def _register_engine(self, starting: _StartingEngine) -> LaunchedEngine:
        """Wait until the engine answers, then register it with the manager (safe on any thread)."""
        self._wait_healthy(starting.slot, starting.url)
        if starting.command.version_over_http:
            set_weight_version(starting.url, starting.version)
        pool = starting.pool
        worker = self.manager.add_worker(
            starting.url, pool.kind, pool.server, pool.capacity, relay=starting.relay
        )
        engine = LaunchedEngine(worker["id"], starting.url, pool.kind, starting.version, starting.slot, pool)
        with self._lock:
            self.engines[engine.engine_id] = engine
        logger.info(
            "%s up on %s as engine %d, weight version %d",
            starting.name,
            starting.url,
            engine.engine_id,
            starting.version,
        )
        return engine


@dataclass
class _StartingEngine:
    """An engine whose process is started but not yet registered."""

    name: str
    pool: EnginePool
    slot: Slot
    url: str
    version: int
    command: EngineCommand
    relay: str | None  # HOST:PORT of its node's relay (backend ray, launch.ray.relays)
