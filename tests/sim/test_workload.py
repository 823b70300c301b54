import numpy as np
import pytest

from rollflow.sim.workload import WorkloadError, build_requests
from tests.factories import make_config


def test_trace_replay_scales_and_trims_prompts_like_vidur(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n2.0,100,10\n1.0,3000,2000\n0.5,7,0\n")
    config = make_config(
        workload={
            "kind": "trace",
            "file": str(trace),
            "time_scale": 0.5,
            "prefill_scale": 1.5,
            "max_tokens": 4096,
        }
    )
    requests = build_requests(config.workload, config.seed)
    assert [r.arrived_at for r in requests] == [0.25, 0.5, 1.0]
    assert [(r.prompt_tokens, r.output_tokens) for r in requests] == [(10, 1), (2096, 2000), (150, 10)]


def test_trace_errors_name_the_file_and_column(tmp_path):
    trace = tmp_path / "bad.csv"
    trace.write_text("arrived_at,prompt\n0,1\n")
    config = make_config(workload={"kind": "trace", "file": str(trace)})
    with pytest.raises(WorkloadError, match=r"bad.csv lacks column\(s\) num_prefill_tokens"):
        build_requests(config.workload, 0)


@pytest.mark.parametrize("lengths", ["fixed", "uniform", "zipf"])
@pytest.mark.parametrize("intervals", ["poisson", "gamma", "static"])
def test_synthetic_workloads_are_seeded_and_bounded(lengths, intervals):
    config = make_config(
        workload={
            "kind": "synthetic",
            "num_requests": 300,
            "max_tokens": 2048,
            "lengths": {"kind": lengths},
            "intervals": {"kind": intervals, **({"qps": 5} if intervals != "static" else {})},
        }
    )
    a = build_requests(config.workload, 1)
    b = build_requests(config.workload, 1)
    assert [(r.arrived_at, r.prompt_tokens) for r in a] == [(r.arrived_at, r.prompt_tokens) for r in b]
    assert len(a) == 300
    assert all(
        r.prompt_tokens >= 1 and r.output_tokens >= 1 and r.prompt_tokens + r.output_tokens <= 2048 for r in a
    )
    if intervals == "poisson":
        gaps = np.diff([r.arrived_at for r in a])
        assert 1 / 5 * 0.7 < gaps.mean() < 1 / 5 * 1.3


def test_rollout_burst_has_groups_sharing_prompts_and_a_long_tail():
    config = make_config(
        workload={
            "kind": "rl_burst",
            "num_prompts": 32,
            "samples_per_prompt": 16,
            "output_median_tokens": 500,
            "output_sigma": 1.0,
            "max_new_tokens": 8000,
        }
    )
    requests = build_requests(config.workload, 3)
    assert len(requests) == 512 and {r.arrived_at for r in requests} == {0.0}
    prompts = np.array([r.prompt_tokens for r in requests]).reshape(32, 16)
    assert (prompts == prompts[:, :1]).all()
    outputs = np.array([r.output_tokens for r in requests])
    assert 350 < np.median(outputs) < 700
    assert np.percentile(outputs, 99) > 4 * np.median(outputs)
    assert outputs.max() <= 8000
