"""What the GPU benchmark's stages share: the settings of a full and a small run, a stage's time
budget (every subprocess and wait it starts ends by its deadline), and the fleet of built-in
engines behind a rollout manager that the engine, manager and trainer stages use."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from rollflow.runtime.launch.servers import (
    ServerProcess,
    manager_config,
    run_rollflow,
    start_engine,
    start_manager,
)


class StageFailed(Exception):
    """A stage could not finish; the message says why (its results file records it)."""


@dataclass(frozen=True)
class Settings:
    """What one run measures: `full` on a GPU, `small` to check the whole run on a CPU in a minute."""

    device: str
    # `rollflow engine init-model` options of the served model
    model_args: tuple[str, ...]
    # dtype the engines run in
    engine_dtype: str
    # `rollflow profile ops` options for Llama-2-7B (device and output added)
    ops_args: tuple[str, ...]
    # requests decoding at once in each engine and in the simulation
    max_running: int
    # `rollflow profile engine` options (url, model and output added); its largest batch is max_running
    profile_engine_args: tuple[str, ...]
    # requests replayed per load, their lengths clipped to these
    num_requests: int
    max_prompt: int
    max_decode: int
    # fractions of the profiled capacity the trace is replayed at
    loads: tuple[float, ...]
    # manager stage: requests per slice, slices per path, concurrency, tokens per request
    manager_requests: int
    manager_slices: int
    manager_concurrency: int
    manager_tokens: int
    # trainer stage: `rollflow train` config entries
    train: dict


LLAMA_1B = ("--layers", "16", "--heads", "32", "--kv-heads", "8", "--mlp-dim", "8192")


def settings(device: str, small: bool) -> Settings:
    if small:
        return Settings(
            device=device,
            model_args=(),
            engine_dtype="float32",
            ops_args=("--grid", "small", "--tp", "8", "--max-model-len", "32", "--max-batch-size", "2",
                      "--warmup", "1", "--repeats", "2"),
            max_running=4,
            profile_engine_args=("--batch-sizes", "1,4", "--prompt-lengths", "1,16", "--decode-prompt-lengths",
                                 "16", "--decode-tokens", "8", "--repeats", "1"),
            num_requests=8, max_prompt=32, max_decode=8, loads=(0.4, 0.8),
            manager_requests=8, manager_slices=2, manager_concurrency=4, manager_tokens=8,
            train={"prompts_per_step": 2, "n_samples": 2, "micro_batch_groups": 1, "mini_batch_micro_batches": 2,
                   "max_new_tokens": 4},
        )  # fmt: skip
    return Settings(
        device=device,
        model_args=(*LLAMA_1B, "--dtype", "bfloat16", "--init-std", "0.02"),
        engine_dtype="bfloat16",
        ops_args=("--grid", "default", "--tp", "1,2,4,8"),
        max_running=8,
        profile_engine_args=("--batch-sizes", "1,4,8", "--prompt-lengths", "1,16,64,256",
                             "--decode-prompt-lengths", "16,128", "--decode-tokens", "16", "--repeats", "2"),
        num_requests=24, max_prompt=256, max_decode=32, loads=(0.4, 0.8),
        manager_requests=16, manager_slices=2, manager_concurrency=16, manager_tokens=16,
        train={"prompts_per_step": 4, "n_samples": 4, "micro_batch_groups": 2, "mini_batch_micro_batches": 2,
               "max_new_tokens": 16},
    )  # fmt: skip


class Budget:
    """A stage's deadline: what it starts is given the time left, and ends with StageFailed after it."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.deadline = time.monotonic() + seconds

    def left(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise StageFailed(f"over its {self.seconds:.0f} s budget")
        return left

    def rollflow(self, *args: str) -> str:
        """`rollflow ARGS` in a subprocess, killed at the deadline; its stdout."""
        try:
            proc = run_rollflow(*args, timeout=self.left())
        except subprocess.TimeoutExpired:
            raise StageFailed(
                f"`rollflow {' '.join(args[:2])}` ran past the {self.seconds:.0f} s budget"
            ) from None
        if proc.returncode:
            raise StageFailed(
                f"`rollflow {' '.join(args[:2])}` exited {proc.returncode}: {proc.stderr[-1500:]}"
            )
        return proc.stdout


def http_json(url: str, timeout: float = 10.0) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())


class Fleet:
    """Two built-in engines on the device, serving the same model, and a manager routing round robin
    over them; started once (the engine stage's budget pays for it) and stopped at the end."""

    def __init__(self, model: Path, work: Path, settings: Settings, budget: Budget) -> None:
        self.model = model
        self.engines: list[ServerProcess] = []
        self.manager: ServerProcess | None = None
        try:
            for i in range(2):
                args = ("--device", settings.device, "--dtype", settings.engine_dtype)
                args += ("--max-running-requests", str(settings.max_running), "--seed", str(i))
                self.engines.append(start_engine(model, work, name=f"engine{i}", wait=False, extra_args=args))
            for engine in self.engines:
                engine.wait_ready(timeout=budget.left())
            config = manager_config([engine.url for engine in self.engines], router="round_robin")
            self.manager = start_manager(config, work, wait=False)
            self.manager.wait_ready(timeout=budget.left())
        except RuntimeError as exc:
            self.stop()
            raise StageFailed(f"the engines and manager did not start: {str(exc)[-1500:]}") from None

    def alive(self) -> None:
        """StageFailed naming the process that died (its log's end), if one did."""
        for process in [*self.engines, self.manager]:
            if process is None or process.proc.poll() is not None:
                log = process.log() if process is not None else "never started"
                raise StageFailed(f"a fleet process is gone: {log[-1000:]}")

    def stop(self) -> None:
        for process in [self.manager, *self.engines]:
            if process is not None:
                process.stop()


def device_figures(device: str) -> dict:
    """What ran the measurements: the GPU's name and torch's CUDA, or the CPU."""
    import torch

    import rollflow
    from rollflow.native import extension

    figures = {
        "device": device,
        "torch": torch.__version__,
        "rollflow": str(Path(rollflow.__file__).parent),
        # _timing first: _loop takes _timing's capsule as it loads
        "compiled_core": all(
            extension(name) is not None
            for name in ("rollflow.perf._timing", "rollflow.sim._loop", "rollflow.sim._trace")
        ),
    }
    if device.startswith("cuda"):
        figures |= {"gpu": torch.cuda.get_device_name(), "cuda": torch.version.cuda}
    else:
        figures["cpu_threads"] = torch.get_num_threads()
    return figures


def num_parameters(model: Path) -> int:
    """Parameters in the model folder's safetensors files."""
    import math

    from safetensors import safe_open

    total = 0
    for file in model.glob("*.safetensors"):
        with safe_open(file, "pt") as handle:
            total += sum(math.prod(handle.get_slice(name).get_shape()) for name in handle.keys())  # noqa: SIM118
    return total
