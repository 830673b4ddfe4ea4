"""Helpers shared by the whole suite: a free port on 127.0.0.1, waiting for a state with a deadline, and a test HTTP
server that keeps quiet when a client hangs up.

tests/conftest.py puts this folder on sys.path (pytest's rootdir-relative import of a conftest outside a package), so
any test imports them as `from helpers import free_port, wait_for`."""

from __future__ import annotations

import sys
from collections.abc import Callable
from http.server import ThreadingHTTPServer
from typing import TypeVar

from deploy import stack
from replay.common.ports import free_port

__all__ = ["QuietHTTPServer", "free_port", "wait_for"]

T = TypeVar("T")


def wait_for(predicate: Callable[[], T], timeout_s: float = 30.0, interval_s: float = 0.05, what: str = "") -> T:
    """deploy.stack.wait_for (the one polling loop) that fails the test, naming what was awaited, when timeout_s
    passes first. A predicate may raise AssertionError itself to fail at once (a child that exited)."""
    value = stack.wait_for(predicate, timeout_s, interval_s)
    if not value:
        raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what or predicate.__name__}")
    return value


class QuietHTTPServer(ThreadingHTTPServer):
    """A ThreadingHTTPServer on 127.0.0.1 for tests: a client that hangs up (the code under test closing a kept-alive
    connection, or giving up on a body) is no error. http.server would print that reset's traceback to the test
    process's stderr, where a test that asserts the command printed no traceback reads it as the command's."""

    daemon_threads = True

    def __init__(self, handler) -> None:
        super().__init__(("127.0.0.1", 0), handler)

    def handle_error(self, request, client_address) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)
