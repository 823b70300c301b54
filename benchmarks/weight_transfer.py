"""Bytes on the wire and encode/decode speed of each weight codec, against raw.

Builds a random Llama-shaped bf16 state dict at run time (about 350M parameters, 700 MB, by
default), then a
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
(delta+zstd against the first) over HTTP and over Mooncake TCP, as the ranks of a tensor-parallel
engine do: 1, 2 and 4 ranks pulling their own slices (rollflow/runtime/weights/slices.py) at once
(one process, each rank its own puller and cache; payloads built and this process's Mooncake engine
started beforehand; the first Mooncake read of a payload includes the server copying it into
registered memory): seconds of the slowest rank, and wire and weight bytes per rank. Last, the
time an engine is out of the pool: real `rollflow engine serve --tensor-parallel N` engines (N = 1, 2,
4; the same model, 1 torch thread per rank) each take four versions through
/update_weights_from_server (full and delta, over each transport), and the seconds each call takes
are the time a rollout manager holds that engine out of the pool (pull, verify, commit on every
rank, load).

Goals: every pull gives the published weights (that rank's slices) exactly; every Mooncake pull went
over Mooncake; a rank's full pull carries at most 1.1 x the whole model's bytes / N; every engine
update ends on its version. Writes `weight_transfer.json` into `--results-dir` (see
benchmarks/results.py) and exits non-zero when a goal is missed.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.results import Results, benchmark_parser, package_version, results_dir
from rollflow.runtime.engines.tiny_model import write_tiny_model
from rollflow.runtime.launch.process import free_port, rollflow_command
from rollflow.runtime.launch.servers import ServerProcess, http
from rollflow.runtime.weights.codecs import CodecSpec
from rollflow.runtime.weights.io import Manifest
from rollflow.runtime.weights.mooncake import Unavailable, local_engine
from rollflow.runtime.weights.payload import chunk_file, decode_payload, encode_payload
from rollflow.runtime.weights.puller import PullResult, WeightPuller
from rollflow.runtime.weights.slices import shard_state
from rollflow.runtime.weights.store import WeightStore
from rollflow.runtime.weights.tensors import state_digest

MB = 1e6
RANKS = {False: (1, 2, 4), True: (1, 2)}
"""Engine ranks the transports and the engines are measured with (full run, --quick)."""


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


def start_rollflow(args: list[str], log: Path, timeout_s: float, what: str) -> ServerProcess:
    """`rollflow ARGS` on a free port once it answers /health, its output in `log`. Exits naming
    `what` when it dies or does not answer in `timeout_s`."""
    port = free_port()
    try:
        return ServerProcess(
            rollflow_command(*args, "--port", str(port)), port, log, ready_timeout_s=timeout_s
        )
    except RuntimeError as exc:
        sys.exit(f"{what} did not start: {str(exc)[-2000:]}")


def start_server(store_dir: Path, chunk_mb: float) -> ServerProcess:
    """`rollflow weights serve --mooncake tcp` on a free port, once it answers."""
    args = ["weights", "serve", "--dir", str(store_dir), "--chunk-mb", str(chunk_mb), "--mooncake", "tcp"]
    server = start_rollflow(args, store_dir.parent / "serve.log", 120, "the weight server")
    if "mooncake unavailable" in server.log_path.read_text():
        server.stop()
        sys.exit(f"the weight server cannot serve Mooncake: {server.log()}")
    return server


async def pull_over(
    url: str,
    cache: Path,
    transport: str,
    version: int,
    codec: str,
    tp: tuple[int, int],
    base: PullResult | None = None,
) -> PullResult:
    """One engine rank's pull of its slices of `version`, its chunks over `transport`."""
    async with WeightPuller(url, cache, transport=transport) as puller:
        return await puller.pull(version, codec, base=base.weights if base is not None else None, tp=tp)


async def pull_together(
    url: str,
    caches: list[Path],
    transport: str,
    version: int,
    codec: str,
    bases: list[PullResult] | None = None,
) -> list[PullResult]:
    """The ranks of one engine pulling their slices of `version` at the same time, one cache each."""
    pulls = [
        pull_over(url, cache, transport, version, codec, (len(caches), rank), bases[rank] if bases else None)
        for rank, cache in enumerate(caches)
    ]
    return list(await asyncio.gather(*pulls))


def compare_transports(
    states: list[dict[str, torch.Tensor]],
    store: WeightStore,
    url: str,
    workdir: Path,
    args: argparse.Namespace,
) -> list[list]:
    """For 1, 2 and 4 ranks (--quick: 1 and 2), each transport pulls the full model (version 1), then
    the step as a delta (version 2): one row per pull, with the slowest rank's seconds and the
    largest rank's wire and weight bytes."""
    for ranks in RANKS[args.quick]:  # built now, so no pull waits for an encode
        for rank in range(ranks):
            store.manifest(1, "zstd", tp=(ranks, rank))
            store.manifest(2, "delta+zstd", base_version=1, tp=(ranks, rank))
    if isinstance(local_engine(), Unavailable):  # started now: an engine's once-only start is no transfer
        sys.exit(f"this process cannot pull over Mooncake: {local_engine().reason}")
    rows = []
    for ranks in RANKS[args.quick]:
        for transport in ("http", "mooncake"):
            caches = [workdir / f"cache-{ranks}-{transport}-{rank}" for rank in range(ranks)]
            full = asyncio.run(pull_together(url, caches, transport, 1, "zstd"))
            delta = asyncio.run(pull_together(url, caches, transport, 2, "delta+zstd", bases=full))
            for name, results, state in (
                ("full model", full, states[0]),
                ("1 step, delta+zstd", delta, states[1]),
            ):
                wrong = sum(
                    mismatched(shard_state(state, ranks, rank), r.weights.state_dict, lossless=True) > 0
                    for rank, r in enumerate(results)
                )
                seconds = round(max(r.stats.seconds for r in results), 3)
                wire_mb = round(max(r.stats.wire_nbytes for r in results) / MB, 1)
                weights_mb = round(max(r.manifest.model_nbytes for r in results) / MB, 1)
                went = ",".join(sorted({r.stats.transport for r in results}))
                rows.append([transport, ranks, name, seconds, wire_mb, weights_mb, went, wrong])
                print("| " + " | ".join(str(cell) for cell in rows[-1]) + " |", flush=True)
    return rows


def write_model_folder(state: dict[str, torch.Tensor], folder: Path, args: argparse.Namespace) -> Path:
    """A folder `rollflow engine serve` loads holding `state`: a tiny model's tokenizer, and the
    config of the benchmark's shape (head_dim 64, one KV head per head, bf16)."""
    import json

    import safetensors.torch

    write_tiny_model(folder)
    config = json.loads((folder / "config.json").read_text())
    config |= {
        "hidden_size": args.hidden,
        "intermediate_size": args.intermediate,
        "num_hidden_layers": args.layers,
        "num_attention_heads": args.hidden // 64,
        "num_key_value_heads": args.hidden // 64,
        "vocab_size": args.vocab,
        "dtype": "bfloat16",
    }
    (folder / "config.json").write_text(json.dumps(config))
    safetensors.torch.save_file(state, str(folder / "model.safetensors"))
    return folder


def engine_out_of_pool(model: Path, url: str, workdir: Path, args: argparse.Namespace) -> list[list]:
    """Real engines of 1, 2 and 4 ranks (--quick: 1 and 2) take versions 1 (full) and 2 (delta) over
    HTTP, then 3 (full) and 4 (delta) over Mooncake; one row per update with the seconds its
    /update_weights_from_server took (the time a manager holds the engine out of the pool)."""
    rows = []
    updates = [
        (1, "zstd", "http"),
        (2, "delta+zstd", "http"),
        (3, "zstd", "mooncake"),
        (4, "delta+zstd", "mooncake"),
    ]
    for ranks in RANKS[args.quick]:
        engine = start_engine(model, ranks, workdir / f"engine-tp{ranks}.log")
        try:
            for version, codec, transport in updates:
                body = {"url": url, "weight_version": version, "codec": codec, "transport": transport}
                started = time.perf_counter()
                status, answer = http("POST", engine.url + "/update_weights_from_server", body, timeout=1800)
                seconds = round(time.perf_counter() - started, 3)
                pull = answer.get("pull", {})
                ok = status == 200 and answer.get("weight_version") == version
                ok = ok and (codec == "zstd") == (pull.get("base_version") is None)
                name = "full model" if codec == "zstd" else "1 step, delta+zstd"
                rows.append(
                    [
                        transport,
                        ranks,
                        name,
                        seconds,
                        pull.get("transport"),
                        "ok" if ok else str(answer)[:200],
                    ]
                )
                print("| " + " | ".join(str(cell) for cell in rows[-1]) + " |", flush=True)
        finally:
            engine.stop(grace_s=60)
    return rows


def start_engine(model: Path, ranks: int, log: Path) -> ServerProcess:
    """`rollflow engine serve --tensor-parallel RANKS` on a free port, once it serves."""
    args = ["engine", "serve", "--model", str(model), "--threads", "1", "--dtype", "bfloat16"]
    args += ["--tensor-parallel", str(ranks), "--max-body-mb", "1"]
    return start_rollflow(args, log, 600, f"the {ranks}-rank engine")


def main() -> None:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--intermediate", type=int, default=2816)
    parser.add_argument("--layers", type=int, help="decoder layers (22, about 350M parameters; --quick: 2)")
    parser.add_argument("--vocab", type=int, help="vocabulary (32000; --quick: 8000)")
    parser.add_argument("--changed", type=float, default=0.02, help="fraction of weights a step changes")
    parser.add_argument("--chunk-mb", type=float, default=4.0)
    parser.add_argument("--block-kb", type=int, default=64, help="delta block size")
    parser.add_argument("--zstd-level", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = parser.parse_args()
    args.layers = args.layers or (2 if args.quick else 22)
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
    transport_columns = [
        "transport",
        "engine ranks",
        "pull",
        "seconds",
        "wire MB per rank",
        "weight MB per rank",
        "went over",
        "ranks wrong",
    ]
    engine_columns = ["transport", "engine ranks", "update", "seconds out of the pool", "went over", "result"]
    print("\n| " + " | ".join(transport_columns) + " |\n|---|---:|---|---:|---:|---:|---|---:|")
    with tempfile.TemporaryDirectory() as workdir:
        workdir = Path(workdir)
        store = WeightStore(
            workdir / "store",
            chunk_bytes=int(args.chunk_mb * (1 << 20)),
            delta_block_bytes=args.block_kb << 10,
        )
        states = [first, second]
        states += [training_step(states[-1], args.changed, seed=len(states)) for _ in range(2)]
        for version, state in enumerate(states, start=1):
            store.publish(version, state)
        server = start_server(store.root, args.chunk_mb)
        url = server.url
        try:
            transport_rows = compare_transports(states, store, url, workdir, args)
            print("\n| " + " | ".join(engine_columns) + " |\n|---|---:|---|---:|---|---|")
            model = write_model_folder(first, workdir / "model", args)
            engine_rows = engine_out_of_pool(model, url, workdir, args)
        finally:
            server.stop()
    results.peers["mooncake-transfer-engine-non-cuda"] = package_version("mooncake-transfer-engine-non-cuda")
    full_wire = {  # the whole model's full pull: what 1 rank carries
        transport: next(r[4] for r in transport_rows if r[:3] == [transport, 1, "full model"])
        for transport in ("http", "mooncake")
    }
    share = max(r[4] / (full_wire[r[0]] / r[1]) for r in transport_rows if r[2] == "full model")
    results.figures = {
        "transports": [dict(zip(transport_columns, row, strict=True)) for row in transport_rows],
        "engines": [dict(zip(engine_columns, row, strict=True)) for row in engine_rows],
        "settings": {k: getattr(args, k) for k in ("hidden", "intermediate", "layers", "vocab", "changed")}
        | {"chunk_mb": args.chunk_mb, "block_kb": args.block_kb, "zstd_level": args.zstd_level},
        "model_mb": model_nbytes / MB,
        "step_changed_fraction": changed / numel,
        "cases": [dict(zip(columns, row, strict=True)) for row in rows],
    }
    results.table(f"Each codec on a {model_nbytes / MB:.0f} MB bf16 model, one process", columns, rows)
    results.table(
        "HTTP and Mooncake TCP pulls from a weight server process on 127.0.0.1, each rank of a "
        "tensor-parallel engine pulling its own slices at once (seconds: the slowest rank; MB: the largest rank)",
        transport_columns,
        transport_rows,
    )
    results.table(
        "Real tensor-parallel engines taking a version through /update_weights_from_server: the seconds "
        "a rollout manager holds them out of the pool",
        engine_columns,
        engine_rows,
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
        "transports: rank pulls not giving that rank's published slices",
        sum(r[7] for r in transport_rows),
        "==",
        0,
    )
    results.goal(
        "mooncake pulls that went over http instead",
        sum(r[0] == "mooncake" and r[6] != "mooncake" for r in transport_rows)
        + sum(r[0] == "mooncake" and r[4] != "mooncake" for r in engine_rows),
        "==",
        0,
    )
    results.goal("full pull: wire bytes per rank / (whole model's / N)", share, "<=", 1.1, headline=True)
    results.goal(
        "engine updates that did not end on their version", sum(r[5] != "ok" for r in engine_rows), "==", 0
    )
    sys.exit(results.finish())


if __name__ == "__main__":
    main()
