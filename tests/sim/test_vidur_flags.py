import pytest

from rollflow.config import ConfigError
from rollflow.sim.vidur_flags import vidur_flags_to_config

README_EXAMPLE = [
    "--replica_config_device",
    "a100",
    "--replica_config_model_name",
    "meta-llama/Meta-Llama-3-8B",
    "--cluster_config_num_replicas",
    "1",
    "--replica_config_tensor_parallel_size",
    "1",
    "--replica_config_num_pipeline_stages",
    "1",
    "--request_generator_config_type",
    "synthetic",
    "--synthetic_request_generator_config_num_requests",
    "512",
    "--length_generator_config_type",
    "trace",
    "--trace_request_length_generator_config_max_tokens",
    "16384",
    "--trace_request_length_generator_config_trace_file",
    "./data/processed_traces/splitwise_conv.csv",
    "--interval_generator_config_type",
    "poisson",
    "--poisson_request_interval_generator_config_qps",
    "6.45",
    "--replica_scheduler_config_type",
    "sarathi",
    "--sarathi_scheduler_config_batch_size_cap",
    "512",
    "--sarathi_scheduler_config_chunk_size",
    "512",
    "--random_forrest_execution_time_predictor_config_prediction_max_prefill_chunk_size",
    "16384",
    "--random_forrest_execution_time_predictor_config_prediction_max_batch_size",
    "512",
    "--random_forrest_execution_time_predictor_config_prediction_max_tokens_per_request",
    "16384",
]


def test_vidurs_readme_example_translates():
    config = vidur_flags_to_config(README_EXAMPLE)
    assert config.cluster.model == "meta-llama/Meta-Llama-3-8B"
    assert config.scheduler.kind == "sarathi" and config.scheduler.batch_size_cap == 512
    assert config.workload.num_requests == 512 and config.workload.max_tokens == 16384
    assert config.workload.lengths.file == "./data/processed_traces/splitwise_conv.csv"
    assert config.workload.intervals.qps == 6.45
    assert config.execution.kind == "tables" and config.execution.max_batch_size == 512
    assert config.execution.compute_table == "./data/profiling/compute/{DEVICE}/{MODEL}/mlp.csv"


def test_trace_replay_and_vllm_flags_and_booleans():
    config = vidur_flags_to_config(
        [
            "--request_generator_config_type",
            "trace_replay",
            "--trace_request_generator_config_trace_file",
            "t.csv",
            "--trace_request_generator_config_time_scale_factor",
            "0.3",
            "--replica_scheduler_config_type",
            "vllm",
            "--vllm_scheduler_config_max_tokens_in_batch",
            "2048",
            "--global_scheduler_config_type",
            "lor",
            "--no-metrics_config_store_plots",
            "--metrics_config_output_dir",
            "out",
        ]
    )
    assert config.workload.kind == "trace" and config.workload.time_scale == 0.3
    assert config.scheduler.kind == "vllm" and config.scheduler.max_tokens_in_batch == 2048
    assert config.cluster.router == "lor"
    assert config.output.plots is False and config.output.dir == "out"


def test_vidurs_defaults_apply_when_no_flag_is_given():
    config = vidur_flags_to_config([])
    assert config.scheduler.kind == "sarathi" and config.scheduler.chunk_size == 512
    assert config.workload.kind == "synthetic" and config.workload.num_requests == 128
    assert config.workload.intervals.qps == 0.5 and config.workload.lengths.kind == "fixed"


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        ("--replica_scheduler_config_type lightllm", "--replica_scheduler_config_type lightllm"),
        ("--sarathi_scheduler_config_chunkk_size 5", "--sarathi_scheduler_config_chunkk_size"),
        (
            "--replica_scheduler_config_type vllm --sarathi_scheduler_config_chunk_size 5",
            "--sarathi_scheduler_config_chunk_size",
        ),
        ("--interval_generator_config_type trace", "--interval_generator_config_type trace"),
    ],
)
def test_unsupported_flags_are_errors_that_name_them(flags, named):
    with pytest.raises(ConfigError, match=named):
        vidur_flags_to_config(flags.split())


def test_a_malformed_value_names_the_flag():
    with pytest.raises(ConfigError, match=r"--cluster_config_num_replicas: cannot read 'four' as int"):
        vidur_flags_to_config(["--cluster_config_num_replicas", "four"])
    with pytest.raises(ConfigError, match=r"--metrics_config_store_plots: cannot read 'maybe' as boolean"):
        vidur_flags_to_config(["--metrics_config_store_plots=maybe"])


def test_attention_defaults_to_vidurs_path_where_it_exists_else_the_roofline(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert vidur_flags_to_config([]).execution.attention_table == "roofline"
    table = tmp_path / "data/profiling/compute/a100/meta-llama/Llama-2-7b-hf/attention.csv"
    table.parent.mkdir(parents=True)
    table.write_text("")
    assert vidur_flags_to_config([]).execution.attention_table == (
        "./data/profiling/compute/{DEVICE}/{MODEL}/attention.csv"
    )


def test_synthetic_flags_draw_vidurs_own_requests():
    """Poisson gaps clipped at 3 mean gaps and Vidur's random streams, where Vidur's shapes allow."""
    config = vidur_flags_to_config(
        ["--length_generator_config_type", "fixed", "--poisson_request_interval_generator_config_qps", "4"]
    )
    assert config.workload.rng == "vidur"
    assert config.workload.intervals.qps == 4.0 and config.workload.intervals.max_gap_factor == 3.0
    uniform = vidur_flags_to_config(["--length_generator_config_type", "uniform"])
    assert uniform.workload.rng == "numpy" and uniform.workload.intervals.max_gap_factor == 3.0
