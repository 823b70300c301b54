"""rollflow on one GPU, in one run of at most 8 minutes that needs nothing from outside (`make bench-gpu`).

    python benchmarks/gpu/run.py [--device cuda] [--results-dir benchmarks/results/gpu]
    python benchmarks/gpu/run.py --device cpu --small     # the same run on a CPU, tiny, in a minute or two

Four stages, each with a time budget, each writing its results file (benchmarks/results.py) into
the results folder; a stage that fails or runs out of time is recorded as a missed goal in its file
and the next one still runs:

1. gpu_profile_ops: `rollflow profile ops` on Llama-2-7B's layer at the shapes of Vidur's public
   H100 table, side by side with it (ops_vs_vidur.py).
2. gpu_engine_vs_sim: the built-in engine on the device with a Llama-shaped model of random weights
   (about 1B parameters, bfloat16, made at run time), profiled, then a trace replayed against it at
   two loads and simulated with `rollflow sim serve` (engine_vs_sim.py).
3. gpu_manager: the rollout manager in front of two such engines against the engines directly:
   tokens/s, the manager's CPU per token (manager_tokens.py).
4. gpu_trainer_step: one `rollflow train` step on the device, its weights pushed to the engines
   (trainer_step.py).

Vidur's data (the H100 table and the Splitwise trace) is read from --vidur-data: by default
shared/data/vidur in the repository or beside it (../shared/data/vidur), else the copy that
`make gpu-wheels` puts in dist/gpu-wheels/vidur (what a GPU machine has). Goals that
compare with a GPU's figures are judged on cuda only; on a CPU the run checks every stage end to end.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import rollflow  # noqa: F401 - the installed one (make bench-gpu's wheel), before the checkout's

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # for benchmarks/ and tests/

from benchmarks.gpu import engine_vs_sim, manager_tokens, ops_vs_vidur, trainer_step
from benchmarks.gpu.common import Budget, Fleet, StageFailed, device_figures, num_parameters, settings
from benchmarks.results import DEFAULT_DIR, QUICK_DIR, Results
from rollflow.runtime.launch.servers import REPO

# Seconds each stage may take: 460 in all, which leaves the run's start and the results inside 8 minutes.
BUDGETS = {"profile ops": 100, "engine vs sim": 190, "manager": 50, "trainer step": 120}


def default_vidur_data() -> Path:
    """shared/data/vidur in or beside the repository, else the copy `make gpu-wheels` carries."""
    for folder in (REPO / "shared" / "data" / "vidur", REPO.parent / "shared" / "data" / "vidur"):
        if folder.is_dir():
            return folder
    return REPO / "dist" / "gpu-wheels" / "vidur"


class Run:
    """The stages in order, each timed, printed and recorded whatever becomes of it."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.started = time.monotonic()
        self.results: list[Results] = []

    def stage(self, name: str, results: Results, body: Callable[[Budget], None]) -> None:
        budget = Budget(BUDGETS[name])
        print(
            f"[{time.monotonic() - self.started:5.0f} s] {name}: started (budget {budget.seconds} s)",
            flush=True,
        )
        stage_started = time.monotonic()
        results.figures["device"] = device_figures(self.args.device)
        try:
            body(budget)
            error = None
        except StageFailed as exc:
            error = str(exc)
        except Exception as exc:  # a stage's failure must not stop the next: it is recorded instead
            traceback.print_exc()
            error = f"{type(exc).__name__}: {exc}"
        took = time.monotonic() - stage_started
        results.figures["stage_s"] = took
        if error is not None:
            results.figures["error"] = error
        results.goal(f"stage finished within its {budget.seconds} s budget", float(error is None), "==", 1)
        state = "done" if error is None else f"FAILED: {error.splitlines()[0] if error else ''}"
        print(f"[{time.monotonic() - self.started:5.0f} s] {name}: {state} ({took:.0f} s)", flush=True)
        self.results.append(results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda (default), cuda:N or cpu")
    parser.add_argument(
        "--small", action="store_true", help="tiny model, few requests: the run checked on a CPU"
    )
    parser.add_argument(
        "--results-dir",
        type=Path,
        help="where the results files go (default benchmarks/results/gpu; with --small benchmarks/results/quick/gpu)",
    )
    parser.add_argument("--vidur-data", type=Path, default=None, help="Vidur's data folder (default: found)")
    parser.add_argument(
        "--work-dir", type=Path, help="models, tables and logs (default: a new temporary folder)"
    )
    args = parser.parse_args()
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit(f"--device {args.device}: torch {torch.__version__} sees no CUDA GPU here")
    results_dir = args.results_dir or (QUICK_DIR / "gpu" if args.small else DEFAULT_DIR / "gpu")
    vidur_data = args.vidur_data or default_vidur_data()
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="rollflow-gpu-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    run_settings = settings(args.device, args.small)
    run = Run(args)
    print(f"rollflow GPU benchmark on {device_figures(args.device)}; work folder {work}", flush=True)
    ops = Results("gpu_profile_ops", results_dir)
    run.stage(
        "profile ops", ops, lambda budget: ops_vs_vidur.run(run_settings, work, vidur_data, budget, ops)
    )
    fleet: list[Fleet] = []  # started by the engine stage, used by the two after it

    def engine_stage(budget: Budget, results: Results) -> None:
        model = work / "model"
        budget.rollflow("engine", "init-model", str(model), *run_settings.model_args)
        results.figures["model_parameters"] = num_parameters(model)
        fleet.append(Fleet(model, work, run_settings, budget))
        engine_vs_sim.run(run_settings, fleet[0], vidur_data, work, budget, results)

    def with_fleet(body: Callable[[Fleet, Budget], None]) -> Callable[[Budget], None]:
        def stage(budget: Budget) -> None:
            if not fleet:
                raise StageFailed("no engines: the engine stage did not start them")
            body(fleet[0], budget)

        return stage

    try:
        engine = Results("gpu_engine_vs_sim", results_dir)
        run.stage("engine vs sim", engine, lambda budget: engine_stage(budget, engine))
        manager = Results("gpu_manager", results_dir)
        run.stage(
            "manager",
            manager,
            with_fleet(lambda f, budget: manager_tokens.run(run_settings, f, budget, manager)),
        )
        trainer = Results("gpu_trainer_step", results_dir)
        run.stage(
            "trainer step",
            trainer,
            with_fleet(lambda f, budget: trainer_step.run(run_settings, f, work, budget, trainer)),
        )
    finally:
        for f in fleet:
            f.stop()
    print(f"\nall stages in {time.monotonic() - run.started:.0f} s; logs and tables in {work}")
    statuses = [results.finish() for results in run.results]  # every file written, then the verdict
    sys.exit(max(statuses))


if __name__ == "__main__":
    main()
