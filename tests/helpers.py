"""Helpers shared by the whole suite: a free port on 127.0.0.1 and waiting for a state with a deadline.

tests/conftest.py puts this folder on sys.path (pytest's rootdir-relative import of a conftest outside a package), so
any test imports them as `from helpers import free_port, wait_for`."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def free_port() -> int:
    """A port nothing listens on right now (the kernel's pick); a server started on it soon after gets it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate: Callable[[], T], timeout_s: float = 30.0, interval_s: float = 0.05, what: str = "") -> T:
    """Call predicate until it returns something truthy and return that; fail the test with what was awaited when
    timeout_s passes first. A predicate may raise AssertionError itself to fail at once (a child that exited)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what or predicate.__name__}")
        time.sleep(interval_s)
