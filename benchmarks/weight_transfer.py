"""Bytes on the wire and encode/decode speed of each weight codec, against raw.

Builds a random Llama-shaped bf16 state dict at run time (about 330 MB by default), then a
"training step" of it in which a fraction of every matrix's weights moves by one bf16 ulp (what
a small optimizer update does to bf16 weights: most round back to the same value). Each codec
encodes into chunk files exactly as the weight server does, and decodes them exactly as a puller
does (per-chunk checksums, zstd, the stream digest, and the exact-tensor digest for lossless
codecs). MB/s are megabytes of model weights per second, one process.

    .venv/bin/python benchmarks/weight_transfer.py
    .venv/bin/python benchmarks/weight_transfer.py --layers 4 --changed 0.01
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from rollflow.runtime.weights.codecs import CodecSpec
from rollflow.runtime.weights.io import Manifest
from rollflow.runtime.weights.payload import chunk_file, decode_payload, encode_payload
from rollflow.runtime.weights.tensors import state_digest

MB = 1e6


def llama_state(
    hidden: int, intermediate: int, layers: int, vocab: int, seed: int
) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    shapes = {"model.embed_tokens.weight": (vocab, hidden), "lm_head.weight": (vocab, hidden)}
    for layer in range(layers):
        prefix = f"model.layers.{layer}."
        shapes |= {
            prefix + "self_attn.q_proj.weight": (hidden, hidden),
            prefix + "self_attn.k_proj.weight": (hidden, hidden),
            prefix + "self_attn.v_proj.weight": (hidden, hidden),
            prefix + "self_attn.o_proj.weight": (hidden, hidden),
            prefix + "mlp.gate_proj.weight": (intermediate, hidden),
            prefix + "mlp.up_proj.weight": (intermediate, hidden),
            prefix + "mlp.down_proj.weight": (hidden, intermediate),
            prefix + "input_layernorm.weight": (hidden,),
            prefix + "post_attention_layernorm.weight": (hidden,),
        }
    shapes["model.norm.weight"] = (hidden,)
    state = {}
    for name, shape in shapes.items():
        if len(shape) == 1:
            state[name] = (1 + 0.1 * torch.randn(shape, generator=gen)).bfloat16()
        else:
            state[name] = (torch.randn(shape, generator=gen) * 0.02).bfloat16()
    return state


def training_step(state: dict[str, torch.Tensor], fraction: float, seed: int) -> dict[str, torch.Tensor]:
    """A copy in which `fraction` of each matrix's weights, scattered at random, move by one ulp."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, tensor in state.items():
        tensor = tensor.clone()
        if tensor.dim() == 2:
            bits = tensor.view(torch.int16).view(-1)
            moved = torch.randint(0, bits.numel(), (int(bits.numel() * fraction),), generator=gen)
            bits[moved] += torch.where(torch.rand(moved.numel(), generator=gen) < 0.5, 1, -1).to(torch.int16)
        out[name] = tensor
    return out


def measure(
    state, base, codec: CodecSpec, workdir: Path, chunk_bytes: int, block_bytes: int, zstd_level: int
):
    """Encode into chunk files, decode them back and verify; returns (manifest, encode s, decode s)."""
    folder = Path(tempfile.mkdtemp(dir=workdir))
    started = time.perf_counter()
    encoded = encode_payload(
        state, codec, base, folder, chunk_bytes=chunk_bytes, zstd_level=zstd_level, block_bytes=block_bytes
    )
    encode_s = time.perf_counter() - started
    model_nbytes = sum(t.numel() * t.element_size() for t in state.values())
    manifest = Manifest(
        payload_id="v2-bench",
        version=2,
        codec=codec.name,
        base_version=1 if base is not None else None,
        fallback_reason=None,
        state_digest=state_digest(state),
        lossless=codec.lossless,
        model_nbytes=model_nbytes,
        payload_digest=encoded.payload_digest,
        tensors=encoded.tensors,
        chunks=encoded.chunks,
    )
    started = time.perf_counter()
    decoded = decode_payload(manifest, lambda entry: chunk_file(folder, entry.index).read_bytes(), base)
    if codec.lossless:
        assert state_digest(decoded) == manifest.state_digest, f"{codec.name} did not round-trip"
    decode_s = time.perf_counter() - started
    for path in folder.iterdir():
        path.unlink()
    folder.rmdir()
    return manifest, encode_s, decode_s


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--intermediate", type=int, default=2816)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--changed", type=float, default=0.02, help="fraction of weights a step changes")
    parser.add_argument("--chunk-mb", type=float, default=4.0)
    parser.add_argument("--block-kb", type=int, default=64, help="delta block size")
    parser.add_argument("--zstd-level", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    first = llama_state(args.hidden, args.intermediate, args.layers, args.vocab, seed=0)
    second = training_step(first, args.changed, seed=1)
    model_nbytes = sum(t.numel() * t.element_size() for t in first.values())
    changed = sum(
        int((a.view(torch.int16) != b.view(torch.int16)).sum())
        for a, b in zip(first.values(), second.values(), strict=True)
    )
    numel = sum(t.numel() for t in first.values())
    print(
        f"model: {len(first)} bf16 tensors, {model_nbytes / MB:.1f} MB; step changes {changed / numel:.2%} of "
        f"weights; chunks {args.chunk_mb} MiB, delta blocks {args.block_kb} KiB, zstd level {args.zstd_level}, "
        f"{args.threads} torch thread(s)\n"
    )
    cases = [
        ("full model", "raw", None),
        ("full model", "zstd", None),
        ("full model", "int8", None),
        ("full model", "int8+zstd", None),
        ("1 step, base held", "zstd", None),
        ("1 step, base held", "delta", first),
        ("1 step, base held", "delta+zstd", first),
    ]
    header = f"| {'transfer':<18} | {'codec':<10} | {'wire MB':>8} | {'raw/wire':>8} | {'encode MB/s':>11} | {'decode MB/s':>11} |"
    print(header)
    print("|---|---|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as workdir:
        for transfer, codec_name, base in cases:
            state = first if transfer == "full model" else second
            manifest, encode_s, decode_s = measure(
                state,
                base,
                CodecSpec.parse(codec_name),
                Path(workdir),
                int(args.chunk_mb * (1 << 20)),
                args.block_kb << 10,
                args.zstd_level,
            )
            wire = manifest.wire_nbytes
            print(
                f"| {transfer:<18} | {codec_name:<10} | {wire / MB:>8.1f} | {model_nbytes / wire:>7.2f}x | "
                f"{model_nbytes / MB / encode_s:>11.0f} | {model_nbytes / MB / decode_s:>11.0f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
