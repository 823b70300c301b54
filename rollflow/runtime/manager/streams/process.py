"""A stream process: reads engines' token streams for the manager (`processes: N`, N > 1), and
the stream session a relay runs for each manager that dials it (relay.py).

The manager opens streams on the process by request id; the process reads them (reading.py: once
per `flush_ms`, their tokens merged, sleeping in between: doze.py) and sends back what arrived, one
message a flush for every request that had news. The parsing runs on another core, and the manager
pays per message and chunk, not per event. What the process may take with it when it dies
(kill -9): the tokens the engines sent in its last two `flush_ms`, which the manager never saw.
They are generated again when their samples resume; no sample loses a token it was told of.

Started by the manager (`readers.py`) as `python -m rollflow.runtime.manager.streams.process
--fd N`, with its end of a socket pair; it exits when the manager's end closes.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import socket

import aiohttp

from rollflow.runtime.engines.base import EngineClient
from rollflow.runtime.engines.clients import make_client
from rollflow.runtime.long_lived import settle
from rollflow.runtime.manager.streams import wire
from rollflow.runtime.manager.streams.doze import Doze
from rollflow.runtime.manager.streams.reading import StreamReading


class StreamSession:
    """The streams one manager opened on this process, over one connection to it."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        http: aiohttp.ClientSession,
        flush_s: float,
        codec: wire.Codec,
        frames: wire.FrameReader | None = None,
        doze: Doze | None = None,
    ) -> None:
        """`codec`: the connection's (wire.py); `frames`: the reader's framing when the caller has
        read from it already (a relay's greeting); `doze`: the process's wait between flushes,
        which this session's connection then wakes (doze.py)."""
        self._reader = reader
        self._writer = writer
        self._http = http
        self._codec = codec
        self._frames = frames or wire.FrameReader(codec=codec)
        self._clients: dict[tuple[str, str, str | None], EngineClient] = {}
        self._doze = doze
        self._reading = StreamReading(self._send, flush_s, doze)

    async def run(self, first: list | None = None) -> None:
        """Serve the manager until its connection closes; `first`: messages already read from it."""
        fd = self._writer.get_extra_info("socket").fileno()
        if self._doze is not None:
            self._doze.join(fd)
        try:
            messages = first or []
            while True:
                for message in messages:
                    if message[0] == wire.OPEN:
                        _, rid, engine_type, url, api_key, input_ids, fields = message
                        client = self._client(engine_type, url, api_key)
                        self._reading.open(rid, client, input_ids, wire.sampling_from(fields))
                    elif message[0] == wire.CLOSE:
                        self._reading.close(message[1])
                data = await self._reader.read(1 << 16)
                if not data:
                    break
                messages = self._frames.feed(data)
        finally:  # the manager is gone: nothing is read for it any more
            if self._doze is not None:
                self._doze.leave(fd)
            await self._reading.aclose()
            self._writer.close()

    def _send(self, items: list[tuple]) -> None:
        self._writer.write(wire.frame(items, self._codec))

    def _client(self, engine_type: str, url: str, api_key: str | None) -> EngineClient:
        key = (engine_type, url, api_key)
        client = self._clients.get(key)
        if client is None:
            client = self._clients[key] = make_client(engine_type, url, self._http, api_key=api_key)
        return client


def http_session(connect_timeout_s: float) -> aiohttp.ClientSession:
    """The session the engine clients share (as the manager's own: no pool limit)."""
    connector = aiohttp.TCPConnector(limit=0, enable_cleanup_closed=True)
    return aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout_s)
    )


async def _serve_manager(sock: socket.socket, flush_s: float, connect_timeout_s: float) -> None:
    async with http_session(connect_timeout_s) as http:
        reader, writer = await asyncio.open_unix_connection(sock=sock)
        settle()
        await StreamSession(reader, writer, http, flush_s, wire.MARSHAL, doze=Doze()).run()


def main() -> None:
    parser = argparse.ArgumentParser(description="Read engines' token streams for a rollflow manager.")
    parser.add_argument(
        "--fd", type=int, required=True, help="this process's end of the manager's socket pair"
    )
    parser.add_argument("--flush-ms", type=float, required=True)
    parser.add_argument("--connect-timeout-s", type=float, required=True)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    import uvloop

    sock = socket.socket(fileno=args.fd)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(_serve_manager(sock, args.flush_ms / 1000.0, args.connect_timeout_s))


if __name__ == "__main__":
    main()
