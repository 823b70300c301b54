"""The output folder holds exactly what the simulation computed: exact request times, every batch."""

import csv
import json
import math
import random

import numpy as np
import pytest

from rollflow.sim.metrics import request_table
from rollflow.sim.report import REQUEST_COLUMNS, _replica_events, format_table, number_texts, write_outputs
from tests.factories import make_config, simulate

SYNTHETIC = {"kind": "synthetic", "num_requests": 150, "intervals": {"kind": "poisson", "qps": 30}}


def _outputs(tmp_path, plots=False):
    result = simulate(make_config(workload=SYNTHETIC, cluster={"replicas": 2}))
    table = request_table(result)
    written = write_outputs(tmp_path, table, result, plots=plots)
    return result, table, written


def test_requests_csv_holds_every_completed_request_with_exact_times(tmp_path):
    _, table, _ = _outputs(tmp_path)
    with (tmp_path / "requests.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert tuple(rows[0]) == REQUEST_COLUMNS
    assert len(rows) == len(table) == 150
    for name in REQUEST_COLUMNS:
        written = [float(row[name]) for row in rows]
        assert written == table.columns[name].tolist(), name  # repr round-trips floats exactly


def test_chrome_trace_has_one_slice_per_batch_and_one_counter_per_load_sample(tmp_path):
    result, _, _ = _outputs(tmp_path)
    events = json.loads((tmp_path / "chrome_trace.json").read_text())["traceEvents"]
    for replica in result.replicas:
        slices = [e for e in events if e["ph"] == "X" and e["pid"] == replica.id]
        counters = [e for e in events if e["ph"] == "C" and e["pid"] == replica.id]
        assert len(slices) == len(replica.stats.batches) > 0
        assert len(counters) == len(replica.stats.kv_samples)
        for event, (start, duration, size, tokens, prefill, iterations) in zip(
            slices, replica.stats.batches, strict=True
        ):
            assert abs(event["ts"] - start * 1e6) <= 5e-4 and abs(event["dur"] - duration * 1e6) <= 5e-4
            assert event["args"] == {
                "batch_size": size,
                "tokens_per_iteration": tokens,
                "prefill_tokens": prefill,
                "iterations": iterations,
            }
            kind = "prefill" if prefill == tokens else "decode" if prefill == 0 else "mixed"
            assert event["name"] == (f"{kind} x{iterations}" if iterations > 1 else kind)


def test_plots_are_written_as_pngs(tmp_path):
    _, _, written = _outputs(tmp_path, plots=True)
    pngs = [path for path in written if path.suffix == ".png"]
    assert [p.name for p in pngs] == ["latency_cdf.png", "queue_and_kv.png"]
    for path in pngs:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_number_texts_are_reprs_over_every_magnitude():
    rng = np.random.default_rng(0)
    magnitudes = np.exp(rng.uniform(np.log(1e-12), np.log(1e22), 20_000))
    signs = rng.choice([-1.0, 1.0], len(magnitudes))
    edges = [0.0, -0.0, 1.0, 0.1, 1e-4, 9.999999999999999e-05, 1e16, 9999999999999998.0, 5e-324]
    edges += [1.7976931348623157e308, float("nan"), float("inf"), -float("inf"), 0.0625, 2.5, 1e15]
    floats = np.concatenate([magnitudes * signs, np.array(edges), rng.integers(0, 10**6, 1000) / 8])
    assert number_texts(floats) == list(map(repr, floats.tolist()))
    ints = np.array([0, -1, 7, 2**62, -(2**63)], dtype=np.int64)
    assert number_texts(ints) == list(map(repr, ints.tolist()))
    assert number_texts(np.zeros(0)) == []


def test_format_table_aligns_columns_in_a_box():
    text = format_table("T", ["name", "value"], [["a", "1.5"], ["bbb", "10.25"]], left=1)
    assert text.splitlines() == [
        "T",
        "┏━━━━━━┳━━━━━━━┓",
        "┃ name ┃ value ┃",
        "┡━━━━━━╇━━━━━━━┩",
        "│ a    │   1.5 │",
        "│ bbb  │ 10.25 │",
        "└──────┴───────┘",
    ]


def test_compiled_chrome_trace_events_match_the_python_writer_byte_for_byte():
    trace = pytest.importorskip(
        "rollflow.sim._trace", reason="compiled trace writer not built (make compiled)"
    )
    result = simulate(
        make_config(cluster={"replicas": 2}, workload={"kind": "synthetic", "num_requests": 300})
    )
    for replica in result.replicas:
        batches, loads = replica.stats.batches, replica.stats.kv_samples
        assert trace.replica_events(replica.id, batches, loads) == _replica_events(replica.id, batches, loads)
    # The fixed-point fast path against Python's "%.3f"/"%.2f": random values, exact rounding ties
    # (k/2000 is a tie at 3 places), their neighbours, and the values it hands to snprintf.
    rng = random.Random(0)
    values = [rng.uniform(0, 1e7) for _ in range(20_000)] + [rng.uniform(0, 100) for _ in range(20_000)]
    ties = [k / 2000 + whole for k in range(2000) for whole in (0, 7, 12345)] + [k / 200 for k in range(2000)]
    values += (
        ties + [math.nextafter(v, math.inf) for v in ties] + [math.nextafter(v, -math.inf) for v in ties]
    )
    values += [0.0, -0.0, -1.2345, 2.675, 999.9995, 1e15, 1e300, 5e-324, math.inf, -math.inf, math.nan]
    for places in (2, 3):
        assert [trace.format_fixed(v, places) for v in values] == [f"{v:.{places}f}" for v in values]
