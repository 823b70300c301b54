"""Bytes on the wire and encode/decode speed of each weight codec, against raw.

Builds a random Llama-shaped bf16 state dict at run time (about 330 MB by default), then a
"training step" of it in which a fraction of every matrix's weights moves by one bf16 ulp (what
a small optimizer update does to bf16 weights: most round back to the same value). Each codec
encodes into chunk files exactly as the weight server does, and decodes them exactly as a puller
does (per-chunk checksums, zstd, the stream digest, and the exact-tensor digest for lossless
codecs). MB/s are megabytes of model weights per second, one process.

    .venv/bin/python benchmarks/weight_transfer.py
    .venv/bin/python benchmarks/weight_transfer.py --layers 4 --changed 0.01
    .venv/bin/python benchmarks/weight_transfer.py --quick   # 2 layers, a vocabulary of 8,000: about 85 MB

Goals (docs/guides/weights.md): every lossless codec round-trips bit for bit (the stream and tensor
digests, and the tensors compared); every int8 element within the documented bound
amax_row * (1/254 + 2^-8) of its bf16 weight, vectors exact; and after one training step with its
base held, `delta+zstd` sends at most a tenth of the bytes `zstd` sends (it compresses the XOR's
zeros away).

Then the two transports, between real processes on 127.0.0.1: a `rollflow weights serve --mooncake
tcp` process serves both versions, and this process pulls the full model (zstd) and the step
(delta+zstd against the first) over HTTP and over Mooncake TCP: seconds and wire bytes of each pull
for 1, 2 and 4 engines pulling at once (--quick: 1 and 2; one process, each engine its own puller and
cache; payloads built and this process's Mooncake engine started beforehand; the first Mooncake
read of a payload includes the server copying it into registered memory). Goals: every pull gives the published weights exactly, and every Mooncake
pull went over Mooncake. Writes `weight_transfer.json` into `--results-dir` (see benchmarks/results.py) and
exits non-zero when a goal is missed.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.results import Results, add_results_dir, package_version, results_dir
from rollflow.runtime.weights.codecs import CodecSpec
from rollflow.runtime.weights.io import Manifest
from rollflow.runtime.weights.mooncake import Unavailable, local_engine
from rollflow.runtime.weights.payload import chunk_file, decode_payload, encode_payload
from rollflow.runtime.weights.puller import PullResult, WeightPuller
from rollflow.runtime.weights.store import WeightStore
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
    """Encode into chunk files, decode them back; returns (manifest, decoded state, encode s, decode s)."""
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
    decode_s = time.perf_counter() - started
    for path in folder.iterdir():
        path.unlink()
    folder.rmdir()
    return manifest, decoded, encode_s, decode_s


def mismatched(state: dict[str, torch.Tensor], decoded: dict[str, torch.Tensor], lossless: bool) -> int:
    """Elements of `decoded` that break the codec's promise for `state`: any difference for a
    lossless codec; for int8, a matrix element further than amax_row * (1/254 + 2^-8) from its bf16
    weight (docs/guides/weights.md) or a vector element that differs. A missing tensor counts whole."""
    wrong = 0
    for name, tensor in state.items():
        got = decoded.get(name)
        if got is None or got.shape != tensor.shape or got.dtype != tensor.dtype:
            wrong += tensor.numel()
        elif lossless or tensor.dim() == 1:
            wrong += int((got.view(torch.int16) != tensor.view(torch.int16)).sum())
        else:
            weights = tensor.float()
            bound = weights.abs().amax(dim=1, keepdim=True) * (1 / 254 + 2**-8)
            wrong += int(((got.float() - weights).abs() > bound).sum())
    return wrong


def start_server(store_dir: Path, chunk_mb: float) -> tuple[subprocess.Popen, str]:
    """`rollflow weights serve --mooncake tcp` on a free port, once it listens; (process, url)."""
    log = store_dir.parent / "serve.log"
    argv = [sys.executable, "-m", "rollflow.cli", "weights", "serve", "--dir", str(store_dir)]
    argv += ["--port", "0", "--chunk-mb", str(chunk_mb), "--mooncake", "tcp"]
    with open(log, "w") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None:
        text = log.read_text()
        if " on http://" in text:
            if "mooncake unavailable" in text:
                process.kill()
                sys.exit(f"the weight server cannot serve Mooncake: {text}")
            return process, "http://" + text.split(" on http://")[1].split()[0]
        time.sleep(0.1)
    process.kill()
    sys.exit(f"the weight server did not start: {log.read_text()}")


async def pull_over(
    url: str, cache: Path, transport: str, version: int, codec: str, base: PullResult | None = None
) -> PullResult:
    """One engine's pull of `version`, its chunks over `transport`."""
    async with WeightPuller(url, cache, transport=transport) as puller:
        return await puller.pull(version, codec, base=base.weights if base is not None else None)


async def pull_together(
    url: str,
    caches: list[Path],
    transport: str,
    version: int,
    codec: str,
    bases: list[PullResult] | None = None,
) -> list[PullResult]:
    """Engines pulling `version` at the same time, one cache each (as engines on one server do)."""
    pulls = [
        pull_over(url, cache, transport, version, codec, bases[i] if bases else None)
        for i, cache in enumerate(caches)
    ]
    return list(await asyncio.gather(*pulls))


def compare_transports(
    first: dict[str, torch.Tensor], second: dict[str, torch.Tensor], workdir: Path, args: argparse.Namespace
) -> list[list]:
    """For 1, 2 and 4 engines at once (--quick: 1 and 2), each transport pulls the full model, then the
    step as a delta: one row per pull, with the slowest engine's seconds and one engine's wire bytes."""
    store_dir = workdir / "store"
    store = WeightStore(
        store_dir, chunk_bytes=int(args.chunk_mb * (1 << 20)), delta_block_bytes=args.block_kb << 10
    )
    store.publish(1, first)
    store.publish(2, second)
    store.manifest(2, "delta+zstd", base_version=1)  # built now, so neither transport's pull builds it
    if isinstance(local_engine(), Unavailable):  # started now: an engine's once-only start is no transfer
        sys.exit(f"this process cannot pull over Mooncake: {local_engine().reason}")
    process, url = start_server(store_dir, args.chunk_mb)
    rows = []
    try:
        for engines in (1, 2) if args.quick else (1, 2, 4):
            for transport in ("http", "mooncake"):
                caches = [workdir / f"cache-{engines}-{transport}-{i}" for i in range(engines)]
                full = asyncio.run(pull_together(url, caches, transport, 1, "zstd"))
                delta = asyncio.run(pull_together(url, caches, transport, 2, "delta+zstd", bases=full))
                for name, results, state in (
                    ("full model", full, first),
                    ("1 step, delta+zstd", delta, second),
                ):
                    wrong = sum(mismatched(state, r.weights.state_dict, lossless=True) > 0 for r in results)
                    seconds = round(max(r.stats.seconds for r in results), 3)
                    wire_mb = round(results[0].stats.wire_nbytes / MB, 1)
                    went = ",".join(sorted({r.stats.transport for r in results}))
                    rows.append([transport, engines, name, seconds, wire_mb, went, wrong])
                    print("| " + " | ".join(str(cell) for cell in rows[-1]) + " |", flush=True)
    finally:
        process.kill()
        process.wait()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--intermediate", type=int, default=2816)
    parser.add_argument("--layers", type=int, help="decoder layers (8; --quick: 2)")
    parser.add_argument("--vocab", type=int, help="vocabulary (32000; --quick: 8000)")
    parser.add_argument("--changed", type=float, default=0.02, help="fraction of weights a step changes")
    parser.add_argument("--chunk-mb", type=float, default=4.0)
    parser.add_argument("--block-kb", type=int, default=64, help="delta block size")
    parser.add_argument("--zstd-level", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    add_results_dir(parser)
    args = parser.parse_args()
    args.layers = args.layers or (2 if args.quick else 8)
    args.vocab = args.vocab or (8000 if args.quick else 32000)
    torch.set_num_threads(args.threads)
    results = Results("weight_transfer", results_dir(args))

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
    columns = ["transfer", "codec", "wire MB", "raw/wire", "encode MB/s", "decode MB/s", "elements wrong"]
    print("| " + " | ".join(columns) + " |")
    print("|---|---|---:|---:|---:|---:|---:|")
    rows, wire_of = [], {}
    with tempfile.TemporaryDirectory() as workdir:
        for transfer, codec_name, base in cases:
            state = first if transfer == "full model" else second
            codec = CodecSpec.parse(codec_name)
            manifest, decoded, encode_s, decode_s = measure(
                state,
                base,
                codec,
                Path(workdir),
                int(args.chunk_mb * (1 << 20)),
                args.block_kb << 10,
                args.zstd_level,
            )
            digest_ok = not codec.lossless or state_digest(decoded) == manifest.state_digest
            wrong = mismatched(state, decoded, codec.lossless) + (0 if digest_ok else 1)
            wire = wire_of[transfer, codec_name] = manifest.wire_nbytes
            row = [transfer, codec_name, round(wire / MB, 1), round(model_nbytes / wire, 2)]
            row += [round(model_nbytes / MB / encode_s), round(model_nbytes / MB / decode_s), wrong]
            rows.append(row)
            print("| " + " | ".join(str(cell) for cell in row) + " |", flush=True)
    print(
        "\n| transport | engines | pull | seconds | wire MB per engine | went over | weights wrong |"
        "\n|---|---:|---|---:|---:|---|---:|"
    )
    with tempfile.TemporaryDirectory() as workdir:
        transport_rows = compare_transports(first, second, Path(workdir), args)
    results.peers["mooncake-transfer-engine-non-cuda"] = package_version("mooncake-transfer-engine-non-cuda")
    transport_columns = [
        "transport",
        "engines",
        "pull",
        "seconds",
        "wire MB per engine",
        "went over",
        "weights wrong",
    ]
    results.figures = {
        "transports": [dict(zip(transport_columns, row, strict=True)) for row in transport_rows],
        "settings": {k: getattr(args, k) for k in ("hidden", "intermediate", "layers", "vocab", "changed")}
        | {"chunk_mb": args.chunk_mb, "block_kb": args.block_kb, "zstd_level": args.zstd_level},
        "model_mb": model_nbytes / MB,
        "step_changed_fraction": changed / numel,
        "cases": [dict(zip(columns, row, strict=True)) for row in rows],
    }
    results.table(f"Each codec on a {model_nbytes / MB:.0f} MB bf16 model, one process", columns, rows)
    results.table(
        "HTTP and Mooncake TCP pulls from a weight server process on 127.0.0.1, engines pulling at once "
        "(seconds: the slowest engine)",
        transport_columns,
        transport_rows,
    )
    lossless_wrong = sum(row[6] for row in rows if CodecSpec.parse(row[1]).lossless)
    int8_wrong = sum(row[6] for row in rows if not CodecSpec.parse(row[1]).lossless)
    results.goal(
        "lossless codecs: elements not round-tripped bit for bit", lossless_wrong, "==", 0, headline=True
    )
    results.goal("int8: elements outside amax_row * (1/254 + 2^-8)", int8_wrong, "==", 0)
    results.goal(
        "1 step, base held: delta+zstd wire bytes / zstd's",
        wire_of["1 step, base held", "delta+zstd"] / wire_of["1 step, base held", "zstd"],
        "<=",
        0.1,
        headline=True,
    )
    results.goal(
        "transports: pulls not giving the published weights", sum(r[6] for r in transport_rows), "==", 0
    )
    results.goal(
        "mooncake pulls that went over http instead",
        sum(r[0] == "mooncake" and r[5] != "mooncake" for r in transport_rows),
        "==",
        0,
    )
    sys.exit(results.finish())


if __name__ == "__main__":
    main()
