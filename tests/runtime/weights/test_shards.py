"""Weights read straight from the ranks that hold them: two exporters (each its own Mooncake
TransferEngine over TCP on 127.0.0.1, as two trainer ranks) and a reader, with real transfers."""

from __future__ import annotations

import pytest
import torch

from rollflow.runtime.weights.codecs import CodecSpec
from rollflow.runtime.weights.errors import WeightsError
from rollflow.runtime.weights.mooncake import Unavailable, load_engine
from rollflow.runtime.weights.shards import ShardedManifest, ShardExporter, read_sharded

FILES = {"config.json": "{}"}


def engine():
    loaded = load_engine("127.0.0.1", "tcp")
    assert not isinstance(loaded, Unavailable), loaded.reason
    return loaded


@pytest.fixture(scope="module")
def engines():
    return [engine(), engine(), engine()]  # rank 0, rank 1, the reader


def model(seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {
        "embed.weight": torch.randn(37, 16, generator=generator),  # 19 + 18 rows: uneven, as FSDP2's
        "norm.weight": torch.randn(16, generator=generator),
        "proj.weight": torch.randn(8, 16, generator=generator).to(torch.bfloat16),
        "step": torch.tensor(3),  # a 0-dim tensor: one row, held whole by rank 0
    }


def fsdp_rows(state: dict[str, torch.Tensor], rank: int, world: int = 2) -> dict:
    """What FSDP2's Shard(0) leaves rank `rank`: torch.chunk's rows of each tensor."""
    out = {}
    for name, tensor in state.items():
        if tensor.dim() == 0:
            if rank == 0:
                out[name] = (tensor, 0, ())
            continue
        size = -(-tensor.shape[0] // world)
        start = min(rank * size, tensor.shape[0])
        out[name] = (tensor[start : start + size], start, tuple(tensor.shape))
    return out


def export(exporters, version: int, state, codec: CodecSpec) -> ShardedManifest:
    exports = [x.export(version, fsdp_rows(state, x.rank)) for x in exporters]
    return ShardedManifest.from_json(ShardedManifest.merge(version, codec, exports, FILES).to_json())


@pytest.mark.parametrize("codec", ["raw", "zstd", "delta", "delta+zstd"])
def test_an_engine_reads_every_version_from_both_ranks_exactly_and_a_delta_moves_only_changes(engines, codec):
    spec = CodecSpec.parse(codec)
    exporters = [ShardExporter(engines[r], r, spec, block_bytes=256) for r in range(2)]
    first, second = model(0), model(0)
    second["embed.weight"][30] += 1.0  # one row changed, held by rank 1
    m1 = export(exporters, 1, first, spec)
    m2 = export(exporters, 2, second, spec)
    got1, stats1 = read_sharded(engines[2], m1)
    assert got1.keys() == first.keys() and all(torch.equal(got1[k], first[k]) for k in first)
    assert set(stats1.wire_nbytes) == {0, 1} and stats1.delta_blocks == 0
    base = {name: (tensor, 0) for name, tensor in got1.items()}
    got2, stats2 = read_sharded(engines[2], m2, base=base, base_version=1)
    assert all(torch.equal(got2[k], second[k]) for k in second)
    if spec.delta:
        assert m2.delta_base == 1 and stats2.delta_blocks == stats2.blocks
        assert sum(stats2.wire_nbytes.values()) < sum(stats1.wire_nbytes.values()) / 2
    else:
        assert m2.delta_base is None and stats2.delta_blocks == 0
    assert m2.files == FILES and m2.model_nbytes == sum(t.numel() * t.element_size() for t in second.values())
    for exporter in exporters:
        exporter.close()


def test_a_row_range_reads_only_the_blocks_that_hold_it(engines):
    spec = CodecSpec.parse("raw")
    exporters = [ShardExporter(engines[r], r, spec, block_bytes=16 * 4 * 4) for r in range(2)]  # 4 rows
    state = model(1)
    manifest = export(exporters, 1, state, spec)
    rows = {"embed.weight": (17, 23), "proj.weight": (0, 4)}  # across the ranks' boundary at row 19
    got, stats = read_sharded(engines[2], manifest, rows=rows)
    assert torch.equal(got["embed.weight"], state["embed.weight"][17:23])
    assert torch.equal(got["proj.weight"], state["proj.weight"][:4])
    assert torch.equal(got["norm.weight"], state["norm.weight"])  # not named: whole
    # blocks of 4 rows: rows 16-19 on rank 0, 19-23 on rank 1, not the other 29 rows of embed
    embed_block_bytes = 4 * 16 * 4
    assert stats.wire_nbytes[1] < 2 * embed_block_bytes + state["proj.weight"][4:].numel() * 2 + 64
    whole, _ = read_sharded(engines[2], manifest)
    assert torch.equal(whole["embed.weight"], state["embed.weight"])
    with pytest.raises(WeightsError, match="outside its 37 rows"):
        read_sharded(engines[2], manifest, rows={"embed.weight": (30, 40)})
    for exporter in exporters:
        exporter.close()


def test_a_delta_against_another_base_is_caught_and_a_gone_rank_fails_the_read(engines):
    spec = CodecSpec.parse("delta+zstd")
    exporters = [ShardExporter(engines[r], r, spec) for r in range(2)]
    export(exporters, 1, model(0), spec)
    manifest = export(exporters, 2, model(2), spec)
    wrong = {name: (tensor, 0) for name, tensor in model(5).items()}
    from rollflow.runtime.weights.shards import BaseMismatchError

    with pytest.raises(BaseMismatchError):
        read_sharded(engines[2], manifest, base=wrong, base_version=1)
    exporters[1].close()  # its memory no longer registered: as good as gone for a reader
    with pytest.raises(OSError, match="trainer rank 1"):
        read_sharded(engines[2], manifest)
    exporters[0].close()


def test_a_manifest_that_leaves_rows_to_no_rank_is_refused(engines):
    spec = CodecSpec.parse("raw")
    exporter = ShardExporter(engines[0], 0, spec)
    export_0 = exporter.export(1, fsdp_rows(model(0), 0))
    with pytest.raises(WeightsError, match="pieces cover 19"):
        ShardedManifest.merge(1, spec, [export_0], FILES)
    with pytest.raises(WeightsError, match="not a sharded manifest"):
        ShardedManifest.from_json('{"version": 1}')
    exporter.close()


def test_a_weight_server_keeps_only_the_manifest_and_a_puller_reads_the_version_from_the_ranks(
    engines, tmp_path
):
    import asyncio

    from rollflow.runtime.weights.errors import UnknownVersionError
    from rollflow.runtime.weights.puller import WeightPuller
    from tests.runtime.processes import ENV, http
    from tests.runtime.weights.factories import start_server_process

    spec = CodecSpec.parse("delta+zstd")
    exporters = [ShardExporter(engines[r], r, spec) for r in range(2)]
    first, second = model(0), model(3)
    server, url = start_server_process(tmp_path / "store", env=ENV | {"ROLLFLOW_WEIGHTS_TOKEN": "secret"})
    try:
        bodies = [
            export(exporters, version, state, spec).to_json() for version, state in ((1, first), (2, second))
        ]
        assert http("PUT", url + "/v1/sharded/1", bodies[0].encode())[0] == 401
        status, answer = http("PUT", url + "/v1/sharded/two", bodies[0].encode(), token="secret")
        assert status == 400 and "version must be an integer" in answer["error"]["message"]
        status, answer = http("PUT", url + "/v1/sharded/2", bodies[0].encode(), token="secret")
        assert status == 400 and "of version 1, not 2" in answer["error"]["message"]
        status, answer = http("PUT", url + "/v1/sharded/1", b'{"version": 1}', token="secret")
        assert status == 400 and "not a sharded manifest" in answer["error"]["message"]
        for version, body in ((1, bodies[0]), (2, bodies[1])):
            assert http("PUT", url + f"/v1/sharded/{version}", body.encode(), token="secret")[0] == 200
        assert http("GET", url + "/v1/versions")[1] == {"versions": [1, 2], "latest": 2}
        assert http("GET", url + "/v1/sharded/latest")[1] == http("GET", url + "/v1/sharded/2")[1]
        status, answer = http("GET", url + "/v1/manifest?version=2")
        assert status == 404 and "held by the trainer ranks" in answer["error"]["message"]
        assert http("GET", url + "/v1/sharded/7")[0] == 404

        async def pull(transport: str, version: int, base=None):
            async with WeightPuller(url, tmp_path / f"cache-{transport}", transport=transport) as puller:
                return await puller.pull(version, "delta+zstd", base=base)

        full = asyncio.run(pull("mooncake", 1))
        assert all(torch.equal(full.weights.state_dict[k], first[k]) for k in first)
        assert full.stats.transport == "mooncake" and full.manifest.base_version is None
        delta = asyncio.run(pull("mooncake", 2, base=full.weights))
        assert all(torch.equal(delta.weights.state_dict[k], second[k]) for k in second)
        assert delta.manifest.codec == "delta+zstd" and delta.manifest.base_version == 1
        with pytest.raises(UnknownVersionError, match="held by the trainer ranks"):
            asyncio.run(pull("http", 2))
    finally:
        server.kill()
        server.wait()
        for exporter in exporters:
            exporter.close()
    assert not list((tmp_path / "store" / "versions").iterdir())  # no weight bytes on the server
