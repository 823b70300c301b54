"""Static against dynamic scheduling on live device slots, and what `rollflow rl-sim` predicts for both.

Runs examples/demo/dynamic.yaml twice (cluster.auto_scheduler false, then true) on 127.0.0.1: manager,
weight server, built-in engines and the elastic actor, one process per device slot. Prints each
run's step times and the dynamic run's moves (kind, count, mean and max seconds; RLinf reports GPU
switches within 1 s, DynaRL 0.5-5 s per reallocation). Then profiles one built-in engine
(`rollflow profile engine`) and simulates the same `cluster:` section with `rollflow rl-sim`, its
phase costs taken from the static run (seconds per mini-batch of training, the reference forward
pass at the same FLOP rate, seconds per weight sync, per actor growth from the dynamic run's moves),
so simulated and live step times sit side by side.

    .venv/bin/python benchmarks/dynamic_live.py
    .venv/bin/python benchmarks/dynamic_live.py --steps 4 --output-dir outputs/bench/dynamic_live
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from rollflow.config import validate_config
from rollflow.perf.profile.hf_config import load_model_config, model_shape_section
from rollflow.runtime.demo.config import load_demo_config
from rollflow.runtime.demo.dynamic import check_dynamic, run_dynamic_demo
from rollflow.runtime.engines.tiny_model import write_tiny_model
from rollflow.sim.rl.config import RLSimConfig
from rollflow.sim.rl.costs import StepCosts
from rollflow.sim.rl.runner import simulate_steps

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "demo" / "dynamic.yaml"


def live_run(out: Path, auto_scheduler: bool, steps: int) -> dict:
    overrides = [f"cluster.auto_scheduler={str(auto_scheduler).lower()}", f"train.steps={steps}"]
    config = load_demo_config(EXAMPLE, overrides, str(out))
    check_dynamic(config)
    return run_dynamic_demo(config, out)


def profile_engine(model: Path, out: Path) -> Path:
    """A built-in engine's iteration times as Vidur-format tables (what rl-sim's rollout reads)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    port = 30000 + os.getpid() % 20000
    cli = [sys.executable, "-m", "rollflow.cli"]
    engine = subprocess.Popen(
        [*cli, "engine", "serve", "--model", str(model), "--port", str(port), "--threads", "1"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        tables = out / "profile"
        subprocess.run(
            [
                *cli,
                "profile",
                "engine",
                "--url",
                f"http://127.0.0.1:{port}",
                "--kind",
                "builtin",
                "--model-config",
                str(model / "config.json"),
                "--out",
                str(tables),
                "--batch-sizes",
                "1,2,4,8",
                "--prompt-lengths",
                "16,64",
                "--decode-tokens",
                "16",
            ],
            env=env,
            check=True,
            capture_output=True,
        )
        return tables
    finally:
        engine.terminate()
        engine.wait()


def simulated(config, static: dict, dynamic: dict, tables: Path, auto_scheduler: bool) -> list[float]:
    """rl-sim's step times for the live config, with phase costs measured in the live runs."""
    train, cluster = config.train, config.cluster
    num_minibatches = train.prompts_per_step // (train.micro_batch_groups * train.mini_batch_micro_batches)
    steps = static["steps"]
    samples = train.prompts_per_step * train.n_samples
    output_tokens = statistics.mean(s["tokens_trained"] for s in steps) / samples
    train_s = statistics.mean(s["train_s"] for s in steps) / num_minibatches  # one mini-batch, one slot
    sync_s = statistics.mean(s["update_weights_s"] for s in steps)
    grows = [
        m
        for s in dynamic["steps"]
        for m in s["moves"]
        if m["kind"] in ("grow_actor", "wait_before_last_iter")
    ]
    raw = {
        "steps": len(steps),
        "model": "tiny",
        "model_shape": model_shape_section(load_model_config(train.model)),
        "cluster": cluster.model_dump() | {"auto_scheduler": auto_scheduler},
        "workload": {
            "num_prompts": train.prompts_per_step,
            "samples_per_prompt": train.n_samples,
            "prompt_tokens": 8,
            "output_median_tokens": max(1, round(output_tokens)),
            "output_sigma": 0.3,
            "max_new_tokens": train.max_new_tokens,
        },
        "rollout": {
            "scheduler": {"kind": "sarathi", "chunk_size": 256, "batch_size_cap": 8},
            "execution": {
                "kind": "tables",
                "compute_table": str(tables / "mlp.csv"),
                "attention_table": str(tables / "attention.csv"),
                "max_batch_size": 8,
            },
        },
        "training": {"num_minibatches": num_minibatches, "optimizer_step_s": 0.0},
        "inference": {"num_models": 1 if "inference" in cluster.component_placement else 0},
        "weight_sync": {"fixed_s": sync_s, "link_gb_per_s": 1e6},
        "output": {"progress": False, "gantt": False, "chrome_trace": False},
    }
    sim = validate_config(RLSimConfig, raw)
    costs = StepCosts.from_config(sim)
    tokens = samples * output_tokens / num_minibatches
    mfu = costs.train_flops_per_token_param * costs.num_params * tokens / (costs.peak_flops_per_gpu * train_s)
    raw["training"]["mfu"] = min(1.0, mfu)
    raw["inference"]["mfu"] = min(1.0, mfu)  # a reference forward pass: a third of a training pass's FLOPs
    if grows:
        per_grow = statistics.mean(m["seconds"] for m in grows)
        raw["training"]["reshard_gb_per_s"] = 16.0 * costs.num_params / (2 * per_grow * 1e9)
    return [round(step.step_time_s, 2) for step in simulate_steps(validate_config(RLSimConfig, raw))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--output-dir", default="outputs/bench/dynamic_live")
    args = parser.parse_args()
    out = Path(args.output_dir)
    config = load_demo_config(EXAMPLE, [f"train.steps={args.steps}"], str(out))
    if not Path(config.train.model).is_dir():
        write_tiny_model(Path(config.train.model))
    static = live_run(out / "static", False, args.steps)
    dynamic = live_run(out / "dynamic", True, args.steps)
    tables = profile_engine(Path(config.train.model), out)
    predicted = {
        "static": simulated(config, static, dynamic, tables, False),
        "dynamic": simulated(config, static, dynamic, tables, True),
    }
    live = {"static": static["step_time_s"], "dynamic": dynamic["step_time_s"]}
    print(f"{'run':<8} {'live step times (s)':<28} {'rl-sim predicts (s)':<28} live static/dynamic")
    for name in ("static", "dynamic"):
        ratio = statistics.mean(live["static"]) / statistics.mean(live[name])
        print(f"{name:<8} {live[name]!s:<28} {predicted[name]!s:<28} {ratio:.2f}x")
    moves: dict[str, list[float]] = {}
    for step in dynamic["steps"]:
        for move in step["moves"]:
            moves.setdefault(move["kind"], []).append(move["seconds"])
    print(f"\n{'move':<24} {'count':>5} {'mean s':>8} {'max s':>8}")
    for kind, seconds in sorted(moves.items()):
        print(f"{kind:<24} {len(seconds):>5} {statistics.mean(seconds):>8.3f} {max(seconds):>8.3f}")
    (out / "dynamic_live.json").write_text(
        json.dumps({"live": live, "rl_sim": predicted, "moves": moves}, indent=2)
    )


if __name__ == "__main__":
    main()
