"""`rollflow demo run --config examples/demo/dynamic.yaml`: real manager, weight server, engines,
inference worker and elastic actor on 127.0.0.1, with RLinf's auto scheduler moving device slots
within each step. The same config run static learns the same weights: no token regenerated, every
generated token trained once, pre_process and wait_before_last_iter both in the move log.

The runs use a learning rate of 3e-6: Adam turns the float noise of summing gradients over 1, 2 or 4
ranks into steps of up to about lr on weights whose gradient is near zero, so at the demo's 1e-3 the
weights of two runs drift apart by up to a few lr while their samples and rewards stay identical;
at 3e-6 three steps move weights by several times the tolerance and the runs agree within it."""

from __future__ import annotations

import json
from pathlib import Path

from safetensors.torch import load_file

from tests.runtime.demo.helpers import demo, dynamic_config

NUM_MINIBATCHES = 4
LR = 3e-6
TOLERANCE = 1e-5


def _run(tmp_path: Path, model: Path, auto_scheduler: bool) -> tuple[dict, Path]:
    out = tmp_path / ("dynamic" if auto_scheduler else "static")
    config = dynamic_config(tmp_path, model, auto_scheduler, lr=LR)
    done = demo("run", "--config", str(config), "--output-dir", str(out), timeout=400)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads((out / "summary.json").read_text()), out


def _final_weights(out: Path) -> dict:
    folder = max((out / "train" / "weights").iterdir(), key=lambda p: int(p.name[1:]))
    assert folder.name == "v3"
    return load_file(folder / "model.safetensors")


def test_dynamic_run_moves_devices_and_learns_what_the_static_run_learns(tmp_path, tiny_model):
    dynamic, dynamic_out = _run(tmp_path, tiny_model, auto_scheduler=True)
    static, static_out = _run(tmp_path, tiny_model, auto_scheduler=False)

    assert len(dynamic["steps"]) == len(static["steps"]) == 3
    for step in dynamic["steps"]:
        assert len(step["actor_sizes"]) == NUM_MINIBATCHES
        assert step["tokens_regenerated"] == 0
        assert step["tokens_generated"] == step["tokens_trained"] > 0  # every token trained once
        assert all(m["ok"] for m in step["moves"]), step["moves"]
        assert all(m["seconds"] >= 0 for m in step["moves"])
    kinds = {m["kind"] for step in dynamic["steps"] for m in step["moves"]}
    assert {"pre_process", "wait_before_last_iter", "release_inference", "resume_engine"} <= kinds, kinds
    assert any(size > 1 for step in dynamic["steps"] for size in step["actor_sizes"])
    assert all(step["engines_released"] for step in dynamic["steps"])
    assert all(step["actor_sizes"] == [1] * NUM_MINIBATCHES for step in static["steps"])
    assert all(not step["moves"] for step in static["steps"])
    assert [s["tokens_trained"] for s in dynamic["steps"]] == [s["tokens_trained"] for s in static["steps"]]

    moved, fixed = _final_weights(dynamic_out), _final_weights(static_out)
    initial = load_file(tiny_model / "model.safetensors")
    assert moved.keys() == fixed.keys() == initial.keys()
    assert max((fixed[n] - initial[n]).abs().max().item() for n in initial) > 2 * TOLERANCE  # it learned
    for name, tensor in moved.items():
        assert (tensor - fixed[name]).abs().max().item() <= TOLERANCE, name
    assert (dynamic_out / "gantt.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
