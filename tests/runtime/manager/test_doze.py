"""The wait between flushes of a process that only reads streams (streams/doze.py): a message from
its manager ends it, and it does not doze while it serves no reader or several."""

from __future__ import annotations

import socket
import threading

from rollflow.runtime.manager.streams.doze import Doze


def test_a_message_from_the_manager_ends_the_doze():
    ours, theirs = socket.socketpair()
    doze = Doze()
    doze.join(theirs.fileno())
    writer = threading.Timer(0.2, ours.send, args=(b"x",))
    writer.start()
    try:
        assert doze(3600.0)  # returns: the byte woke it (else the test's timeout fails it)
        assert theirs.recv(1) == b"x"
    finally:
        writer.join()
        ours.close()
        theirs.close()


def test_it_dozes_only_while_it_serves_one_reader():
    first, second = socket.socketpair()
    doze = Doze()
    assert not doze(3600.0)
    doze.join(first.fileno())
    assert doze(0.0)
    doze.join(second.fileno())
    assert not doze(3600.0)  # two managers' flushes would hold each other back
    doze.leave(second.fileno())
    assert doze(0.0)
    doze.leave(first.fileno())
    assert not doze(3600.0)
    first.close()
    second.close()
