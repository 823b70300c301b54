"""`rollflow router train`: demonstrations -> behaviour cloning -> PPO -> exported policy.

Phases, each logged under its name in metrics.csv (and TensorBoard when installed):
    demos      heuristic routers route training episodes (imbalanced starts included)
    bc         the scorer clones the best demonstrators; a frozen copy becomes the KL reference
    ppo        rollouts + updates; every `validate_every` iterations the greedy policy routes the
               validation seeds, and the one with the lowest p99 E2E so far is kept
    export     the kept policy is written to policy_file, default <output_dir>/policy.npz (numpy inference)

A checkpoint is written after every PPO iteration; `--resume auto` continues from it (the
episode in progress restarts), `--resume never` starts over.
"""

from __future__ import annotations

import copy
import csv
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from rollflow.learn.bc import behaviour_clone, imitation_accuracy
from rollflow.learn.config import LearnConfig
from rollflow.learn.demos import collect_demonstrations
from rollflow.learn.env import RoutingEnv, observation_spec
from rollflow.learn.evaluate import run_router, summarize_latencies
from rollflow.learn.policy_net import ScorerPolicy
from rollflow.learn.ppo import PPO
from rollflow.policy.learned import save_learned_router

CHECKPOINT = "checkpoint.pt"
POLICY = "policy.npz"


class MetricsLog:
    """metrics.csv in long form (phase, step, metric, value), mirrored to TensorBoard if installed."""

    def __init__(self, out_dir: Path, append: bool) -> None:
        path = out_dir / "metrics.csv"
        fresh = not (append and path.is_file())
        self._file = path.open("w" if fresh else "a", newline="")
        self._csv = csv.writer(self._file)
        if fresh:
            self._csv.writerow(["phase", "step", "metric", "value"])
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:  # tensorboard is optional at run time
            self._tb = None
        else:
            self._tb = SummaryWriter(str(out_dir / "tensorboard"))

    def log(self, phase: str, step: int, metrics: dict[str, float]) -> None:
        for name, value in metrics.items():
            self._csv.writerow([phase, step, name, value])
            if self._tb is not None:
                self._tb.add_scalar(f"{phase}/{name}", value, step)
        self._file.flush()

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()


def validate(config: LearnConfig, policy: ScorerPolicy) -> dict[str, float]:
    """The greedy policy on the validation seeds (never the held-out eval seeds)."""
    latencies = run_router(
        config, policy.to_router(), config.scenario.validation_seeds, config.scenario.eval_requests
    )
    return summarize_latencies(config, latencies)


def train(
    config: LearnConfig, resume: Literal["auto", "never"] = "auto", console: Console | None = None
) -> Path:
    """Train and export; returns the path of the exported policy file."""
    console = console or Console(stderr=True)
    out = Path(config.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    checkpoint = out / CHECKPOINT
    state = torch.load(checkpoint, weights_only=False) if resume == "auto" and checkpoint.is_file() else None
    torch.manual_seed(config.seed)
    torch.set_num_threads(1)  # tiny networks: threads only contend with the simulator
    spec = observation_spec(config)
    policy = ScorerPolicy(spec, config.ppo.hidden)
    metrics = MetricsLog(out, append=state is not None)
    try:
        if state is None:
            reference, best = _warm_start(config, policy, metrics, console)
            iteration = 0
        else:
            console.print(f"resuming from {checkpoint} at step {state['ppo']['step']}")
            reference, best, iteration = (
                ScorerPolicy(spec, config.ppo.hidden),
                state["best"],
                state["iteration"],
            )
        ppo = PPO(policy, RoutingEnv(config), config.ppo, reference=reference, seed=config.seed)
        if state is not None:
            ppo.load_state_dict(state["ppo"])
        with _progress(console, config.ppo.total_steps, ppo.step) as advance:
            while ppo.step < config.ppo.total_steps:
                with _timed() as elapsed:
                    row = ppo.iterate()
                row["iteration_s"] = elapsed()
                iteration += 1
                metrics.log("ppo", ppo.step, row)
                last = ppo.step >= config.ppo.total_steps
                if iteration % config.scenario.validate_every == 0 or last:
                    scores = validate(config, policy)
                    metrics.log("validation", ppo.step, scores)
                    if scores["e2e_p99"] < best["e2e_p99"]:
                        best = {**scores, "step": ppo.step, "weights": copy.deepcopy(policy.state_dict())}
                torch.save({"ppo": ppo.state_dict(), "best": best, "iteration": iteration}, checkpoint)
                advance(ppo.step, row.get("episode_return", float("nan")))
    finally:
        metrics.close()
    policy.load_state_dict(best["weights"])
    info = {"best_step": best["step"], "validation_e2e_p99": best["e2e_p99"], "preset": config.preset}
    path = save_learned_router(config.policy_file or out / POLICY, spec, policy.export_weights(), info)
    console.print(f"exported {path} (from step {best['step']}, validation p99 E2E {best['e2e_p99']:.2f} s)")
    return path


def _warm_start(
    config: LearnConfig, policy: ScorerPolicy, metrics: MetricsLog, console: Console
) -> tuple[ScorerPolicy, dict]:
    """Demonstrations and behaviour cloning; returns the frozen reference and the first best policy."""
    with console.status("collecting demonstrations"), _timed() as elapsed:
        demos = collect_demonstrations(config, seed=config.seed)
    metrics.log("demos", 0, {f"return_{k}": v for k, v in demos.mean_return.items()} | {"demos_s": elapsed()})
    kept = demos.best(config.bc.keep_best)
    with console.status("behaviour cloning"), _timed() as elapsed:
        for epoch, row in enumerate(behaviour_clone(policy, kept, config.bc, seed=config.seed)):
            metrics.log("bc", epoch, row)
    cloned = sorted({demos.names[k] for k in set(kept.demonstrator.tolist())})
    accuracy = imitation_accuracy(policy, kept)
    console.print(
        f"behaviour cloning: {len(kept.actions)} decisions of {', '.join(cloned)}, accuracy {accuracy:.3f}"
    )
    scores = validate(config, policy)
    metrics.log("validation", 0, scores | {"bc_s": elapsed()})
    best = {**scores, "step": 0, "weights": copy.deepcopy(policy.state_dict())}
    return copy.deepcopy(policy), best


@contextmanager
def _timed() -> Iterator:
    start = time.perf_counter()
    end: list[float] = []
    yield lambda: (end[0] if end else time.perf_counter()) - start
    end.append(time.perf_counter())


@contextmanager
def _progress(console: Console, total: int, done: int) -> Iterator:
    """A progress bar on a terminal; elsewhere, a line per PPO iteration."""
    if not sys.stderr.isatty():
        yield lambda step, ret: console.print(f"PPO step {step}/{total}, episode return {ret:.3f}")
        return
    with Progress(
        TextColumn("PPO"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("steps  return {task.fields[ret]}"),
        TimeElapsedColumn(),
        console=console,
    ) as progress:
        task = progress.add_task("ppo", total=total, completed=done, ret="-")
        yield lambda step, ret: progress.update(task, completed=step, ret=f"{ret:.2f}")
