import pytest

from rollflow.config import ConfigError, load_config
from rollflow.sim.config import SimConfig


def _write(tmp_path, text):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return path


def test_overrides_are_typed_and_nested(tmp_path):
    path = _write(tmp_path, "cluster:\n  replicas: 2\n")
    config = load_config(
        SimConfig, path, ["cluster.replicas=4", "scheduler.kind=vllm", "workload.intervals.qps=2.5"]
    )
    assert config.cluster.replicas == 4
    assert config.scheduler.kind == "vllm"
    assert config.workload.intervals.qps == 2.5


def test_a_typo_names_the_key_suggests_the_fix_and_lists_allowed_keys(tmp_path):
    path = _write(tmp_path, "cluster:\n  replicaz: 2\n")
    with pytest.raises(ConfigError) as info:
        load_config(SimConfig, path)
    message = str(info.value)
    assert message.count("\n") == 0
    assert "cluster.replicaz: unknown key; did you mean 'replicas'?" in message
    assert "router" in message


def test_a_bad_choice_names_the_key_the_value_and_the_choices(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_config(SimConfig, None, ["scheduler.kind=fifo"])
    message = str(info.value)
    assert "scheduler.kind" in message and "'fifo'" in message
    assert "'vllm', 'sarathi' or 'orca'" in message


def test_union_sections_report_the_users_key_not_pydantics_tag(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_config(SimConfig, None, ["workload.kind=trace", "workload.fil=x.csv"])
    assert "workload.fil: unknown key; did you mean 'file'?" in str(info.value)


def test_bounds_are_enforced_with_the_value_shown():
    with pytest.raises(
        ConfigError, match=r"cluster.replicas: Input should be greater than or equal to 1 \(got 0\)"
    ):
        load_config(SimConfig, None, ["cluster.replicas=0"])


def test_unknown_model_lists_the_catalog():
    with pytest.raises(ConfigError, match=r"unknown model 'gpt-9'.*meta-llama/Llama-2-7b-hf"):
        load_config(SimConfig, None, ["cluster.model=gpt-9"])


def test_malformed_override_and_missing_file_are_clear(tmp_path):
    with pytest.raises(ConfigError, match=r"not of the form key.path=value"):
        load_config(SimConfig, None, ["cluster.replicas"])
    with pytest.raises(ConfigError, match="file not found"):
        load_config(SimConfig, tmp_path / "nope.yaml")


def test_overrides_index_lists_and_reject_indexes_past_the_end(tmp_path):
    from rollflow.runtime.launch.config import load_launch_config

    path = _write(
        tmp_path,
        "launch:\n  engines:\n    - {kind: local, model: a}\n    - {kind: spot, model: b}\n",
    )
    config = load_launch_config(path, ["launch.engines.1.count=3", "launch.engines.0.model=c"])
    assert (config.engines[1].count, config.engines[1].kind, config.engines[0].model) == (3, "spot", "c")
    with pytest.raises(ConfigError, match=r"launch.engines.2.count: '2' is not an index of a list of 2"):
        load_launch_config(path, ["launch.engines.2.count=3"])
