"""`rollflow manager serve`: run the rollout manager."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Coroutine
from typing import Any

from rollflow.cli_util import add_command, add_config_arguments, add_listen_arguments, add_secret_argument
from rollflow.runtime.manager.token import TOKEN_ENV

EXAMPLES = """examples:
  rollflow manager serve --port 30100
  rollflow manager serve --config examples/manager/local.yaml --token "$ROLLFLOW_MANAGER_TOKEN"
  rollflow manager serve --config examples/manager/local.yaml router=least_tokens offload.enabled=true
  rollflow manager serve --config examples/manager/local.yaml --journal run/manager.journal
      (killed, the same command carries on from the journal: batches, tokens, engines)
  rollflow manager serve --config examples/manager/local.yaml --processes 3
      (the engines' token streams read by 2 more processes, on 2 more cores)

  rollflow manager relay --host 10.0.0.2 --port 30200 --token "$ROLLFLOW_MANAGER_TOKEN"
      (on an engine's node; the engine registers with "relay": "10.0.0.2:30200" beside its url)

then, from anywhere on the machine:
  curl -X POST localhost:30100/workers -H 'Authorization: Bearer T' -d '{"url": "http://127.0.0.1:30000", "kind": "spot"}'
  curl localhost:30100/generate -d '{"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 16}}'
"""


def register(group: argparse.ArgumentParser) -> None:
    serve = add_command(group, "serve", _serve, examples=EXAMPLES)
    add_config_arguments(
        serve, "YAML config (see examples/manager/); defaults work without one", required=False
    )
    add_listen_arguments(serve, 30100, in_config=True)
    add_secret_argument(
        serve,
        "--token",
        TOKEN_ENV,
        "bearer token for the admin and trainer routes: workers, batches, step reports, reading "
        "or closing sessions",
    )
    serve.add_argument(
        "--journal",
        metavar="PATH",
        help="SQLite journal of the manager's state (config key `journal`); started again on it, the "
        "manager carries on from where it stopped; one manager per journal (a second one on it refuses to start)",
    )
    serve.add_argument(
        "--processes",
        type=int,
        metavar="N",
        help="OS processes to run as (config key `processes`, default 1): N > 1 reads the engines' "
        "token streams in N - 1 stream processes, so the per-token work uses more cores",
    )
    _add_log_format(serve)

    relay = add_command(group, "relay", _relay, examples=EXAMPLES)
    add_listen_arguments(relay, 30200)
    add_secret_argument(relay, "--token", TOKEN_ENV, "the manager's token, which it greets the relay with")
    relay.add_argument(
        "--flush-ms",
        type=float,
        default=10.0,
        help="how often the streams' tokens go to the manager (default 10)",
    )
    relay.add_argument(
        "--connect-timeout-s", type=float, default=5.0, help="how long a connection to an engine may take"
    )
    _add_log_format(relay)


def _add_log_format(parser: argparse.ArgumentParser) -> None:
    """`--log-format`, one option for the manager and its relays, so their logs read alike."""
    parser.add_argument("--log-format", choices=("text", "json"), default="text", help="log line format")


def _serve(args: argparse.Namespace, started_at: float) -> None:
    """serve the manager's HTTP API

    Serve the rollout manager. Engines register with POST /workers (or are listed under `engines:`
    in the config); trainers submit batches and read micro-batches; SGLang clients may call POST
    /generate as on one engine. Binds 127.0.0.1 unless --host says otherwise.
    """
    from rollflow.config import load_config
    from rollflow.runtime.manager.config import ManagerConfig
    from rollflow.runtime.manager.edge.server import serve

    overrides = list(args.overrides)
    for key in ("host", "port", "journal", "processes"):
        value = getattr(args, key)
        if value is not None:
            overrides.append(f"{key}={value}")
    config = load_config(ManagerConfig, args.config, overrides)
    if args.token:
        config = config.model_copy(update={"token": args.token})
    # the manager closes on its way out, so the journal and the request log are flushed
    _run_until_sigterm(args.log_format, lambda: serve(config))


def _relay(args: argparse.Namespace, started_at: float) -> None:
    """read the token streams of this node's engines for a manager on another node

    Serve a relay: a manager dials it and opens on it the streams of the engines registered with
    `relay: HOST:PORT`; it reads them on this node and sends the manager their tokens merged, once
    every --flush-ms. Binds 127.0.0.1 unless --host says otherwise; a manager must greet it with
    --token (set one before opening it to other machines).
    """
    from rollflow.errors import UserError
    from rollflow.runtime.manager.streams.relay import serve_relay

    if not 0 < args.flush_ms <= 1000:
        raise UserError(f"--flush-ms must be in (0, 1000], not {args.flush_ms:g}")
    _run_until_sigterm(
        args.log_format,
        lambda: serve_relay(args.host, args.port, args.token, args.flush_ms / 1000.0, args.connect_timeout_s),
    )


def _run_until_sigterm(log_format: str, main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Log in `log_format`, then run `main()` on libuv's loop until it returns or SIGTERM stops it
    (signals.run_until_sigterm). libuv's loop: the manager and the relay are on the request path of
    every sample, and uvloop's transports and callbacks cost them less per request than asyncio's
    own."""
    import uvloop

    from rollflow.runtime.logs import setup_logging
    from rollflow.runtime.signals import run_until_sigterm

    setup_logging(log_format)
    run_until_sigterm(main, uvloop.new_event_loop)
