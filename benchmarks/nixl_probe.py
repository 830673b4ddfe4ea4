#!/usr/bin/env python3
"""Whether NIXL's POSIX and OBJ back ends load and move data on this machine (no GPU needed for either in principle).

Runs in its own venv, apart from the project's (nixl-cu12 pulls a CUDA torch):
  python3.11 -m venv /var/tmp/nixl-venv && /var/tmp/nixl-venv/bin/pip install nixl-cu12==1.5.1
  /var/tmp/nixl-venv/bin/python benchmarks/nixl_probe.py [--obj-endpoint http://127.0.0.1:PORT --bucket B]
POSIX: 1 MiB of DRAM written into a file through the POSIX back end, read back into other DRAM, compared. OBJ: the
back end created (against --obj-endpoint, an S3 endpoint; none given: a port nothing listens on), then the same write
and read of one object. Prints one line per step, PASS or the exact error; imports nothing of kvtier.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import tempfile
import time
import traceback

import numpy as np

N = 1 << 20


def step(name, fn):
    try:
        out = fn()
        print(f"{name}: PASS{'' if out is None else f' ({out})'}", flush=True)
        return out, True
    except Exception as exc:  # the probe's point: the exact error, whatever it is
        msg = " ".join(f"{type(exc).__name__}: {exc}".split())
        print(f"{name}: FAIL {msg}", flush=True)
        if os.environ.get("NIXL_PROBE_TRACE"):
            traceback.print_exc()
        return None, False


def move(agent, backend, remote_descs, mem):
    """WRITE N random bytes from DRAM into `remote_descs` (FILE or OBJ), READ them back, compare."""
    src = np.random.default_rng(1).integers(0, 256, N, dtype=np.uint8)
    dst = np.zeros(N, np.uint8)
    agent.register_memory(agent.get_reg_descs([(src.ctypes.data, N, 0, ""), (dst.ctypes.data, N, 0, "")], "DRAM"))
    agent.register_memory(agent.get_reg_descs(remote_descs, mem))
    remote = agent.get_xfer_descs([d[:3] for d in remote_descs], mem)
    for op, local in (("WRITE", src), ("READ", dst)):
        h = agent.initialize_xfer(op, agent.get_xfer_descs([(local.ctypes.data, N, 0)], "DRAM"), remote, agent.name)
        if not h:
            raise RuntimeError(f"initialize_xfer({op}) returned no handle")
        state = agent.transfer(h)
        deadline = time.monotonic() + 30
        while state == "PROC" and time.monotonic() < deadline:
            time.sleep(0.001)
            state = agent.check_xfer_state(h)
        agent.release_xfer_handle(h)
        if state != "DONE":
            raise RuntimeError(f"{op} ended in state {state!r}")
    if not np.array_equal(src, dst):
        raise RuntimeError("the bytes read back differ from those written")
    return f"{N} bytes written and read back, equal"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--obj-endpoint", help="S3 endpoint for the OBJ back end (default: a closed local port)")
    ap.add_argument("--bucket", default="kvtier-nixl-probe")
    a = ap.parse_args()
    _, ok = step("import nixl_cu12", lambda: __import__("nixl_cu12") and None)
    if not ok:
        return 1
    from nixl_cu12 import nixl_agent, nixl_agent_config

    agent, ok = step("agent without back ends", lambda: nixl_agent("probe", nixl_agent_config(backends=[])))
    if not ok:
        return 1
    step("plugins found", lambda: ",".join(sorted(agent.get_plugin_list())))
    # POSIX
    _, ok = step("POSIX back end created", lambda: agent.create_backend("POSIX"))
    if ok:
        step("POSIX params", lambda: agent.get_backend_params("POSIX"))
        with tempfile.TemporaryFile(dir="/var/tmp") as f:
            f.truncate(N)
            fd = f.fileno()
            step("POSIX moves data (DRAM -> FILE -> DRAM)", lambda: move(agent, "POSIX", [(0, N, fd, "")], "FILE"))
    # OBJ
    if not a.obj_endpoint:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            a.obj_endpoint = f"http://127.0.0.1:{s.getsockname()[1]}"
    # aws-sdk-cpp (NIXL's OBJ back end) sends a PUT's body aws-chunked with a trailing CRC32 by default, which an
    # older S3 server refuses (Ceph 16's radosgw: HTTP 411 Length Required, seen as NIXL_ERR_BACKEND); the AWS SDKs'
    # own setting asks for checksums only where the API requires them. A value set by the caller is kept.
    os.environ.setdefault("AWS_REQUEST_CHECKSUM_CALCULATION", "when_required")
    os.environ.setdefault("AWS_RESPONSE_CHECKSUM_VALIDATION", "when_required")
    params = {
        "bucket": a.bucket,
        "endpoint_override": a.obj_endpoint,
        "scheme": "http",
        "region": "us-east-1",
        "access_key": os.environ.get("AWS_ACCESS_KEY_ID", "probe"),
        "secret_key": os.environ.get("AWS_SECRET_ACCESS_KEY", "probe"),
    }
    step("OBJ plugin params", lambda: agent.get_plugin_params("OBJ"))
    _, ok = step(f"OBJ back end created (endpoint {a.obj_endpoint})", lambda: agent.create_backend("OBJ", params))
    if ok:
        step("OBJ moves data (DRAM -> object -> DRAM)", lambda: move(agent, "OBJ", [(0, N, 1, "probe-object")], "OBJ"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
