"""Codecs on their own: lossless paths are bit-exact, int8 stays within its stated bound."""

from __future__ import annotations

import pytest
import torch

from rollflow.runtime.weights import CodecError, CodecSpec, WeightIntegrityError, WeightStore
from rollflow.runtime.weights.codecs import UNIT_ROUNDOFF, decode_record
from rollflow.runtime.weights.payload import chunk_file, decode_payload
from tests.runtime.weights.factories import assert_same_state, tiny_llama, train_step


def _decode(store: WeightStore, manifest, base=None):
    folder = store.root / "payloads" / manifest.payload_id
    return decode_payload(manifest, lambda entry: chunk_file(folder, entry.index).read_bytes(), base)


def _odd_tensors() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    return {
        "fp32": torch.randn(5, 7, generator=gen),
        "fp16": torch.randn(3, 4, 2, generator=gen).half(),
        "f64": torch.randn(4, generator=gen).double(),
        "ints": torch.arange(-5, 6, dtype=torch.int32),
        "mask": torch.rand(9, generator=gen) > 0.5,
        "scalar": torch.tensor(2.5),
        "empty": torch.empty(0, 8, dtype=torch.bfloat16),
        "special": torch.tensor([[float("inf"), float("nan"), -0.0, 1e-40]]),
    }


@pytest.mark.parametrize("codec", ["raw", "zstd", "delta", "delta+zstd"])
def test_lossless_codecs_round_trip_bit_exactly(tmp_path, codec):
    store = WeightStore(tmp_path, chunk_bytes=1024, delta_block_bytes=64)
    first = {**tiny_llama(0), **_odd_tensors()}
    second = train_step(first, fraction=0.02, seed=1)
    store.publish(1, first)
    store.publish(2, second)
    manifest = store.manifest(2, codec, base_version=1)
    assert manifest.lossless and len(manifest.chunks) > 1
    assert_same_state(_decode(store, manifest, first if manifest.base_version else None), second)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_int8_error_stays_within_the_stated_bound(tmp_path, dtype):
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(48, 40, generator=gen)
    weight[7] *= 300.0  # an outlier row must not widen the other rows' error
    weight[9] = 0.0
    state = {
        "w": weight.to(dtype),
        "conv": torch.randn(6, 3, 2, 2, generator=gen).to(dtype),
        "norm": torch.rand(40),
    }
    store = WeightStore(tmp_path)
    store.publish(1, state)
    manifest = store.manifest(1, "int8+zstd")
    assert not manifest.lossless
    decoded = _decode(store, manifest)
    for name in ("w", "conv"):
        original = state[name].float().reshape(state[name].shape[0], -1)
        error = (decoded[name].float().reshape(original.shape) - original).abs()
        amax = original.abs().amax(dim=1, keepdim=True)
        assert decoded[name].dtype == dtype
        assert (error <= amax * (1 / 254 + UNIT_ROUNDOFF[dtype]) + 1e-30).all(), name
    normal_rows = [row for row in range(48) if row != 7]  # the outlier row does not widen the others' error
    assert (error_w := (decoded["w"].float() - state["w"].float()).abs())[normal_rows].max() < 0.02
    assert error_w[9].max() == 0.0  # an all-zero row stays zero
    assert torch.equal(decoded["norm"], state["norm"])  # vectors travel exactly
    encodings = {entry.name: entry.encoding for entry in manifest.tensors}
    assert encodings == {"w": "int8", "conv": "int8", "norm": "raw"}


def test_int8_sends_non_finite_tensors_raw(tmp_path):
    state = {"w": torch.tensor([[1.0, float("nan")], [2.0, 3.0]]).bfloat16()}
    store = WeightStore(tmp_path)
    store.publish(1, state)
    manifest = store.manifest(1, "int8")
    assert manifest.tensors[0].encoding == "raw"
    assert torch.equal(_decode(store, manifest)["w"].view(torch.int16), state["w"].view(torch.int16))


def test_int8_halves_bf16_bytes(tmp_path):
    store = WeightStore(tmp_path)
    store.publish(1, {"w": torch.randn(256, 512).bfloat16()})
    manifest = store.manifest(1, "int8")
    assert manifest.wire_nbytes == 256 * 512 + 256 * 4


def test_delta_sends_only_changed_tensors_and_blocks(tmp_path):
    store = WeightStore(tmp_path, delta_block_bytes=64)
    first = tiny_llama(0)
    second = {name: tensor.clone() for name, tensor in first.items()}
    second["model.layers.1.mlp.up_proj.weight"][10, 3] += 1.0  # one weight in one block
    store.publish(1, first)
    store.publish(2, second)
    manifest = store.manifest(2, "delta", base_version=1)
    changed = {e.name: e for e in manifest.tensors if e.encoding != "same"}
    assert list(changed) == ["model.layers.1.mlp.up_proj.weight"]
    block = (10 * 32 + 3) * 2 // 64
    assert changed["model.layers.1.mlp.up_proj.weight"].changed_blocks == ((block, block + 1),)
    assert manifest.wire_nbytes == 64
    assert_same_state(_decode(store, manifest, first), second)


def test_delta_needs_the_right_base(tmp_path):
    store = WeightStore(tmp_path)
    first, second = tiny_llama(0), tiny_llama(1)
    store.publish(1, first)
    store.publish(2, second)
    manifest = store.manifest(2, "delta+zstd", base_version=1)
    without_norm = {name: tensor for name, tensor in first.items() if name != "model.norm.weight"}
    with pytest.raises(WeightIntegrityError, match=r"lack model\.norm\.weight"):
        _decode(store, manifest, without_norm)


@pytest.mark.parametrize("encoding", ["same", "xor"])
def test_a_delta_record_without_its_base_is_an_integrity_error(encoding):
    with pytest.raises(WeightIntegrityError, match="needs the base weights"):
        decode_record(encoding, memoryview(b""), torch.float32, (2,), None)


@pytest.mark.parametrize(
    ("text", "name"),
    [
        ("raw", "raw"),
        ("ZSTD", "zstd"),
        ("zstd+int8", "int8+zstd"),
        ("delta,zstd", "delta+zstd"),
        ("delta zstd", "delta+zstd"),
    ],
)
def test_codec_names_parse_to_one_canonical_spelling(text, name):
    assert CodecSpec.parse(text).name == name


@pytest.mark.parametrize(
    ("text", "message"),
    [("gzip", "unknown codec"), ("raw+zstd", "unknown codec"), ("int8+delta", "cannot combine")],
)
def test_bad_codecs_are_clear_errors(text, message):
    with pytest.raises(CodecError, match=message):
        CodecSpec.parse(text)
