"""Codecs for one tensor's record, and the codec names users write ("int8+zstd", "delta+zstd").

Three stages compose:
- int8: per-row (dim 0, the output channel) symmetric quantization of bf16/fp16/fp32 tensors
  with two or more dimensions; lossy, bounded per element by
  |w_hat - w| <= amax_row * (1/254 + u), where amax_row is the row's largest magnitude and u the
  unit roundoff of the tensor's dtype (2^-8 bf16, 2^-11 fp16, 2^-24 fp32) from casting back.
  Vectors (norms, biases) and non-finite tensors travel raw.
- delta: against a base version the puller already holds. Tensors equal to the base send
  nothing; others send the changed fixed-size blocks of (new XOR base). XOR rather than
  subtraction keeps it bit-exact for any dtype, and a few changed bits per weight leave mostly
  zero bytes, which zstd then squeezes.
- zstd: compresses each chunk of the payload stream (see payload.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from rollflow.runtime.weights.errors import CodecError, WeightIntegrityError
from rollflow.runtime.weights.tensors import flat_bytes, tensor_from_bytes

QUANTIZABLE = (torch.bfloat16, torch.float16, torch.float32)
UNIT_ROUNDOFF = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11, torch.float32: 2.0**-24}
_STAGES = ("int8", "delta", "zstd")


@dataclass(frozen=True)
class CodecSpec:
    """Which stages a payload uses; `name` is the canonical spelling ("raw" when none)."""

    int8: bool = False
    delta: bool = False
    zstd: bool = False

    def __post_init__(self) -> None:
        if self.int8 and self.delta:
            raise CodecError(
                "codec cannot combine int8 and delta: a delta applies to the exact base weights, "
                "which an int8 puller does not hold"
            )

    @property
    def name(self) -> str:
        parts = [stage for stage in _STAGES if getattr(self, stage)]
        return "+".join(parts) or "raw"

    @property
    def lossless(self) -> bool:
        return not self.int8

    @classmethod
    def parse(cls, text: str) -> CodecSpec:
        """Parse "raw", "zstd", "int8+zstd", "delta+zstd", ... (also with ',' or ' ' between stages)."""
        parts = [p for p in text.replace(",", "+").replace(" ", "+").lower().split("+") if p]
        unknown = [p for p in parts if p not in (*_STAGES, "raw")]
        if unknown or not parts or ("raw" in parts and len(parts) > 1):
            raise CodecError(
                f"unknown codec {text!r}; write 'raw' or stages joined by '+' from: {', '.join(_STAGES)} "
                "(e.g. 'int8+zstd', 'delta+zstd')"
            )
        return cls(**{stage: stage in parts for stage in _STAGES})

    def without_delta(self) -> CodecSpec:
        return CodecSpec(int8=self.int8, zstd=self.zstd)


def encode_whole(tensor: torch.Tensor, int8: bool) -> tuple[str, bytes | np.ndarray]:
    """A tensor's record without a base, and its encoding: int8 codes when `int8` asks for them and
    the tensor quantizes, else its raw bytes (sharing the tensor's memory)."""
    quantized = quantize_int8(tensor) if int8 and can_quantize(tensor) else None
    return ("int8", quantized) if quantized is not None else ("raw", flat_bytes(tensor))


def decode_record(
    encoding: str,
    record: memoryview,
    dtype: torch.dtype,
    shape: tuple[int, ...],
    base: torch.Tensor | None,
    changed_blocks: tuple[tuple[int, int], ...] = (),
    block_bytes: int = 0,
) -> torch.Tensor:
    """A tensor from its record: "raw" bytes, "int8" codes, or against `base` (the contiguous CPU
    tensor of this dtype and shape the record was encoded against) "same" or "xor" blocks."""
    if encoding == "raw":
        return tensor_from_bytes(record, dtype, shape)
    if encoding == "int8":
        return dequantize_int8(record, dtype, shape)
    if base is None:
        raise WeightIntegrityError(f"a {encoding} record needs the base weights, which are not held")
    if encoding == "same":
        return base.clone()
    return apply_xor_delta(base, record, changed_blocks, block_bytes)


def can_quantize(tensor: torch.Tensor) -> bool:
    return tensor.dtype in QUANTIZABLE and tensor.dim() >= 2 and tensor.numel() > 0


def quantize_int8(tensor: torch.Tensor) -> bytes | None:
    """int8 codes (row-major) followed by one float32 scale per row; None if not all finite."""
    rows = tensor.reshape(tensor.shape[0], -1).float()
    if not torch.isfinite(rows).all():
        return None
    amax = rows.abs().amax(dim=1)
    scale = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax))
    codes = torch.round(rows / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return codes.numpy().tobytes() + scale.numpy().tobytes()


def dequantize_int8(record: memoryview, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    num_rows = shape[0]
    num_codes = len(record) - 4 * num_rows
    codes = torch.from_numpy(np.frombuffer(record[:num_codes], dtype=np.int8).reshape(num_rows, -1).copy())
    scale = torch.from_numpy(np.frombuffer(record[num_codes:], dtype=np.float32).copy())
    return (codes.float() * scale[:, None]).to(dtype).reshape(shape)


@dataclass(frozen=True)
class XorDelta:
    """The changed blocks of (new XOR base): the ranges and their concatenated bytes."""

    changed_blocks: tuple[tuple[int, int], ...]
    data: np.ndarray


def xor_delta(new: torch.Tensor, base: torch.Tensor, block_bytes: int) -> XorDelta:
    """Blocks of `block_bytes` whose bytes differ between `new` and `base` (same dtype and shape)."""
    xor = np.bitwise_xor(_words(flat_bytes(new)), _words(flat_bytes(base))).view(np.uint8)
    num_full = xor.size // block_bytes
    full_blocks = xor[: num_full * block_bytes].view(np.uint64).reshape(num_full, block_bytes // 8)
    changed = full_blocks.any(axis=1).tolist()
    if xor.size > num_full * block_bytes:
        changed.append(bool(xor[num_full * block_bytes :].any()))
    ranges = _runs(changed)
    if ranges == [(0, len(changed))]:
        return XorDelta(tuple(ranges), xor)
    parts = [xor[start * block_bytes : end * block_bytes] for start, end in ranges]
    data = np.concatenate(parts) if parts else np.empty(0, dtype=np.uint8)
    return XorDelta(tuple(ranges), data)


def apply_xor_delta(
    base: torch.Tensor, record: memoryview, changed_blocks: tuple[tuple[int, int], ...], block_bytes: int
) -> torch.Tensor:
    """A new tensor: `base` with the record's XOR blocks applied (the base is not modified)."""
    out = flat_bytes(base).copy()
    data = np.frombuffer(record, dtype=np.uint8)
    position = 0
    for start, end in changed_blocks:
        target = out[start * block_bytes : end * block_bytes]
        np.bitwise_xor(target, data[position : position + target.size], out=target)
        position += target.size
    if position != data.size:
        raise ValueError(f"xor record holds {data.size} bytes, its blocks cover {position}")
    return tensor_from_bytes(out, base.dtype, tuple(base.shape))


def _words(data: np.ndarray) -> np.ndarray:
    """8-byte words when the length allows (XOR runs several times faster on them)."""
    return data.view(np.uint64) if data.size % 8 == 0 else data


def _runs(flags: list[bool]) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    start = None
    for index, flag in enumerate(flags):
        if flag and start is None:
            start = index
        elif not flag and start is not None:
            runs.append((start, index))
            start = None
    if start is not None:
        runs.append((start, len(flags)))
    return runs
