"""SIGTERM (what systemd, Kubernetes and `rollflow launch` send) stops the manager cleanly: it closes
on its way out, so the journal's last batched writes reach the disk and a restart has them."""

from __future__ import annotations

import signal

from rollflow.runtime.manager.client import ManagerClient
from tests.runtime.manager.helpers import greedy_reference, journaled_config, manager_on_journal, wait_until
from tests.runtime.processes import free_port


def test_sigterm_closes_the_manager_and_its_journal_keeps_the_last_writes(processes, tmp_path):
    engine = processes.engine()
    # nothing commits on its own for a minute: only the close at SIGTERM writes the tokens
    config = journaled_config([engine.url], tmp_path)
    port = free_port()
    manager = manager_on_journal(tmp_path, config, port)
    try:
        batch = ManagerClient(manager.url).submit([[4, 5, 6]], n=1, max_new_tokens=8, temperature=0)
        wait_until(lambda: batch.status()["states"]["finished"] == 1, what="the sample to finish")
        manager.proc.send_signal(signal.SIGTERM)
        assert manager.proc.wait(timeout=30) == 130
        assert "rollflow: interrupted" in manager.log()
    finally:
        manager.stop()

    manager = manager_on_journal(tmp_path, config, port)
    try:
        (group,) = next(batch.micro_batches())
        (sample,) = group
        # journaled at the close: served as it was, not generated again
        assert (sample["state"], sample["attempts"], sample["resumes"]) == ("finished", 1, 0)
        assert sample["output_ids"] == greedy_reference(engine, [4, 5, 6], 8)
    finally:
        manager.stop()
