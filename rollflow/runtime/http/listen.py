"""How every rollflow server takes its port: the socket is bound before the server starts anything
else, and a port that is taken (or an address this machine lacks) is a one-line error saying what
to change, instead of aiohttp's traceback after the server has already contacted its engines.
"""

from __future__ import annotations

import errno
import socket

from rollflow.errors import UserError


def bind(host: str, port: int, port_option: str = "--port") -> socket.socket:
    """A TCP socket bound to `host:port` (port 0: a free one), not yet listening: hand it to
    `aiohttp.web.SockSite`. `port_option` is how the user picks another port, for the message."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as exc:
        raise UserError(f"cannot listen on {host}:{port}: {exc.strerror}; pass --host 127.0.0.1") from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as aiohttp's own sites do
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise UserError(_bind_error(host, port, exc, port_option)) from None
    return sock


def check_free(host: str, port: int, port_option: str) -> None:
    """Raise bind()'s one-line error now if `host:port` is taken, for a process about to be
    started on it (whose own error would land in its log)."""
    if port:
        bind(host, port, port_option).close()


def _bind_error(host: str, port: int, exc: OSError, port_option: str) -> str:
    """What went wrong binding `host:port`, and what to do, in one line."""
    if exc.errno == errno.EADDRINUSE:
        return (
            f"port {port} on {host} is already in use (another process listens there, perhaps an "
            f"earlier run still going): stop it, or pick another port with {port_option} (0 picks a free one)"
        )
    if exc.errno == errno.EACCES:
        return f"no permission to listen on port {port} (ports below 1024 need root): pick another with {port_option}"
    if exc.errno == errno.EADDRNOTAVAIL:
        return f"cannot listen on {host}:{port}: this machine has no address {host}; pass --host 127.0.0.1"
    return f"cannot listen on {host}:{port}: {exc.strerror or exc}"
