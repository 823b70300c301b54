"""Bringing the engines onto the trainer's weight version, through the manager.

At each version the learner writes weights/vN (or, under fsdp with mooncake, its ranks lend their
shards), the version goes to the weight server when the run has one (`weights_url`), and the manager
is told to have every engine load it: pulled from the weight server (a delta against the version the
engine holds), or read from the folder by an engine that cannot pull (vLLM, SGLang: the manager answers
409). The manager holds each engine out of the pool until it has.
"""

from __future__ import annotations

import logging
from pathlib import Path

from rollflow.errors import UserError
from rollflow.runtime.manager.client import ManagerClient, ManagerError
from rollflow.runtime.trainer import checkpoints
from rollflow.runtime.trainer.config import TrainConfig
from rollflow.runtime.trainer.learner import Learner
from rollflow.runtime.weights.checkpoint import publish_checkpoint, published_versions
from rollflow.runtime.weights.token import publish_token

log = logging.getLogger(__name__)


class WeightPush:
    """Rank 0's pushes of the learner's policy to the manager's engines."""

    def __init__(
        self, config: TrainConfig, client: ManagerClient, output_dir: Path, learner: Learner
    ) -> None:
        self.config = config
        self.client = client
        self.output_dir = output_dir
        self.learner = learner

    def sync(self, version: int) -> None:
        """Bring engines that are not on `version` (a resumed run, a reused fleet) onto it.

        Otherwise their samples would carry another version and be rejected as stale.
        """
        folder = checkpoints.weights_folder(self.output_dir, version)
        shards = self.learner.shards
        if shards is not None:
            if any(w["weight_version"] != version for w in self.client.live_workers()):
                shards.publish(self.learner.policy, version)
            self._update_engines(version, folder, skip_up_to_date=True)
            return
        if not folder.is_dir():
            self.learner.write_weights(folder)
        url = self.config.weights_url
        if url is not None and version not in published_versions(url):
            self._publish(version, folder)
        self._update_engines(version, folder, skip_up_to_date=True)

    def push(self, version: int) -> None:
        """Every engine onto the new `version`; older weight folders beyond `keep_weight_versions` go."""
        folder = checkpoints.weights_folder(self.output_dir, version)
        if self.learner.shards is not None:  # the ranks lend their shards: nothing is gathered or written
            self.learner.shards.publish(self.learner.policy, version)
        else:
            self.learner.write_weights(folder)
            if self.config.weights_url is not None:
                self._publish(version, folder)
        self._update_engines(version, folder, skip_up_to_date=False)
        checkpoints.prune_weights(self.output_dir, self.config.keep_weight_versions)

    def _publish(self, version: int, folder: Path) -> None:
        """Put the version on the weight server, where engines pull it."""
        publish_checkpoint(self.config.weights_url, version, folder, publish_token())

    def _update_engines(self, version: int, folder: Path, skip_up_to_date: bool) -> None:
        workers = self.client.live_workers()
        if not workers:
            raise UserError(f"no healthy engine is registered with the manager at {self.config.manager_url}")
        if skip_up_to_date:  # already on it
            workers = [worker for worker in workers if worker["weight_version"] != version]
        if self._update_each(workers, version, folder):
            # a manager restarted from its journal mid-push registers its engines again under new ids:
            # those the old ids missed are found (by their version) and updated once more
            missed = [worker for worker in self.client.live_workers() if worker["weight_version"] != version]
            self._update_each(missed, version, folder)

    def _update_each(self, workers: list[dict], version: int, folder: Path) -> bool:
        """Update each engine; True when the manager knew one of their ids no longer."""
        unknown = False
        for worker in workers:
            try:
                self._update_engine(worker["id"], version, folder)
            except ManagerError as exc:
                # An engine that fails to load is retired by the manager; the others carry on.
                log.warning("engine %s did not take version %d: %s", worker["id"], version, exc)
                unknown |= exc.status == 404
        return unknown

    def _update_engine(self, engine_id: int, version: int, folder: Path) -> None:
        """Have the engine pull the version from the weight server, or load it from `folder`."""
        if self.config.weights_url is not None:
            try:
                self.client.update_weights(
                    engine_id,
                    weight_version=version,
                    weights_url=self.config.weights_url,
                    codec=self.config.weights_codec,
                    transport=self.config.weights_transport,
                )
                return
            except ManagerError as exc:
                if exc.status != 409:
                    raise
                # 409: this engine cannot pull (vLLM, SGLang); it loads the same version from disk
                if not folder.is_dir():  # fsdp with mooncake writes the folder only for such engines
                    self.learner.write_weights(folder)
        self.client.update_weights(engine_id, weight_version=version, model_path=str(folder.resolve()))
