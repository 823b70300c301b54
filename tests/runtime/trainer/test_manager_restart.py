"""`rollflow train` carries on when its manager is killed mid-step and started again on its journal:
the step completes on the same batch, nothing is submitted again and no micro-batch is trained twice;
a weight push cut off by a restart reaches every engine all the same."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import subprocess
import threading

import yaml
from aiohttp import web

from tests.runtime.manager.helpers import EngineProxy, manager_on_journal, wait_until
from tests.runtime.processes import ENV, REPO, free_port, http, rollflow
from tests.runtime.trainer.test_train_e2e import base_config, engine_versions, rows

PROMPTS_PER_STEP = 4
N_SAMPLES = 4


class HeldUpdate(EngineProxy):
    """Relays an engine, but holds the first weight update the manager sends it (`arrived`) until
    `released`, then fails it without passing it on: the update a manager killed mid-push never got
    through to the engine."""

    def __init__(self, backend_url: str) -> None:
        super().__init__(backend_url)
        self.arrived = threading.Event()
        self.released = threading.Event()

    async def handle(self, request, body):
        if request.path.startswith("/update_weights") and not self.arrived.is_set():
            self.arrived.set()
            while not self.released.is_set():
                await asyncio.sleep(0.01)
            return web.json_response({"success": False, "message": "held, never loaded"}, status=503)
        return await super().handle(request, body)


def _journal(path: str, sql: str, *params) -> list[tuple]:
    """Rows of the live journal, read as a second SQLite reader (WAL lets it read beside the writer)."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
    try:
        return conn.execute(sql, params).fetchall()
    except sqlite3.OperationalError:  # the tables are not there yet
        return []
    finally:
        conn.close()


def test_train_steps_complete_across_a_manager_killed_mid_rollout_and_mid_push(
    processes, tiny_model, tmp_path
):
    engines = [processes.engine() for _ in range(2)]
    proxies = [HeldUpdate(engines[0].url), EngineProxy(engines[1].url)]
    journal = str(tmp_path / "manager.journal")
    request_log = tmp_path / "requests.jsonl"
    config = {
        # two samples at a time per engine: a step's 16 samples run in waves, so it is mid-step for long
        "engines": [{"url": p.url, "capacity": 2} for p in proxies],
        "journal": journal,
        "request_log": str(request_log),
        "health_interval_s": 0.5,
    }
    port = free_port()
    manager = manager_on_journal(tmp_path, config, port)
    output = tmp_path / "run"
    train_config = base_config(
        manager,
        tiny_model,
        output,
        prompts_per_step=PROMPTS_PER_STEP,
        n_samples=N_SAMPLES,
        micro_batch_groups=1,
        max_new_tokens=48,
        manager_reconnect_s=120,
    )
    train_path = tmp_path / "train.yaml"
    train_path.write_text(yaml.safe_dump(train_config))
    trainer_log = tmp_path / "train.log"
    with open(trainer_log, "wb") as log:
        trainer = subprocess.Popen(
            rollflow("train", "--config", str(train_path)), cwd=REPO, env=ENV, stdout=log, stderr=log
        )
    try:
        # mid-step 1: the trainer holds a micro-batch (journaled) while groups of the batch still run
        (first_batch,) = wait_until(
            lambda: _journal(journal, "SELECT batch_id FROM batches"), timeout=300, what="step 1's batch"
        )[0]
        wait_until(
            lambda: _journal(journal, "SELECT 1 FROM handouts WHERE batch_id = ?", first_batch),
            timeout=300,
            what="step 1's first micro-batch",
        )
        states = http("GET", f"{manager.url}/batches/{first_batch}")[1]["states"]
        assert states["finished"] < PROMPTS_PER_STEP * N_SAMPLES, states
        manager.kill()
        manager.stop()
        manager = restarted = manager_on_journal(tmp_path, config, port)
        # step 1's weight push: killed again while an engine's update is on its way, which never lands
        wait_until(proxies[0].arrived.is_set, timeout=600, what="step 1's weight push")
        manager.kill()
        manager.stop()
        manager = manager_on_journal(tmp_path, config, port)
        proxies[0].released.set()

        assert trainer.wait(timeout=600) == 0, trainer_log.read_text()[-3000:]
        steps = rows(output)
        assert [int(r["step"]) for r in steps] == [1, 2]
        # every group of each step trained once: none twice (20), none lost (12)
        assert [int(r["samples"]) for r in steps] == [PROMPTS_PER_STEP * N_SAMPLES] * 2
        assert int(steps[0]["samples_resumed"]) > 0  # samples the restart resumed from their tokens
        assert engine_versions(manager) == [2, 2]  # both steps' weights reached the engines
        assert f"the manager at {manager.url} went away" in trainer_log.read_text()
        # every sample of step 2 came from version 1, on both engines: the cut-off push was finished
        assert int(steps[1]["samples_rejected_stale"]) == 0
    finally:
        if trainer.poll() is None:
            trainer.kill()
        manager.stop()
        proxies[0].released.set()
        for proxy in proxies:
            proxy.stop()
    restored = restarted.log_path.read_text()
    assert f"restored from journal {journal} (restart 1): 1 batches" in restored
    # one batch per step, over both managers' lives: the trainer never submitted step 1 again
    ended = [json.loads(line) for line in request_log.read_text().splitlines()]
    batches = list(dict.fromkeys(entry["batch_id"] for entry in ended))
    assert len(batches) == 2 and batches[0] == first_batch
    assert {entry["state"] for entry in ended} == {"finished"}
