"""Bad inputs against a live manager, two built-in engines and a weight server, while a
background client keeps making valid calls.

    .venv/bin/python benchmarks/hostile_inputs.py [--model models/tiny]

Each bad input is sent once; it counts as "4xx with a clear message" when the answer is a 4xx
whose body carries an error message, as "5xx" on a 5xx, and as an outage when afterwards a
server's health check fails or an engine has left the manager's pool. Prints the counts the
hardening issue asks for (goal: 0 5xx, 0 outages) and the background client's calls.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

TOKEN, API_KEY, WEIGHTS_TOKEN = "manager-token", "engine-key", "weights-token"
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def raw_request(url: str, method: str, path: str, body: bytes = b"", headers: dict[str, bytes] | None = None):
    """(status, body bytes) of one HTTP/1.1 request written by hand, so any bytes can be sent."""
    parts = urlsplit(url)
    head = f"{method} {path} HTTP/1.1\r\nHost: {parts.netloc}\r\nConnection: close\r\n".encode()
    for name, value in (headers or {}).items():
        head += name.encode() + b": " + value + b"\r\n"
    head += f"Content-Length: {len(body)}\r\n\r\n".encode()
    with socket.create_connection((parts.hostname, parts.port), timeout=120) as sock:
        sock.sendall(head + body)
        data = b""
        while chunk := sock.recv(1 << 16):
            data += chunk
    status = int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/") else 0
    return status, data.split(b"\r\n\r\n", 1)[-1]


def get_json(url: str, token: str | None = None):
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def start(argv: list[str], log: Path, env: dict | None = None) -> subprocess.Popen:
    out = open(log, "wb")  # noqa: SIM115 - lives as long as the process
    return subprocess.Popen(
        [sys.executable, "-m", "rollflow.cli", *argv], env=env or ENV, stdout=out, stderr=out
    )


def wait_up(url: str, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url, timeout=2).read()
            return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"{url} did not come up")


def bad_inputs(manager: str, engine: str, weights: str) -> list[tuple[str, str, str, str, bytes, dict]]:
    """(category, server url, method, path, body, headers) of every bad input."""
    auth = {"Authorization": f"Bearer {TOKEN}".encode()}
    key = {"Authorization": f"Bearer {API_KEY}".encode()}
    wauth = {"Authorization": f"Bearer {WEIGHTS_TOKEN}".encode()}

    def gen(**sampling) -> bytes:
        return json.dumps({"input_ids": [5, 6], "sampling_params": {"max_new_tokens": 4} | sampling}).encode()

    cases = []
    for name, url, headers in (("manager", manager, {}), ("engine", engine, key)):
        for label, body in [
            ("JSON nested 200,000 deep", b"[" * 200_000),
            ("lone surrogate in text", b'{"text": "\\ud800"}'),
            ("non-UTF-8 inside a JSON string", b'{"text": "caf\xe9"}'),
            ("non-UTF-8 body", b"\xff\xfe\xfd"),
            ("malformed JSON", b'{"input_ids": [1,'),
            ("JSON array body", b"[1, 2, 3]"),
            ("unknown field", b'{"input_ids": [1], "bogus": 1}'),
            ("seed 2**70", gen(sampling_seed=2**70)),
            ("temperature Infinity", b'{"input_ids": [1], "sampling_params": {"temperature": Infinity}}'),
            ("top_p NaN", b'{"input_ids": [1], "sampling_params": {"top_p": NaN}}'),
            ("negative max_new_tokens", gen(max_new_tokens=-5)),
            ("token id 2**40", json.dumps({"input_ids": [2**40]}).encode()),
            ("negative token id", json.dumps({"input_ids": [-1]}).encode()),
            ("empty input_ids", json.dumps({"input_ids": []}).encode()),
            ("string max_new_tokens", gen(max_new_tokens="many")),
            ("70 MB body", b'{"input_ids": [' + b"1," * (35 << 20) + b"1]}"),
        ]:
            cases.append((f"{name}: {label}", url, "POST", "/generate", body, headers))
    for label, value in [("non-UTF-8", b"Bearer \xff\xfe"), ("wrong", b"Bearer nope"), ("no scheme", b"x")]:
        for method, path in [
            ("POST", "/workers"),
            ("POST", "/batches/x/next"),
            ("DELETE", "/batches/x"),
            ("POST", "/step_report"),
        ]:
            cases.append(
                (
                    f"manager: {label} token on {method} {path}",
                    manager,
                    method,
                    path,
                    b"{}",
                    {"Authorization": value},
                )
            )
        cases.append(
            (
                f"engine: {label} api key on /abort_request",
                engine,
                "POST",
                "/abort_request",
                b'{"abort_all": true}',
                {"Authorization": value},
            )
        )
        cases.append(
            (
                f"weights: {label} token on publish",
                weights,
                "PUT",
                "/v1/versions/5",
                b"x",
                {"Authorization": value},
            )
        )
    for method, path in [
        ("POST", "/batches/x/flush"),
        ("DELETE", "/workers/0"),
        ("POST", "/workers/0/update_weights"),
    ]:
        cases.append((f"manager: no token on {method} {path}", manager, method, path, b"{}", {}))
    for path in ["/update_weights_from_disk", "/update_weights_from_server", "/pause_generation"]:
        cases.append((f"engine: no api key on {path}", engine, "POST", path, b"{}", {}))
    cases += [
        (
            "manager: register a duplicate (localhost spelling)",
            manager,
            "POST",
            "/workers",
            json.dumps(
                {
                    "url": engine.replace("127.0.0.1", "localhost") + "/",
                    "engine_type": "builtin",
                    "api_key": API_KEY,
                }
            ).encode(),
            auth,
        ),
        (
            "manager: register a url nobody serves",
            manager,
            "POST",
            "/workers",
            json.dumps({"url": f"http://127.0.0.1:{free_port()}"}).encode(),
            auth,
        ),
        ("manager: next on an unknown batch", manager, "POST", "/batches/nope/next", b"{}", auth),
        (
            "manager: bubble above step time",
            manager,
            "POST",
            "/step_report",
            b'{"step_time_s": 1, "bubble_s": 2}',
            auth,
        ),
        ("manager: samples in an unknown order", manager, "GET", "/batches/nope/samples?order=x", b"", auth),
        ("weights: version 100000000", weights, "PUT", "/v1/versions/100000000", b"x", wauth),
        ("weights: version not a number", weights, "PUT", "/v1/versions/abc", b"x", wauth),
        ("weights: upload that is not safetensors", weights, "PUT", "/v1/versions/1", b"\xff" * 100, wauth),
        ("weights: manifest of an unknown version", weights, "GET", "/v1/manifest?version=77", b"", {}),
        ("weights: bad query", weights, "GET", "/v1/versions?wait_s=-1", b"", {}),
        (
            "engine: update from a path that does not exist",
            engine,
            "POST",
            "/update_weights_from_disk",
            b'{"model_path": "/nonexistent"}',
            key,
        ),
    ]
    return cases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="model folder (default: one made by `rollflow engine init-model`)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="hostile-"))
    model = args.model or str(work / "model")
    if args.model is None:
        subprocess.run(
            [sys.executable, "-m", "rollflow.cli", "engine", "init-model", model],
            env=ENV,
            check=True,
            capture_output=True,
        )
    processes = []
    try:
        engines = []
        for index in range(2):
            port = free_port()
            argv = ["engine", "serve", "--model", model, "--port", str(port), "--read-timeout-s", "5"]
            processes.append(
                start(argv, work / f"engine{index}.log", ENV | {"ROLLFLOW_ENGINE_API_KEY": API_KEY})
            )
            engines.append(f"http://127.0.0.1:{port}")
        wport = free_port()
        processes.append(
            start(
                ["weights", "serve", "--dir", str(work / "store"), "--port", str(wport)],
                work / "weights.log",
                ENV | {"ROLLFLOW_WEIGHTS_TOKEN": WEIGHTS_TOKEN},
            )
        )
        weights = f"http://127.0.0.1:{wport}"
        mport = free_port()
        config = work / "manager.yaml"
        config.write_text(
            json.dumps(
                {
                    "engines": [{"url": e, "engine_type": "builtin", "api_key": API_KEY} for e in engines],
                    "stall_timeout_s": 5,
                }
            )
        )
        processes.append(
            start(
                ["manager", "serve", "--config", str(config), "--port", str(mport), "--token", TOKEN],
                work / "manager.log",
            )
        )
        manager = f"http://127.0.0.1:{mport}"
        for url in [*[e + "/health" for e in engines], weights + "/health", manager + "/health"]:
            wait_up(url)

        stop = threading.Event()
        background = {"ok": 0, "failed": 0}

        def client() -> None:
            body = json.dumps(
                {
                    "input_ids": [11, 12, 13],
                    "sampling_params": {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True},
                }
            ).encode()
            while not stop.is_set():
                try:
                    status, answer = raw_request(
                        manager, "POST", "/generate", body, {"Content-Type": b"application/json"}
                    )
                    ok = status == 200 and json.loads(answer)["meta_info"]["finish_reason"] == {
                        "type": "length"
                    }
                except (OSError, ValueError):
                    ok = False
                background["ok" if ok else "failed"] += 1

        threads = [threading.Thread(target=client, daemon=True) for _ in range(2)]
        for thread in threads:
            thread.start()

        def outages() -> list[str]:
            down = []
            for url in [*[e + "/health" for e in engines], weights + "/health", manager + "/health"]:
                try:
                    urllib.request.urlopen(url, timeout=10).read()
                except OSError:
                    down.append(url)
            try:
                states = [w["state"] for w in get_json(manager + "/workers?include_failed=true")["workers"]]
                down += [f"engine {i} {s}" for i, s in enumerate(states) if s != "healthy"]
            except OSError:
                pass
            return down

        tried = clear = server_errors = other = 0
        outage_log = []
        for label, url, method, path, body, headers in bad_inputs(manager, engines[0], weights):
            tried += 1
            try:
                status, answer = raw_request(url, method, path, body, headers)
            except OSError as exc:
                status, answer = 0, str(exc).encode()
            message = ""
            try:
                error = json.loads(answer).get("error")
                message = error.get("message") if isinstance(error, dict) else error
            except (ValueError, AttributeError):
                pass
            if 400 <= status < 500 and message:
                clear += 1
            elif status >= 500:
                server_errors += 1
                print(f"5xx  {status} {label}: {answer[:200]!r}")
            else:
                other += 1
                print(f"other {status} {label}: {answer[:200]!r}")
            down = outages()
            if down:
                outage_log.append((label, down))
                print(f"OUTAGE after {label}: {down}")
        time.sleep(2)
        stop.set()
        for thread in threads:
            thread.join(60)
        print(f"bad inputs tried:            {tried}")
        print(f"4xx with a clear message:    {clear}")
        print(f"5xx:                         {server_errors}")
        print(f"other answers:               {other}")
        print(f"outages:                     {len(outage_log)}")
        print(f"background calls completed:  {background['ok']} of {background['ok'] + background['failed']}")
    finally:
        for process in processes:
            process.kill()
            process.wait()


if __name__ == "__main__":
    main()
