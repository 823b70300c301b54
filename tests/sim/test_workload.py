import numpy as np
import pytest

from rollflow.config import ConfigError
from rollflow.sim.workload import WorkloadError, build_requests
from tests.factories import CONV_TRACE, make_config


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


def _conv_synthetic(**changes):
    workload = {
        "kind": "synthetic",
        "num_requests": 1000,
        "max_tokens": 4096,
        "rng": "vidur",
        "lengths": {"kind": "trace", "file": str(CONV_TRACE)},
        "intervals": {"kind": "poisson", "qps": 8.34375, "max_gap_factor": 3.0},
    }
    return make_config(workload=workload | changes, seed=42).workload


def test_vidur_rng_draws_the_requests_vidur_drew():
    """Golden values: request_metrics.csv of Vidur's own run (commit 7d47513, `python -m vidur.main`
    as its capacity search writes it: seed 42, Splitwise conversation lengths, 1,000 requests,
    Poisson at 8.34375 QPS, max_tokens 4096): lengths by request id and inter-arrival delays."""
    if not CONV_TRACE.is_file():
        pytest.skip("needs ../shared/data/vidur")
    requests = build_requests(_conv_synthetic(), 42)
    lengths = [(r.prompt_tokens, r.output_tokens) for r in requests]
    assert lengths[:6] == [(395, 112), (1030, 403), (389, 120), (1031, 396), (413, 90), (1013, 397)]
    assert lengths[-2:] == [(382, 53), (2059, 171)]
    gaps = np.diff([r.arrived_at for r in requests])
    expected = [0.0030356661025005283, 0.0385467043086101, 0.03027250165334694, 0.15983133157250431]
    assert gaps[:4].tolist() == pytest.approx(expected, rel=1e-9)
    # the first of the last two is clipped at 3 mean gaps, as 58 of the 999 are
    assert gaps[-2:].tolist() == pytest.approx([0.3595505617977466, 0.23180598026252142], rel=1e-9)
    assert int(np.isclose(gaps, 3.0 / 8.34375, rtol=1e-9, atol=0).sum()) == 58
    assert gaps.sum() == pytest.approx(117.85132507113492, rel=1e-12)


def test_max_gap_factor_clips_gaps_and_raises_the_true_rate():
    workload = {"kind": "synthetic", "num_requests": 20000, "intervals": {"kind": "poisson", "qps": 4.0}}
    exact = np.diff([r.arrived_at for r in build_requests(make_config(workload=workload).workload, 5)])
    workload["intervals"]["max_gap_factor"] = 3.0
    clipped = np.diff([r.arrived_at for r in build_requests(make_config(workload=workload).workload, 5)])
    assert exact.max() > 3.0 / 4.0 and clipped.max() == 3.0 / 4.0
    assert exact.mean() == pytest.approx(0.25, rel=0.03)
    assert clipped.mean() == pytest.approx((1 - np.exp(-3.0)) * 0.25, rel=0.03)  # 5% more arrivals


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"lengths": {"kind": "uniform"}}, "rng=vidur takes lengths.kind trace or fixed, not uniform"),
        ({"intervals": {"kind": "gamma"}}, "rng=vidur takes intervals.kind poisson or static, not gamma"),
        ({"groups": {"size": 4}}, "rng=vidur takes no system_prompt_tokens, groups or sessions"),
    ],
)
def test_vidur_rng_refuses_shapes_vidur_does_not_draw(changes, named):
    with pytest.raises(ConfigError, match=named):
        _conv_synthetic(**changes)
