"""Stage 1: `rollflow profile ops` for Llama-2-7B's layer at the shapes Vidur's public H100 table covers
(mlp.csv: every per-token operator at tensor-parallel sizes 1, 2, 4 and 8), side by side with Vidur's
figures at each (tokens, tensor-parallel size) both tables hold.

Vidur timed vLLM's fused kernels (RMSNorm, SiLU-and-mul, rotary embedding) where rollflow times torch's
operators, so the small operators may differ by more than the matrix products, which both leave to
cuBLAS; the layer's total (the ten operators added up) is what the simulator charges per layer."""

from __future__ import annotations

import csv
import json
import re
import statistics
from pathlib import Path

from benchmarks.gpu.common import Budget, Settings, StageFailed
from benchmarks.results import Results
from rollflow.perf.profile.operators import MLP_OPS

# Llama-2-7B as Vidur's tables describe it (their vocabulary column is 32768)
LLAMA2_7B = {
    "architectures": ["LlamaForCausalLM"],
    "_name_or_path": "meta-llama/Llama-2-7b-hf",
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "num_hidden_layers": 32,
    "vocab_size": 32768,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
}
VIDUR_TABLE = Path("profiling/compute/h100/meta-llama/Llama-2-7b-hf/mlp.csv")
SHOWN_TOKENS = (1, 8, 64, 512, 2048, 4096)  # the rows printed and tabled, where both tables have them
# The band a faithful profile's layer time falls in against Vidur's on an H100 (judged on a GPU only):
# the GPU generation (H100 SXM or PCIe, H200), clocks and the libraries differ from Vidur's run.
LAYER_RATIO_BAND = (0.5, 2.0)


def vidur_commit(vidur_data: Path) -> str | None:
    """The Vidur commit its README says the tables were copied from, None when the table is absent."""
    if not (vidur_data / VIDUR_TABLE).is_file():
        return None
    found = re.search(r"commit ([0-9a-f]{40})", (vidur_data / "README.md").read_text())
    return f"microsoft/vidur@{found.group(1)[:12]} (public H100 table)" if found else "public H100 table"


def read_medians(path: Path) -> dict[tuple[int, int], dict[str, float]]:
    """(num_tokens, tensor-parallel size) -> operator -> median ms, from a Vidur-format mlp.csv."""
    with path.open(newline="") as handle:
        return {
            (int(row["num_tokens"]), int(row["num_tensor_parallel_workers"])): {
                op: float(row[f"time_stats.{op}.median"]) for op in MLP_OPS
            }
            for row in csv.DictReader(handle)
        }


def run(settings: Settings, work: Path, vidur_data: Path, budget: Budget, results: Results) -> None:
    results.peers["vidur"] = vidur_commit(vidur_data)
    if results.peers["vidur"] is None:
        raise StageFailed(f"Vidur's table is not at {vidur_data / VIDUR_TABLE} (see --vidur-data)")
    config = work / "llama2-7b" / "config.json"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(json.dumps(LLAMA2_7B))
    out = work / "ops"
    budget.rollflow(
        "profile", "ops", "--model-config", str(config), "--device", settings.device, "--out", str(out),
        *settings.ops_args,
    )  # fmt: skip
    ours, theirs = read_medians(out / "mlp.csv"), read_medians(vidur_data / VIDUR_TABLE)
    both = sorted(set(ours) & set(theirs), key=lambda point: (point[1], point[0]))
    if not both:
        raise StageFailed("the profile and Vidur's table share no (tokens, tensor-parallel size)")
    ratios = {op: [ours[p][op] / theirs[p][op] for p in both] for op in MLP_OPS}
    layer = [sum(ours[p].values()) / sum(theirs[p].values()) for p in both]
    results.figures["points_profiled"] = len(ours)
    results.figures["points_compared"] = len(both)
    results.figures["median_ratio_rollflow_over_vidur"] = {
        "layer": statistics.median(layer),
        **{op: statistics.median(values) for op, values in ratios.items()},
    }
    rows = [
        [tp, tokens, round(sum(ours[p].values()), 4), round(sum(theirs[p].values()), 4),
         round(sum(ours[p].values()) / sum(theirs[p].values()), 3),
         round(ours[p]["mlp_up_proj"], 4), round(theirs[p]["mlp_up_proj"], 4)]
        for p in both
        for tokens, tp in [p]
        if tokens in SHOWN_TOKENS
    ]  # fmt: skip
    columns = ["tp", "tokens", "layer ms (rollflow)", "layer ms (Vidur)", "ratio", "up_proj ms (rollflow)",
               "up_proj ms (Vidur)"]  # fmt: skip
    results.table("Llama-2-7B layer, rollflow profile ops vs Vidur's H100 table (median ms)", columns, rows)
    print("  " + " | ".join(columns))
    for row in rows:
        print("  " + " | ".join(str(cell) for cell in row))
    print("  median rollflow/Vidur per operator over every shared point: "
          + ", ".join(f"{op} {statistics.median(v):.2f}" for op, v in ratios.items()))  # fmt: skip
    results.goal("profiled points found in Vidur's table", len(both), ">=", len(ours))
    if settings.device.startswith("cuda"):
        median = statistics.median(layer)
        results.goal("layer time rollflow/Vidur, median over points", median, ">=", LAYER_RATIO_BAND[0])
        results.goal("layer time rollflow/Vidur, median over points", median, "<=", LAYER_RATIO_BAND[1])
