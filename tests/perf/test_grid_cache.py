"""Grids from the cache are the tables' own, and a changed table is read again."""

import os

import numpy as np

from rollflow.perf.grid_cache import CACHE_DIR_ENV
from rollflow.sim.build import build_groups
from tests.factories import VIDUR_DATA, make_config


def _config(attention_table):
    network = VIDUR_DATA / "profiling" / "network" / "a100_pairwise_nvlink"
    return make_config(
        execution={
            "kind": "tables",
            "compute_table": str(VIDUR_DATA / "profiling/compute/a100/meta-llama/Llama-2-7b-hf/mlp.csv"),
            "attention_table": str(attention_table),
            "send_recv_table": str(network / "send_recv.csv"),
        },
        cluster={"model": "meta-llama/Llama-2-7b-hf", "device": "a100", "pipeline_stages": 2},
    )


def _arrays(times):
    prefill = times.prefill
    return [times.linear_ms, times.kv_save_ms, times.send_recv_ms, times.decode_ms, prefill.chunk_sizes,
            *prefill.kv_points, *prefill.times_ms]  # fmt: skip


def test_cached_grids_equal_the_tables_and_follow_their_changes(monkeypatch, tmp_path, attention_table):
    table = tmp_path / "attention.csv"
    table.write_bytes(attention_table.read_bytes())
    monkeypatch.setenv(CACHE_DIR_ENV, "")
    uncached = build_groups(_config(table))[0].predictor.times
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache"))
    first = build_groups(_config(table))[0].predictor.times  # built, then written
    assert len(list((tmp_path / "cache" / "grids").glob("*.npz"))) == 1
    second = build_groups(_config(table))[0].predictor.times  # read back
    for times in (first, second):
        assert times.source == uncached.source and times.kv_granularity == uncached.kv_granularity
        for got, want in zip(_arrays(times), _arrays(uncached), strict=True):
            assert got.dtype == want.dtype and np.array_equal(got, want)

    # An edited table (a decode time doubled) is a new key: its grids come from the new rows.
    lines = table.read_text().splitlines()
    header = lines[0].split(",")
    decode_col, chunk_col = header.index("time_stats.attn_decode.median"), header.index("prefill_chunk_size")
    for i, line in enumerate(lines[1:], start=1):
        cells = line.split(",")
        if cells[chunk_col] == "0":
            cells[decode_col] = repr(2 * float(cells[decode_col]))
            lines[i] = ",".join(cells)
    table.write_text("\n".join(lines) + "\n")
    os.utime(table, ns=(1, 1))  # a different modification time, whatever the clock's resolution
    edited = build_groups(_config(table))[0].predictor.times
    assert len(list((tmp_path / "cache" / "grids").glob("*.npz"))) == 2
    assert np.allclose(edited.decode_ms, 2 * uncached.decode_ms)
