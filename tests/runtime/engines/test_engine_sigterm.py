"""SIGTERM stops a built-in engine the way Ctrl-C would, with streams in flight: its loop takes the
signal between two callbacks, every task is cancelled, the worker stops, and it exits 130 saying
"rollflow: interrupted" (as `rollflow launch`, systemd and a docs page's `kill` stop it)."""

from __future__ import annotations

import signal
import threading
import urllib.request

from tests.runtime.engines.processes import EngineProcess

STREAMS = 4
EXIT_BOUND_S = 60  # a bound for a hang, not a speed: the engine exits in well under a second


def _stream(url: str, started: threading.Semaphore) -> None:
    body = b'{"input_ids": [5, 6, 7], "stream": true, "sampling_params": {"max_new_tokens": 2000, "ignore_eos": true}}'
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url + "/generate", body), timeout=EXIT_BOUND_S
        ) as answer:
            answer.readline()
            started.release()
            while answer.readline():
                pass
    except OSError:
        pass  # the engine went away mid-stream, as it should


def test_sigterm_with_streams_in_flight_exits_130_and_says_interrupted(tiny_model):
    engine = EngineProcess(tiny_model)
    started = threading.Semaphore(0)
    streams = [
        threading.Thread(target=_stream, args=(engine.url, started), daemon=True) for _ in range(STREAMS)
    ]
    try:
        for stream in streams:
            stream.start()
        for _ in streams:
            assert started.acquire(timeout=EXIT_BOUND_S), "".join(engine.output)
        engine.proc.send_signal(signal.SIGTERM)
        assert engine.proc.wait(timeout=EXIT_BOUND_S) == 130, "".join(engine.output)
        for stream in streams:
            stream.join(EXIT_BOUND_S)
        assert "rollflow: interrupted" in "".join(engine.output), "".join(engine.output)
    finally:
        engine.stop()
