"""Free ports for servers this project starts (the fake server, a CPU stack, a Redis cluster, the tests' servers).

Ports are taken outside the kernel's range for the source ports of outgoing connections
(net.ipv4.ip_local_port_range, 32768-60999 by default). A port inside it can be taken by any outgoing connection
while its server is down, and a client that keeps reconnecting to a dead 127.0.0.1 port can even connect to itself
(TCP simultaneous open, when the kernel picks the destination port as the source port). Either way a server restarted
on its own port then fails with "Address already in use": a Redis master killed and restarted under load did exactly
that once. Outside the range only a server's explicit bind can take a port."""

from __future__ import annotations

import functools
import random
import socket
from collections.abc import Iterable
from pathlib import Path

LOWEST = 10000  # below: the well-known ports and the registered ones services most often run on
LOCAL_PORT_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def ephemeral_range() -> range:
    """The ports the kernel hands out as source ports (Linux's default when the file cannot be read)."""
    try:
        lo, hi = map(int, LOCAL_PORT_RANGE.read_text().split())
    except (OSError, ValueError):
        lo, hi = 32768, 60999
    return range(lo, hi + 1)


def free_port_block(n: int = 1, host: str = "127.0.0.1", offsets: Iterable[int] = (0,)) -> int:
    """A base port such that, for each offset o, the n ports base+o .. base+o+n-1 are free on host right now and lie
    outside the kernel's source-port range (offsets: a Redis node's cluster bus listens on its port + 10000)."""
    offsets = tuple(offsets)
    eph = ephemeral_range()
    bases = _bases(n, offsets, eph)
    if not bases:
        raise RuntimeError(f"no block of {n} ports outside the source-port range {eph.start}-{eph.stop - 1}")
    for base in random.sample(bases, min(200, len(bases))):  # random, so that concurrent runs rarely pick alike
        if all_free([base + o + i for o in offsets for i in range(n)], host):
            return base
    raise RuntimeError(f"no free block of {n} ports on {host} outside the source-port range {eph.start}-{eph.stop - 1}")


@functools.cache
def _bases(n: int, offsets: tuple[int, ...], eph: range) -> list[int]:
    top = 65535 - max(offsets) - n + 1  # the highest base whose every port exists
    return [b for b in range(LOWEST, top + 1) if all(b + o + n <= eph.start or b + o >= eph.stop for o in offsets)]


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on right now on host; a server started on it soon after gets it."""
    return free_port_block(1, host)


def all_free(ports: Iterable[int], host: str = "127.0.0.1") -> bool:
    """Whether every one of ports can be bound on host right now."""
    socks = []
    try:
        for p in ports:
            s = socket.socket()
            socks.append(s)
            s.bind((host, p))
        return True
    except OSError:
        return False
    finally:
        for s in socks:
            s.close()
