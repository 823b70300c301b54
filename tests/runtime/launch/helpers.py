"""Launch configs for the tests, and a weight server on a background thread."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import safetensors.torch

from rollflow.config import validate_config
from rollflow.runtime.launch.config import LaunchFile, LaunchSection
from rollflow.runtime.weights import WeightServer, WeightStore


def launch_config(work_dir: Path, engines: list[dict], **section) -> LaunchSection:
    raw = {"launch": {"work_dir": str(work_dir), "startup_timeout_s": 120, "engines": engines, **section}}
    return validate_config(LaunchFile, raw).launch


def published_state(model_dir: Path, scale: float) -> dict:
    """The tiny model's tensors, scaled so a pulled copy is told apart from the original."""
    state = safetensors.torch.load_file(str(model_dir / "model.safetensors"))
    return {name: tensor * scale for name, tensor in state.items()}


class BackgroundWeightServer:
    """A WeightServer over `store` in its own event loop thread, on a free 127.0.0.1 port."""

    def __init__(self, store: WeightStore, token: str | None = None) -> None:
        """Publishing over HTTP needs `token`; without one, only the store's own `publish` adds versions."""
        self.server = WeightServer(store, token=token)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.server.start(), self.loop).result(30)

    @property
    def url(self) -> str:
        return self.server.url

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
