"""`rollflow sim from-vidur -- <flags>`: run the simulation a `python -m vidur.main` command line describes.

Flags are translated into a `SimConfig`, starting from Vidur's own defaults (sarathi
scheduler, a synthetic workload of 128 fixed-length requests at 0.5 QPS, profile tables under
`./data/profiling/...` of the current directory). Flags that only tune Vidur's random-forest
training or its wandb/plot bookkeeping are accepted and have no effect, since rollflow
interpolates the tables instead; any other flag rollflow cannot honour is an error naming it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from rollflow.config import ConfigError, validate_config
from rollflow.perf.tables import ATTENTION_FROM_ROOFLINE
from rollflow.sim.config import SimConfig

VIDUR_DEFAULTS: dict[str, Any] = {
    "scheduler": "sarathi",
    "request_generator": "synthetic",
    "length_generator": "fixed",
    "interval_generator": "poisson",
    "qps": 0.5,
    "num_requests": 128,
    "trace_file": "data/processed_traces/splitwise_conv.csv",
    "output_dir": "simulator_output",
}

# Flags that shape only Vidur's predictor training or its logging: no effect on the simulation.
# Vidur's Poisson generator clips every gap at 3 mean gaps (see PoissonIntervals.max_gap_factor).
VIDUR_MAX_GAP_FACTOR = 3.0
VIDUR_ATTENTION_TABLE = "./data/profiling/compute/{DEVICE}/{MODEL}/attention.csv"
NO_EFFECT_SUFFIXES = (
    "k_fold_cv_splits",
    "no_cache",
    "num_training_job_threads",
    "num_estimators",
    "max_depth",
    "min_samples_split",
    "polynomial_degree",
    "polynomial_include_bias",
    "polynomial_interaction_only",
    "fit_intercept",
    "cpu_overhead_input_file",
    "prediction_max_prefill_chunk_size",
    "prediction_max_tokens_per_request",
)
NO_EFFECT_FLAGS = {
    "log_level",
    "metrics_config_write_metrics",
    "metrics_config_write_json_trace",
    "metrics_config_wandb_project",
    "metrics_config_wandb_group",
    "metrics_config_wandb_run_name",
    "metrics_config_wandb_sweep_id",
    "metrics_config_wandb_run_id",
    "metrics_config_save_table_to_wandb",
    "metrics_config_store_operation_metrics",
    "metrics_config_store_token_completion_metrics",
    "metrics_config_store_request_metrics",
    "metrics_config_store_batch_metrics",
    "metrics_config_store_utilization_metrics",
    "metrics_config_keep_individual_batch_metrics",
    "metrics_config_subsamples",
    "metrics_config_min_batch_index",
    "metrics_config_max_batch_index",
    "metrics_config_cache_dir",
}
PREDICTOR_PREFIXES = (
    "random_forrest_execution_time_predictor_config_",
    "linear_regression_execution_time_predictor_config_",
)
SCHEDULER_PREFIXES = {"vllm": "vllm", "sarathi": "sarathi", "orca": "orca"}
BOOLEAN_FLAGS = {
    "metrics_config_store_plots",
    "metrics_config_enable_chrome_trace",
    "zipf_request_length_generator_config_scramble",
    *NO_EFFECT_FLAGS,
} | {p + s for p in PREDICTOR_PREFIXES for s in ("no_cache", "skip_cpu_overhead_modeling")}


def parse_flags(argv: list[str]) -> dict[str, str]:
    """`--name value`, `--name=value`, `--name` / `--no-name` for booleans -> {name: value}."""
    flags: dict[str, str] = {}
    index = 0
    while index < len(argv):
        token = argv[index]
        if not token.startswith("--"):
            raise ConfigError(f"vidur flags: unexpected argument {token!r}")
        name, sep, value = token[2:].partition("=")
        if name.startswith("no-") and name[3:] in BOOLEAN_FLAGS:
            flags[name[3:]] = "false"
        elif (
            name in BOOLEAN_FLAGS and not sep and (index + 1 >= len(argv) or argv[index + 1].startswith("--"))
        ):
            flags[name] = "true"
        elif sep:
            flags[name] = value
        else:
            if index + 1 >= len(argv):
                raise ConfigError(f"vidur flags: --{name} needs a value")
            index += 1
            flags[name] = argv[index]
        index += 1
    return flags


def vidur_flags_to_config(argv: list[str], output_dir: str | None = None) -> SimConfig:
    flags = parse_flags(argv)
    raw: dict[str, Any] = {
        "cluster": {},
        "scheduler": {},
        "execution": {"kind": "tables"},
        "simulator": {},
        "output": {},
    }
    take = _Taker(flags)

    raw["seed"] = take.as_int("seed", 42)
    cluster = raw["cluster"]
    cluster["replicas"] = take.as_int("cluster_config_num_replicas", 1)
    cluster["model"] = take.as_str("replica_config_model_name", "meta-llama/Llama-2-7b-hf")
    cluster["device"] = take.as_str("replica_config_device", "a100")
    cluster["network_device"] = take.as_str("replica_config_network_device", "a100_pairwise_nvlink")
    cluster["tensor_parallel"] = take.as_int("replica_config_tensor_parallel_size", 1)
    cluster["pipeline_stages"] = take.as_int("replica_config_num_pipeline_stages", 1)
    cluster["memory_margin_fraction"] = take.as_float("replica_config_memory_margin_fraction", 0.1)
    cluster["router"] = take.choice(
        "global_scheduler_config_type",
        {"round_robin": "round_robin", "random": "random", "lor": "lor"},
        "round_robin",
    )

    kind = take.choice("replica_scheduler_config_type", SCHEDULER_PREFIXES, VIDUR_DEFAULTS["scheduler"])
    scheduler = raw["scheduler"]
    scheduler["kind"] = kind
    prefix = f"{kind}_scheduler_config_"
    scheduler["batch_size_cap"] = take.as_int(prefix + "batch_size_cap", 128)
    scheduler["block_size"] = take.as_int(prefix + "block_size", 16)
    scheduler["watermark_blocks_fraction"] = take.as_float(prefix + "watermark_blocks_fraction", 0.01)
    scheduler["num_blocks"] = take.optional_int(prefix + "num_blocks")
    if kind == "vllm":
        scheduler["max_tokens_in_batch"] = take.as_int("vllm_scheduler_config_max_tokens_in_batch", 4096)
    if kind == "sarathi":
        scheduler["chunk_size"] = take.as_int("sarathi_scheduler_config_chunk_size", 512)

    raw["workload"] = _workload(take)
    for name in ("synthetic_request_generator_config_seed", "trace_request_generator_config_seed"):
        seed = take.optional_int(name)
        if seed is not None:
            raw["seed"] = seed
    raw["execution"].update(_execution(take, cluster))

    time_limit = take.as_float("time_limit", 0.0)
    if time_limit > 0:
        raw["simulator"]["time_limit_s"] = time_limit
    raw["output"]["dir"] = output_dir or take.as_str(
        "metrics_config_output_dir", VIDUR_DEFAULTS["output_dir"]
    )
    raw["output"]["plots"] = take.as_bool("metrics_config_store_plots", True)
    raw["output"]["chrome_trace"] = take.as_bool("metrics_config_enable_chrome_trace", True)

    for name in list(flags):
        if name in NO_EFFECT_FLAGS or any(
            name.startswith(p) and name.endswith(NO_EFFECT_SUFFIXES) for p in PREDICTOR_PREFIXES
        ):
            take.consume(name)
    take.reject_leftovers()
    return validate_config(SimConfig, _drop_none(raw))


def _workload(take: _Taker) -> dict[str, Any]:
    generator = take.choice(
        "request_generator_config_type",
        {"synthetic": "synthetic", "trace_replay": "trace_replay"},
        VIDUR_DEFAULTS["request_generator"],
    )
    if generator == "trace_replay":
        return {
            "kind": "trace",
            "file": take.as_str("trace_request_generator_config_trace_file", VIDUR_DEFAULTS["trace_file"]),
            "time_scale": take.as_float("trace_request_generator_config_time_scale_factor", 1.0),
            "prefill_scale": take.as_float("trace_request_generator_config_prefill_scale_factor", 1.0),
            "decode_scale": take.as_float("trace_request_generator_config_decode_scale_factor", 1.0),
            "max_tokens": take.as_int("trace_request_generator_config_max_tokens", 4096),
        }
    workload: dict[str, Any] = {
        "kind": "synthetic",
        "num_requests": take.optional_int("synthetic_request_generator_config_num_requests")
        or VIDUR_DEFAULTS["num_requests"],
    }
    duration = take.optional_float("synthetic_request_generator_config_duration")
    if duration is not None:
        workload["duration_s"] = duration
    lengths = take.choice(
        "length_generator_config_type",
        {"trace": "trace", "uniform": "uniform", "zipf": "zipf", "fixed": "fixed"},
        VIDUR_DEFAULTS["length_generator"],
    )
    prefix = f"{lengths}_request_length_generator_config_"
    workload["max_tokens"] = take.as_int(prefix + "max_tokens", 4096)
    if lengths == "trace":
        workload["lengths"] = {
            "kind": "trace",
            "file": take.as_str(
                prefix + "trace_file", "data/processed_traces/sharegpt_8k_filtered_stats_llama2_tokenizer.csv"
            ),
            "prefill_scale": take.as_float(prefix + "prefill_scale_factor", 1.0),
            "decode_scale": take.as_float(prefix + "decode_scale_factor", 1.0),
        }
    elif lengths == "fixed":
        workload["lengths"] = {
            "kind": "fixed",
            "prefill_tokens": take.as_int(prefix + "prefill_tokens", 2048),
            "decode_tokens": take.as_int(prefix + "decode_tokens", 512),
        }
    else:
        workload["lengths"] = {
            "kind": lengths,
            "min_tokens": take.as_int(prefix + "min_tokens", 1024),
            "prefill_to_decode_ratio": take.as_float(prefix + "prefill_to_decode_ratio", 20.0),
        }
        if lengths == "zipf":
            workload["lengths"]["theta"] = take.as_float(prefix + "theta", 0.6)
            if take.as_bool(prefix + "scramble", False):
                raise ConfigError(
                    "vidur flags: --zipf_request_length_generator_config_scramble is not supported"
                )
    intervals = take.choice(
        "interval_generator_config_type",
        {"poisson": "poisson", "gamma": "gamma", "static": "static"},
        VIDUR_DEFAULTS["interval_generator"],
    )
    prefix = f"{intervals}_request_interval_generator_config_"
    if intervals == "poisson":
        workload["intervals"] = {
            "kind": "poisson",
            "qps": take.as_float(prefix + "qps", VIDUR_DEFAULTS["qps"]),
            "max_gap_factor": VIDUR_MAX_GAP_FACTOR,
        }
    elif intervals == "gamma":
        workload["intervals"] = {
            "kind": "gamma",
            "qps": take.as_float(prefix + "qps", 0.2),
            "cv": take.as_float(prefix + "cv", 0.5),
        }
    else:
        workload["intervals"] = {"kind": "static"}
    if lengths in ("trace", "fixed") and intervals in ("poisson", "static") and duration is None:
        workload["rng"] = "vidur"  # the very requests Vidur draws for the seed
    return workload


def _execution(take: _Taker, cluster: dict[str, Any]) -> dict[str, Any]:
    predictor = take.choice(
        "execution_time_predictor_config_type",
        {"random_forrest": "random_forrest", "linear_regression": "linear_regression"},
        "random_forrest",
    )
    prefix = f"{predictor}_execution_time_predictor_config_"
    if not take.as_bool(prefix + "skip_cpu_overhead_modeling", True):
        raise ConfigError(
            f"vidur flags: --no-{prefix}skip_cpu_overhead_modeling (CPU overhead model) is not supported"
        )
    return {
        "compute_table": take.as_str(
            prefix + "compute_input_file", "./data/profiling/compute/{DEVICE}/{MODEL}/mlp.csv"
        ),
        "attention_table": take.as_str(prefix + "attention_input_file", _default_attention_table(cluster)),
        "all_reduce_table": take.as_str(
            prefix + "all_reduce_input_file", "./data/profiling/network/{NETWORK_DEVICE}/all_reduce.csv"
        ),
        "send_recv_table": take.as_str(
            prefix + "send_recv_input_file", "./data/profiling/network/{NETWORK_DEVICE}/send_recv.csv"
        ),
        "kv_cache_granularity": take.as_int(prefix + "kv_cache_prediction_granularity", 64),
        "max_batch_size": take.as_int(prefix + "prediction_max_batch_size", 128),
        "attention_decode_overhead_fraction": take.as_float(
            prefix + "attention_decode_batching_overhead_fraction", 0.1
        ),
        "attention_prefill_overhead_fraction": take.as_float(
            prefix + "attention_prefill_batching_overhead_fraction", 0.1
        ),
        "nccl_cpu_launch_overhead_ms": take.as_float(prefix + "nccl_cpu_launch_overhead_ms", 0.02),
        "nccl_cpu_skew_overhead_per_device_ms": take.as_float(
            prefix + "nccl_cpu_skew_overhead_per_device_ms", 0.0
        ),
    }


def _default_attention_table(cluster: dict[str, Any]) -> str:
    """Vidur's default attention path where that file exists, else attention from the roofline.

    Vidur's public data ships MLP and network tables but no attention tables, so Vidur itself stops
    there; rollflow runs on, and the summary's execution_model says where attention came from.
    """
    path = VIDUR_ATTENTION_TABLE.replace("{DEVICE}", cluster["device"]).replace("{MODEL}", cluster["model"])
    return VIDUR_ATTENTION_TABLE if Path(path).is_file() else ATTENTION_FROM_ROOFLINE


class _Taker:
    """Reads flags by name with a default, remembering which ones were used."""

    def __init__(self, flags: dict[str, str]) -> None:
        self._flags = flags
        self._used: set[str] = set()

    def consume(self, name: str) -> str | None:
        self._used.add(name)
        return self._flags.get(name)

    def _convert(self, name: str, default: Any, convert: Callable[[str], Any]) -> Any:
        value = self.consume(name)
        if value is None:
            return default
        try:
            return convert(value)
        except ValueError:
            raise ConfigError(f"vidur flags: --{name}: cannot read {value!r} as {convert.__name__}") from None

    def as_str(self, name: str, default: str) -> str:
        return self._convert(name, default, str)

    def as_int(self, name: str, default: int) -> int:
        return self._convert(name, default, int)

    def as_float(self, name: str, default: float) -> float:
        return self._convert(name, default, float)

    def optional_int(self, name: str) -> int | None:
        return self._convert(name, None, int)

    def optional_float(self, name: str) -> float | None:
        return self._convert(name, None, float)

    def as_bool(self, name: str, default: bool) -> bool:
        return self._convert(name, default, boolean)

    def choice(self, name: str, options: dict[str, str], default: str) -> str:
        value = self.as_str(name, default)
        if value not in options:
            raise ConfigError(
                f"vidur flags: --{name} {value} is not supported; rollflow supports: {', '.join(options)}"
            )
        return options[value]

    def reject_leftovers(self) -> None:
        unknown = [name for name in self._flags if name not in self._used]
        if unknown:
            raise ConfigError(
                "vidur flags not supported by rollflow (or not applicable to the chosen types): "
                + ", ".join(f"--{name}" for name in unknown)
            )


def boolean(value: str) -> bool:
    """true/false as Vidur's BooleanOptionalAction flags and YAML users write them."""
    lowered = value.strip().lower()
    if lowered in {"true", "1", "yes"}:
        return True
    if lowered in {"false", "0", "no"}:
        return False
    raise ValueError(value)


def _drop_none(raw: dict[str, Any]) -> dict[str, Any]:
    return {k: _drop_none(v) if isinstance(v, dict) else v for k, v in raw.items() if v is not None}
