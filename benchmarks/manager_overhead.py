"""What the rollout manager costs per request, against calling engines directly and against sglang-router.

    python benchmarks/manager_overhead.py [--requests 400] [--concurrency 32] [--backend instant|builtin]

Two backends:
- `instant` (default): an HTTP server on 127.0.0.1 that answers SGLang's /generate at once with
  a fixed stream of tokens. It isolates what the routers add: with a real engine, generation
  time drowns the router's microseconds. This is the usual way to measure a proxy.
- `builtin`: rollflow's built-in CPU engine on a tiny model, as a sanity check that the ranking
  holds on a real engine (the numbers are then dominated by the engine).

Each path (direct to one engine, through `rollflow manager`, through `sglang-router`) gets the
same requests: latency p50/p99 at concurrency 1, and requests/s at `--concurrency`.
Prints a table and the ratios the issue asks for (added p50 latency; throughput vs sglang-router).

Then a preemption run: the manager streams long samples from two built-in engines, one is
killed with SIGKILL, and the manager's own histogram gives the time from detecting the death
to each moved sample's first token elsewhere; the regenerated-token counter must stay 0.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import aiohttp
from aiohttp import web

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.runtime.processes import ENV, Process, free_port, rollflow, start_engine  # noqa: E402

TOKENS_PER_REQUEST = 8


class InstantEngine:
    """SGLang's /generate answered with no generation work, on its own thread and event loop."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._loop = asyncio.new_event_loop()
        ready = threading.Event()
        threading.Thread(target=self._run, args=(ready,), daemon=True).start()
        ready.wait(10)

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.add_routes(
            [
                web.post("/generate", self._generate),
                web.get("/health", self._ok),
                web.get("/get_model_info", self._model_info),
                web.get("/get_weight_version", self._version),
                web.post("/abort_request", self._ok),
            ]
        )
        runner = web.AppRunner(app, access_log=None)
        self._loop.run_until_complete(runner.setup())
        self._loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", self.port).start())
        ready.set()
        self._loop.run_forever()

    async def _ok(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _model_info(self, request: web.Request) -> web.Response:
        return web.json_response({"model_path": "instant", "weight_version": 0})

    async def _version(self, request: web.Request) -> web.Response:
        return web.json_response({"weight_version": 0})

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        n = body.get("sampling_params", {}).get("max_new_tokens", TOKENS_PER_REQUEST)
        ids = list(range(1, n + 1))
        meta = {
            "id": body.get("rid") or "x",
            "prompt_tokens": len(body.get("input_ids", [])),
            "completion_tokens": n,
            "finish_reason": {"type": "length"},
            "output_token_logprobs": [[-0.5, t, None] for t in ids],
            "weight_version": 0,
        }
        payload = {"text": "", "output_ids": ids, "meta_info": meta}
        if not body.get("stream"):
            return web.json_response(payload)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(f"data: {json.dumps(payload)}\n\ndata: [DONE]\n\n".encode())
        return response


def _start_sglang_router(worker_urls: list[str], log_dir: Path) -> Process:
    port = free_port()
    argv = [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--policy", "round_robin", "--worker-urls", *worker_urls, "--disable-health-check"]
    return Process(argv, port, log_dir / "sglang-router.log", ready_path="/health")


async def _one(session: aiohttp.ClientSession, url: str, prompt: list[int]) -> float:
    body = {"input_ids": prompt, "sampling_params": {"max_new_tokens": TOKENS_PER_REQUEST, "temperature": 0}}
    started = time.perf_counter()
    async with session.post(url + "/generate", json=body) as response:
        answer = await response.json()
        if response.status != 200 or len(answer["output_ids"]) != TOKENS_PER_REQUEST:
            raise RuntimeError(f"{url}: bad answer {response.status}: {answer}")
    return time.perf_counter() - started


async def _measure(url: str, requests: int, concurrency: int) -> dict:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        for _ in range(20):  # warm up connections and caches
            await _one(session, url, [1, 2, 3])
        latencies = [await _one(session, url, [1, 2, 3, i % 50]) for i in range(requests)]
        queue = asyncio.Queue()
        for i in range(requests * 2):
            queue.put_nowait(i)

        async def worker() -> None:
            while not queue.empty():
                i = queue.get_nowait()
                await _one(session, url, [4, 5, i % 50])

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    latencies.sort()
    return {
        "p50_ms": 1000 * statistics.median(latencies),
        "p99_ms": 1000 * latencies[int(0.99 * (len(latencies) - 1))],
        "rps": requests * 2 / elapsed,
    }


def _start_manager(engine_urls: list[str], tmp: Path, **config) -> Process:
    import yaml

    port = free_port()
    path = tmp / "manager.yaml"
    path.write_text(
        yaml.safe_dump({"engines": [{"url": u, "capacity": 1024} for u in engine_urls], **config})
    )
    return Process(
        rollflow("manager", "serve", "--config", str(path), "--port", str(port)), port, tmp / "manager.log"
    )


def overhead(args: argparse.Namespace, tmp: Path) -> None:
    if args.backend == "instant":
        backends = [InstantEngine() for _ in range(2)]
        urls = [b.url for b in backends]
        engines = []
    else:
        model = tmp / "model"
        subprocess.run(
            [sys.executable, "-m", "rollflow.cli", "engine", "init-model", str(model)], env=ENV, check=True
        )
        engines = [start_engine(model, tmp, name=f"engine{i}") for i in range(2)]
        urls = [e.url for e in engines]
    manager = _start_manager(urls, tmp, router="round_robin")
    router = _start_sglang_router(urls, tmp) if _has_sglang_router() else None
    try:
        rows = {"direct (one engine)": asyncio.run(_measure(urls[0], args.requests, args.concurrency))}
        rows["rollflow manager"] = asyncio.run(_measure(manager.url, args.requests, args.concurrency))
        if router is not None:
            rows["sglang-router"] = asyncio.run(_measure(router.url, args.requests, args.concurrency))
    finally:
        for process in [manager, *engines, *([router] if router else [])]:
            process.stop()
    print(f"\nbackend={args.backend} requests={args.requests} concurrency={args.concurrency} (one run)")
    print(f"{'path':<22}{'p50 ms':>10}{'p99 ms':>10}{'req/s':>10}")
    for name, row in rows.items():
        print(f"{name:<22}{row['p50_ms']:>10.3f}{row['p99_ms']:>10.3f}{row['rps']:>10.0f}")
    direct, ours = rows["direct (one engine)"], rows["rollflow manager"]
    print(f"\nmanager added latency p50: {ours['p50_ms'] - direct['p50_ms']:.3f} ms (goal < 1 ms)")
    print(f"manager added latency p99: {ours['p99_ms'] - direct['p99_ms']:.3f} ms")
    if "sglang-router" in rows:
        peer = rows["sglang-router"]
        print(f"sglang-router added latency p50: {peer['p50_ms'] - direct['p50_ms']:.3f} ms")
        print(f"throughput manager / sglang-router: {ours['rps'] / peer['rps']:.2f}x (goal >= 0.5x)")


def _has_sglang_router() -> bool:
    try:
        import sglang_router  # noqa: F401
    except ImportError:
        print("sglang-router is not installed (pip install sglang-router): skipping the peer")
        return False
    return True


def preemption(args: argparse.Namespace, tmp: Path) -> None:
    from rollflow.runtime.manager.client import ManagerClient
    from tests.runtime.manager.helpers import metric, wait_until, workers

    model = tmp / "model"
    if not model.exists():
        subprocess.run(
            [sys.executable, "-m", "rollflow.cli", "engine", "init-model", str(model)], env=ENV, check=True
        )
    engines = [start_engine(model, tmp, name=f"preempt{i}") for i in range(2)]
    manager = _start_manager([e.url for e in engines], tmp, router="least_outstanding")
    try:
        client = ManagerClient(manager.url)
        batch = client.submit(
            [[i + 1, 2, 3] for i in range(8)], n=1, max_new_tokens=200, temperature=0, ignore_eos=True
        )
        wait_until(lambda: workers(manager)[engines[0].url]["tokens_generated"] > 20, what="tokens")
        killed_at = time.perf_counter()
        os.kill(engines[0].proc.pid, signal.SIGKILL)
        samples = [s for mb in batch.micro_batches() for g in mb for s in g]
        done_at = time.perf_counter()
        moved = [s for s in samples if s["resumes"]]
        count = metric(manager, "rollflow_resume_delay_seconds_count")
        total = metric(manager, "rollflow_resume_delay_seconds_sum")
        regenerated = metric(manager, "rollflow_regenerated_tokens_total")
    finally:
        for process in [manager, *engines]:
            process.stop()
    print(f"\npreemption: {len(moved)} of {len(samples)} samples moved after SIGKILL of one of two engines")
    print(
        f"detection -> first token elsewhere, mean over moved samples: {1000 * total / max(count, 1):.1f} ms (goal < 100 ms)"
    )
    print(f"kill -> batch done: {done_at - killed_at:.2f} s; tokens regenerated: {regenerated:.0f} (goal 0)")


def main() -> None:
    # sglang-router probes workers with an HTTP/2 preface before falling back to HTTP/1.1; the
    # instant engine's aiohttp server logs each probe as a bad request. They are not errors here.
    logging.getLogger("aiohttp.server").setLevel(logging.CRITICAL)
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--backend", choices=("instant", "builtin"), default="instant")
    parser.add_argument("--skip-preemption", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        overhead(args, Path(tmp))
        if not args.skip_preemption:
            preemption(args, Path(tmp))


if __name__ == "__main__":
    main()
