"""A prompts plug-in for the partial-rollout test: random prompts, and at the submission of the step
after the first carry (between steps: the last push is done, no resume has been sent yet) it kills -9
the engine that made the newest tokens of a carried sample, and notes which in `killed.json`."""

from __future__ import annotations

import json
import os
import random
import signal
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from rollflow.runtime.trainer.tasks import random_prompts

PIDS_ENV = "ROLLFLOW_TEST_ENGINE_PIDS"  # JSON {engine url: pid}
RUN_ENV = "ROLLFLOW_TEST_OUTPUT_DIR"  # the run's output_dir


def prompts_killing_an_engine(tokenizer: Any, num: int, rng: random.Random) -> list[list[int]]:
    output = Path(os.environ[RUN_ENV])
    carried, killed = output / "carried.json", output / "killed.json"
    if carried.is_file() and not killed.exists():
        _kill_an_engine_of(json.loads(carried.read_text()), killed)
    return random_prompts(tokenizer, num, rng)


def _kill_an_engine_of(carried: dict, record: Path) -> None:
    pids = json.loads(os.environ[PIDS_ENV])
    for group in carried["groups"]:
        for sample in group:
            if sample["spans"] and sample["finish_reason"] == "abort":
                url = sample["spans"][-1]["engine_url"]
                os.kill(pids[url], signal.SIGKILL)
                _wait_gone(url)
                record.write_text(
                    json.dumps({"url": url, "sample_id": sample["sample_id"], "spans": sample["spans"]})
                )
                return
    raise AssertionError("no carried sample has tokens: nothing to kill an engine under")


def _wait_gone(url: str) -> None:
    """Until the engine's port refuses connections (the kill has landed)."""
    while True:
        try:
            urllib.request.urlopen(url + "/health", timeout=1).close()
        except (urllib.error.URLError, OSError):
            return
