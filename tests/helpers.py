"""Helpers shared by the whole suite: a free port on 127.0.0.1 and waiting for a state with a deadline.

tests/conftest.py puts this folder on sys.path (pytest's rootdir-relative import of a conftest outside a package), so
any test imports them as `from helpers import free_port, wait_for`."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from deploy import stack
from replay.common.ports import free_port

__all__ = ["free_port", "wait_for"]

T = TypeVar("T")


def wait_for(predicate: Callable[[], T], timeout_s: float = 30.0, interval_s: float = 0.05, what: str = "") -> T:
    """deploy.stack.wait_for (the one polling loop) that fails the test, naming what was awaited, when timeout_s
    passes first. A predicate may raise AssertionError itself to fail at once (a child that exited)."""
    value = stack.wait_for(predicate, timeout_s, interval_s)
    if not value:
        raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what or predicate.__name__}")
    return value
