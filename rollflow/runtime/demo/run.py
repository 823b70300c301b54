"""One demo run: launch, train while an engine is preempted and replaced, then report.

    summary = run_demo(load_demo_config("examples/demo/preemption.yaml"), Path("outputs/demo"))

Writes summary.json and timeline.png to the output folder; the trainer's own metrics.csv,
weights and checkpoints go to train.output_dir, and every process's log to launch.work_dir.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from rollflow.errors import UserError
from rollflow.runtime.demo.config import DemoFile
from rollflow.runtime.demo.preemption import Preemptor
from rollflow.runtime.demo.timeline import EngineSampler, Timeline, plot_timeline
from rollflow.runtime.launch.launcher import Launcher
from rollflow.runtime.trainer.metrics import StepMetrics
from rollflow.runtime.weights.token import TOKEN_ENV as WEIGHTS_TOKEN_ENV


@dataclass(frozen=True)
class DemoSummary:
    steps: int
    samples: int  # trained on
    tokens_generated: int  # every token the manager received from an engine
    tokens_trained: int  # output tokens of the samples trained on
    tokens_regenerated: int  # generated twice because an attempt was thrown away (0 when resuming)
    resumes: int  # times a sample moved to another engine, for any reason
    samples_resumed: int  # samples trained on that moved at least once
    engines_preempted: int
    engines_joined: int
    reward_first_step: float
    reward_last_step: float
    startup_s: float  # manager, weight server and engines up
    rollout_wait_s: float  # trainer blocked on micro-batches
    train_s: float
    update_weights_s: float
    total_s: float


def run_demo(config: DemoFile, output_dir: Path, tty: bool = False) -> DemoSummary:
    """Run the demo; raises UserError (with the failing process's log tail) if a part fails."""
    from rollflow.runtime.trainer.checkpoints import clear_outputs
    from rollflow.runtime.trainer.loop import Trainer
    from rollflow.runtime.trainer.progress import show_progress

    prepare_model(config)
    clear_outputs(Path(config.train.output_dir))  # the demo always starts from the initial model
    output_dir.mkdir(parents=True, exist_ok=True)
    timeline = Timeline()
    steps: list[StepMetrics] = []
    with Launcher(config.launch) as launch:
        startup_s = timeline.now()
        if launch.weights_token is not None:
            # the trainer runs in this process and publishes each version with the launch's token
            os.environ[WEIGHTS_TOKEN_ENV] = launch.weights_token
        train_config = config.train.model_copy(
            update={
                "manager_url": launch.manager_url,
                "manager_token": config.launch.manager.token,
                "weights_url": launch.weights_url,
            }
        )
        trainer = Trainer(train_config, resume=False)
        sampler = EngineSampler(launch.manager, timeline, config.demo.poll_interval_s)
        preemptor = Preemptor(
            launch,
            config.launch.engines[config.preempted_pool],
            config.demo.preemption,
            lambda: trainer.step + 1,
            timeline,
        )
        sampler.start()
        preemptor.start()
        try:
            with show_progress(train_config.steps, 0, tty) as show:

                def on_step(metrics: StepMetrics) -> None:
                    steps.append(metrics)
                    timeline.event("step", f"step {metrics.step}", value=metrics.reward_mean)
                    show(metrics)

                trainer.run(on_step)
        finally:
            sampler.stop()
            preemptor.stop()
        if not preemptor.preempted:
            _warn_not_preempted(config)
        counters = launch.manager.metrics()
        summary = _summarize(
            steps, counters, len(preemptor.preempted), launch.num_joined, startup_s, timeline
        )
    (output_dir / "summary.json").write_text(json.dumps(dataclasses.asdict(summary), indent=2) + "\n")
    plot_timeline(timeline, output_dir / "timeline.png", _title(summary))
    return summary


def prepare_model(config: DemoFile) -> None:
    model = Path(config.train.model)
    if model.is_dir():
        return
    if not config.demo.build_model:
        raise UserError(
            f"config error: train.model: no checkpoint folder at {model} (and demo.build_model is off)"
        )
    from rollflow.runtime.engines.tiny_model import write_tiny_model

    print(f"building a tiny random model at {model}", file=sys.stderr, flush=True)
    write_tiny_model(model)


def _warn_not_preempted(config: DemoFile) -> None:
    """A step whose rollout is over before the engine made its tokens shows no preemption; say why
    rather than leave a summary with 0 preempted to be puzzled over."""
    preemption = config.demo.preemption
    print(
        f"note: no engine was preempted: the engine of launch.engines.{config.preempted_pool} never had "
        f"{preemption.after_tokens} tokens of step {preemption.step} while samples were still running "
        "(its share of the step was too short to catch); raise train.max_new_tokens or lower "
        "demo.preemption.after_tokens",
        file=sys.stderr,
        flush=True,
    )


def _summarize(
    steps: list[StepMetrics],
    counters: dict[str, float],
    preempted: int,
    joined: int,
    startup_s: float,
    timeline: Timeline,
) -> DemoSummary:
    return DemoSummary(
        steps=len(steps),
        samples=sum(m.samples for m in steps),
        tokens_generated=int(counters.get("rollflow_generated_tokens_total", 0)),
        tokens_trained=sum(m.tokens for m in steps),
        tokens_regenerated=int(counters.get("rollflow_regenerated_tokens_total", 0)),
        resumes=int(counters.get("rollflow_resumed_samples_total", 0)),
        samples_resumed=sum(m.samples_resumed for m in steps),
        engines_preempted=preempted,
        engines_joined=joined,
        reward_first_step=steps[0].reward_mean,
        reward_last_step=steps[-1].reward_mean,
        startup_s=round(startup_s, 2),
        rollout_wait_s=round(sum(m.rollout_wait_s for m in steps), 2),
        train_s=round(sum(m.train_s for m in steps), 2),
        update_weights_s=round(sum(m.update_weights_s for m in steps), 2),
        total_s=round(timeline.now(), 2),
    )


def _title(summary: DemoSummary) -> str:
    return (
        f"{summary.steps} GRPO steps, {summary.engines_preempted} engine preempted, {summary.engines_joined} joined: "
        f"{summary.resumes} resumes, {summary.tokens_regenerated} tokens regenerated; reward "
        f"{summary.reward_first_step:.2f} -> {summary.reward_last_step:.2f}"
    )


def print_summary(summary: DemoSummary, output_dir: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="rollflow demo: RL training through a spot preemption", show_header=False)
    table.add_column("figure")
    table.add_column("value", justify="right")
    rows = [
        ("training steps", f"{summary.steps}"),
        ("samples trained on", f"{summary.samples:,}"),
        ("tokens generated", f"{summary.tokens_generated:,}"),
        ("tokens trained on", f"{summary.tokens_trained:,}"),
        ("tokens regenerated", f"{summary.tokens_regenerated:,}"),
        ("sample resumes (another engine took over)", f"{summary.resumes}"),
        ("engines preempted / joined", f"{summary.engines_preempted} / {summary.engines_joined}"),
        (
            "reward, first step -> last step",
            f"{summary.reward_first_step:.3f} -> {summary.reward_last_step:.3f}",
        ),
        ("start-up (manager, weight server, engines)", f"{summary.startup_s:.1f} s"),
        ("trainer waiting on rollouts", f"{summary.rollout_wait_s:.1f} s"),
        ("training (forward, backward, optimizer)", f"{summary.train_s:.1f} s"),
        ("weight updates (save, publish, engines load)", f"{summary.update_weights_s:.1f} s"),
        ("total", f"{summary.total_s:.1f} s"),
    ]
    for figure, value in rows:
        table.add_row(figure, value)
    console = Console()
    console.print(table)
    console.print(f"wrote {output_dir / 'summary.json'} and {output_dir / 'timeline.png'}")
