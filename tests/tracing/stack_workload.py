"""A stand-in serving stack for the target-matching tests, shaped like vLLM +
an LMCache MP server: processes that rename themselves as vLLM 0.32 does
(setproctitle -> task name), a child started later, and a KV server that is
not a child and is found by the port the front end's command line names.

    stack_workload.py kvserver PORT FILE SECONDS    # listens on PORT, does I/O
    stack_workload.py front DIR SECONDS TAG --kv-transfer-config JSON
        task name TAG::Front; forks TAG::Engine (I/O at once) and, once
        DIR/go exists, TAG::Late (I/O); prints "ready" and the child pids
"""

import ctypes
import os
import socket
import sys
import time

PR_SET_NAME = 15


def set_comm(name: str) -> None:
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_NAME, name.encode(), 0, 0, 0)


def io_loop(path: str, seconds: float) -> None:
    """Block I/O of this process: writes made durable by fdatasync, reads
    after the pages were dropped."""
    block = os.urandom(64 * 1024)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    deadline = time.monotonic() + seconds
    off = 0
    while time.monotonic() < deadline:
        for i in range(4):
            os.pwrite(fd, block, off + i * len(block))
        os.fdatasync(fd)
        os.posix_fadvise(fd, off, 4 * len(block), os.POSIX_FADV_DONTNEED)
        for i in range(4):
            os.pread(fd, len(block), off + i * len(block))
        off = (off + 4 * len(block)) % (16 << 20)
        time.sleep(0.01)
    os.close(fd)


def child(name: str, path: str, seconds: float) -> int:
    pid = os.fork()
    if pid == 0:
        set_comm(name)
        try:
            io_loop(path, seconds)
        finally:
            os._exit(0)
    return pid


def main() -> None:
    role = sys.argv[1]
    if role == "kvserver":
        port, path, seconds = int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
        srv = socket.socket()
        srv.bind(("127.0.0.1", port))
        srv.listen()
        print("ready", flush=True)
        io_loop(path, seconds)
        return
    d, seconds, tag = sys.argv[2], float(sys.argv[3]), sys.argv[4]
    set_comm(f"{tag}::Front")
    eng = child(f"{tag}::Engine", os.path.join(d, "engine.dat"), seconds)
    print(f"ready {eng}", flush=True)
    deadline = time.monotonic() + seconds
    while not os.path.exists(os.path.join(d, "go")) and time.monotonic() < deadline:
        time.sleep(0.05)
    late = child(f"{tag}::Late", os.path.join(d, "late.dat"), max(1.0, deadline - time.monotonic()))
    print(f"late {late}", flush=True)
    for _ in range(2):
        os.wait()


if __name__ == "__main__":
    main()
