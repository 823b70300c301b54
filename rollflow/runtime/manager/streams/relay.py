"""`rollflow manager relay`: a stream process on an engine's own node, which the manager dials.

In a cluster, the engines of one node are registered with that node's relay (`relay: HOST:PORT`
beside the engine's url). The manager then opens those engines' streams on the relay, which reads
them over the node's loopback and sends the manager their tokens merged, once a flush: a node's
tokens cross the network once, in few large messages, and no single process parses every token of
the cluster. Serving one manager, it sleeps between flushes as a stream process does (doze.py). It
speaks what a stream process speaks (wire.py) after a greeting that carries
the manager's token (the relay's `--token`, by default $ROLLFLOW_MANAGER_TOKEN): a connection with
another token is closed unheard.

A relay keeps nothing a manager needs: killed, the samples it was reading resume from the tokens the
manager had (those of its last two flushes are generated again), and the manager reads those
engines itself until the relay is back, then dials it again.
"""

from __future__ import annotations

import asyncio
import hmac
import logging

from rollflow.runtime.deadline import within
from rollflow.runtime.long_lived import settle
from rollflow.runtime.manager.streams import wire
from rollflow.runtime.manager.streams.doze import Doze
from rollflow.runtime.manager.streams.process import StreamSession, http_session

log = logging.getLogger("rollflow.manager.relay")

GREETING_TIMEOUT_S = 10.0  # a connection that has not said who it is by then is closed
GREETING_MAX_BYTES = 64 * 1024  # a greeting is a token: anything longer is not a manager's


async def serve_relay(
    host: str, port: int, token: str | None, flush_s: float, connect_timeout_s: float, ready=print
) -> None:
    """Serve managers on `host:port` until cancelled; `ready(line)` once listening."""
    doze = Doze()  # while it serves one manager: with more, their flushes would hold each other's back
    async with http_session(connect_timeout_s) as http:

        async def manager_connected(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            peer = writer.get_extra_info("peername")
            frames = wire.FrameReader(max_bytes=GREETING_MAX_BYTES)
            try:
                messages: list = []
                while not messages:
                    data = await within(reader.read(1 << 16), GREETING_TIMEOUT_S)
                    if not data:
                        return
                    messages = frames.feed(data)
            except (TimeoutError, ValueError, OSError) as exc:
                log.warning("relay: closed a connection from %s that did not greet (%s)", peer, exc)
                writer.close()
                return
            hello, rest = messages[0], messages[1:]
            if not _greets(hello, token):
                log.warning("relay: closed a connection from %s with a wrong token", peer)
                writer.close()
                return
            log.info("relay: manager %s connected", peer)
            frames.max_bytes = wire.MAX_MESSAGE_BYTES
            await StreamSession(reader, writer, http, flush_s, wire.JSON, frames, doze).run(first=rest)
            log.info("relay: manager %s went away", peer)

        server = await asyncio.start_server(manager_connected, host, port)
        for sock in server.sockets:
            doze.watch(sock.fileno())  # a manager that dials it is not kept waiting by a doze
        bound = server.sockets[0].getsockname()
        settle()
        ready(f"relay serving on {bound[0]}:{bound[1]}")
        async with server:
            await server.serve_forever()


def _greets(message: object, token: str | None) -> bool:
    """Whether `message` is a greeting with `token` (any greeting, when the relay has none)."""
    if not isinstance(message, list) or len(message) != 2 or message[0] != wire.HELLO:
        return False
    sent = message[1]
    if token is None:
        return True
    return isinstance(sent, str) and hmac.compare_digest(sent.encode(), token.encode())
