"""`kvtier conformance`: any LMCache L2 adapter (LMCache's MP-mode storage interface) driven through the failures its
users reported, one line per case with the figure measured, exit 1 when one fails.

The cases, each on real LMCache memory objects through the adapter's own task interface (submit / poll / load), the
adapter built by LMCache's own config registry and factory, as its MP server builds it:
- round_trip: what a store acknowledged is found and loads byte for byte.
- restart_keeps_acknowledged: the adapter closed and built again on the same medium still finds and serves it.
- flipped_byte_not_served: one byte flipped in every file on the medium (a bad sector, a torn page); no load may
  return the changed bytes (a miss or an error is fine, wrong KV is not: it becomes wrong answers).
- kill9_mid_store: a process storing without pause is SIGKILLed; a new adapter loses no acknowledged object and
  serves no damaged one (a process kill keeps the page cache: what a power loss adds is not tested here).
- capacity_held: three times the adapter's declared capacity written; the medium holds at most the capacity plus
  one object. Not applicable where the adapter declares none (LMCache's MP server may evict for it).

  kvtier conformance --adapter kvtier --medium /mnt/nvme/conf             # kvtier's adapter, 64 MiB capacity
  kvtier conformance --adapter fs --medium /mnt/nvme/conf --json fs.json  # LMCache's own fs adapter
  kvtier conformance --config '{"type": "fs", "base_path": "/mnt/x", "use_odirect": true}' --medium /mnt/x

The medium is a directory the adapter alone writes during the run; it must be empty or absent (the cases flip
bytes in its files). Exit 0 when every case passes or does not apply, 1 when one fails, 2 for a refusal.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

from kvconnector.errors import ConfigError

OBJECTS = 8
ALIGN = 4096
SHAPE = (2, 4, 256, 64)  # (K/V, layers, tokens, head dim) in bf16: 256 KiB per object
KVTIER_CAPACITY_MIB = 64
KILL_AFTER_ACKS = 12
KILL_WITHIN_S = 60.0  # for them; an adapter that acknowledges none fails the case then


@dataclass
class Case:
    name: str
    verdict: str  # pass | fail | n/a
    figure: str

    def line(self) -> str:
        return f"{self.verdict.upper():<4} {self.name}: {self.figure}"


# ---- LMCache's interface ------------------------------------------------------------------------------------------
def adapter_config(adapter: str | None, config: str | None, medium: Path) -> dict:
    """The adapter's config dict (LMCache's --l2-adapter JSON) from a shortcut or from --config."""
    if config:
        try:
            d = json.loads(config)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"--config: not JSON ({exc.msg} at {exc.pos})") from None
        if not isinstance(d, dict) or not isinstance(d.get("type"), str):
            raise ConfigError('--config: a JSON object with a "type" (an LMCache L2 adapter type)')
        return d
    if adapter == "fs":
        return {"type": "fs", "base_path": str(medium)}
    return {
        "type": "plugin",
        "module_path": "kvconnector.lmcache.l2_adapter",
        "class_name": "KvtierL2Adapter",
        "adapter_params": {"disk_dir": str(medium), "disk_capacity_gb": KVTIER_CAPACITY_MIB * 2**20 / 1e9},
    }


def build(cfg: dict):
    """The adapter as LMCache's MP server builds it: its config class from the registry, then the factory."""
    # LMCache's registry imports cloud clients that warn about Python versions: not this run's news
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        from lmcache.v1.distributed.l2_adapters import create_l2_adapter
        from lmcache.v1.distributed.l2_adapters.config import (
            get_l2_adapter_config_class,
            get_registered_l2_adapter_types,
        )

        types = get_registered_l2_adapter_types()
        if cfg["type"] not in types:
            raise ConfigError(f"no LMCache L2 adapter type {cfg['type']!r} (LMCache has {', '.join(types)})")
        return create_l2_adapter(get_l2_adapter_config_class(cfg["type"]).from_dict(cfg))


def key(i: int):
    from lmcache.v1.distributed.api import ObjectKey

    return ObjectKey(chunk_hash=i.to_bytes(8, "big"), model_name="conformance", kv_rank=0, object_group_id=0)


def payload(i: int) -> bytes:
    """Object i's bytes, unlike any other's: every 8-byte word holds i in its high bits, a running count below."""
    import numpy as np

    n = int(np.prod(SHAPE)) * 2
    words = np.arange(n // 8, dtype=np.uint64) + np.uint64(i << 40)
    return words.tobytes()


def mem_obj(data: bytes | None = None):
    import torch
    from lmcache.v1.memory_management import MemoryFormat, MemoryObjMetadata, TensorMemoryObj

    n = int(torch.Size(SHAPE).numel()) * 2
    # page-aligned, as the MP server's L1 memory is: an adapter's O_DIRECT I/O needs it (EINVAL otherwise)
    whole = torch.zeros(n + ALIGN, dtype=torch.uint8)
    start = -whole.data_ptr() % ALIGN
    raw = whole[start : start + n]
    if data is not None:
        raw.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
    meta = MemoryObjMetadata(
        shape=torch.Size(SHAPE), dtype=torch.bfloat16, address=0, phy_size=n, ref_count=1, fmt=MemoryFormat.KV_2LTD
    )
    return TensorMemoryObj(raw, meta, None)


def poll(fn, timeout_s: float = 30.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        r = fn()
        if r is not None:
            return r
        time.sleep(0.002)
    return None


def store(a, indices: list[int]) -> bool:
    """Store the objects; whether the adapter acknowledged them all."""
    task = a.submit_store_task([key(i) for i in indices], [mem_obj(payload(i)) for i in indices])
    done: dict = {}

    def finished():
        done.update(a.pop_completed_store_tasks())
        return done.get(task)

    result = poll(finished)
    return bool(result is not None and result.is_successful())


def lookup(a, indices: list[int]) -> set[int]:
    """The objects the adapter finds, locked until `unlock`."""
    task = a.submit_lookup_and_lock_task([key(i) for i in indices], {})
    found = poll(lambda: a.query_lookup_and_lock_result(task))
    return {indices[j] for j in found.get_indices_list()} if found is not None else set()


def load(a, indices: list[int]) -> dict[int, bytes | None]:
    """What a load of each object returned: its bytes, or None where the adapter said it did not load it."""
    objs = [mem_obj() for _ in indices]
    try:
        task = a.submit_load_task([key(i) for i in indices], objs)
        done = poll(lambda: a.query_load_result(task))
    except Exception:  # an adapter that raises on a damaged object: nothing served
        return dict.fromkeys(indices)
    ok = set(done.get_indices_list()) if done is not None else set()
    return {i: (objs[j].byte_array.tobytes() if j in ok else None) for j, i in enumerate(indices)}


def served(a, indices: list[int]) -> tuple[int, int, int]:
    """(intact, damaged, missing) over the objects: found, loaded, and compared with what was stored."""
    found = sorted(lookup(a, indices))
    got = load(a, found) if found else {}
    if found:
        a.submit_unlock([key(i) for i in found])
    intact = sum(1 for i, b in got.items() if b == payload(i))
    damaged = sum(1 for b in got.values() if b is not None) - intact
    return intact, damaged, len(indices) - intact - damaged


def medium_bytes(medium: Path) -> int:
    return sum(p.stat().st_size for p in medium.rglob("*") if p.is_file())


# ---- the cases ----------------------------------------------------------------------------------------------------
def run_cases(cfg: dict, medium: Path, capacity_mib: float | None = None) -> list[Case]:
    cases: list[Case] = []
    first = list(range(OBJECTS))
    a = build(cfg)
    try:
        acked = store(a, first)
        intact, damaged, missing = served(a, first)
    finally:
        a.close()
    ok = acked and intact == OBJECTS
    cases.append(Case("round_trip", "pass" if ok else "fail", f"{intact}/{OBJECTS} intact, {damaged} damaged"))

    a = build(cfg)
    try:
        intact, damaged, missing = served(a, first)
    finally:
        a.close()
    ok = intact == OBJECTS and damaged == 0
    figure = f"{intact}/{OBJECTS} served intact after a restart, {missing} lost, {damaged} damaged"
    cases.append(Case("restart_keeps_acknowledged", "pass" if ok else "fail", figure))

    files = [p for p in medium.rglob("*") if p.is_file() and p.stat().st_size >= 4096]
    for p in files:
        with open(p, "r+b") as f:
            f.seek(p.stat().st_size // 2)
            b = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([b[0] ^ 0x01]))
    a = build(cfg)
    try:
        intact_before = intact
        intact, damaged, missing = served(a, first)
    finally:
        a.close()
    figure = f"{len(files)} files flipped: {damaged} damaged objects served, {missing} refused or missed"
    if not (files and intact_before):
        cases.append(Case("flipped_byte_not_served", "n/a", "nothing on the medium was served intact to flip"))
    else:
        cases.append(Case("flipped_byte_not_served", "pass" if damaged == 0 else "fail", figure))

    cases.append(kill9_case(cfg))
    cases.append(capacity_case(cfg, medium, capacity_mib))
    return cases


def kill9_case(cfg: dict) -> Case:
    """A child stores objects 1000, 1001, ... one at a time and prints each acknowledged index; SIGKILLed after
    KILL_AFTER_ACKS of them, mid-store of the next."""
    code = f"import sys, json; from replay.conformance import child_store; child_store(json.loads({json.dumps(cfg)!r}))"
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    acked: list[int] = []
    deadline = time.monotonic() + KILL_WITHIN_S
    try:  # the acknowledgements as they come, never waiting past the deadline (an adapter whose stores all fail)
        while len(acked) < KILL_AFTER_ACKS and time.monotonic() < deadline:
            ready, _, _ = select.select([child.stdout], [], [], max(0.0, deadline - time.monotonic()))
            line = child.stdout.readline() if ready else ""
            if line.startswith("ack "):
                acked.append(int(line.split()[1]))
            elif ready and not line:  # the child ended by itself
                break
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    if len(acked) < KILL_AFTER_ACKS:
        said = (
            f"{len(acked)} stores acknowledged in {KILL_WITHIN_S:.0f} s (of {KILL_AFTER_ACKS} wanted before the kill)"
        )
        return Case("kill9_mid_store", "fail", said)
    tried = list(range(1000, max(acked) + 3))  # the acknowledged, and the ones in flight at the kill
    a = build(cfg)
    try:
        _, _, lost = served(a, acked)
        _, damaged_all, _ = served(a, tried)
    finally:
        a.close()
    ok = lost == 0 and damaged_all == 0
    figure = f"{len(acked)} acknowledged: {lost} lost, {damaged_all} damaged served (of {len(tried)} tried)"
    return Case("kill9_mid_store", "pass" if ok else "fail", figure)


def child_store(cfg: dict) -> None:
    a = build(cfg)
    i = 1000
    while True:
        if store(a, [i]):
            print(f"ack {i}", flush=True)
        i += 1


def capacity_case(cfg: dict, medium: Path, capacity_mib: float | None) -> Case:
    """capacity_mib: what the adapter was configured to hold, for one that bounds itself without declaring it to
    LMCache (kvtier's declares 0 so LMCache's own L2 eviction stays off); else its declared capacity."""
    a = build(cfg)
    try:
        capacity = int(capacity_mib * 2**20) if capacity_mib else int(a.get_usage().total_capacity_bytes or 0)
        if capacity <= 0:
            return Case("capacity_held", "n/a", "the adapter declares no capacity of its own and none was given")
        size = len(payload(0))
        n = 3 * capacity // size
        for start in range(2000, 2000 + n, 8):
            store(a, list(range(start, min(start + 8, 2000 + n))))
        time.sleep(0.5)  # an eviction that runs beside the stores
        held = medium_bytes(medium)
    finally:
        a.close()
    ok = held <= capacity + size + (1 << 20)  # plus one object and 1 MiB of the adapter's own files
    figure = f"{n} objects ({n * size / 2**20:.0f} MiB) into {capacity / 2**20:.0f} MiB: {held / 2**20:.1f} MiB held"
    return Case("capacity_held", "pass" if ok else "fail", figure)


# ---- the command line ---------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="kvtier conformance",
        description=__doc__.split("\n\n")[0],
        epilog="\n\n".join(__doc__.split("\n\n")[1:]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--adapter", choices=("kvtier", "fs"), help="a shortcut: kvtier's adapter or LMCache's fs")
    ap.add_argument("--config", help="an LMCache L2 adapter's JSON (its type and keys), instead of --adapter")
    ap.add_argument("--medium", type=Path, required=True, help="the directory the adapter writes (empty or absent)")
    ap.add_argument(
        "--capacity-mib",
        type=float,
        help="the capacity the adapter was configured with, where it does not declare one to LMCache "
        f"(--adapter kvtier: {KVTIER_CAPACITY_MIB})",
    )
    ap.add_argument("--json", type=Path, help="write the verdicts here (with the run's provenance)")
    a = ap.parse_args(argv)
    if bool(a.adapter) == bool(a.config):
        raise ConfigError("give --adapter kvtier|fs or --config JSON (one of them)")
    if a.medium.exists() and (not a.medium.is_dir() or any(a.medium.iterdir())):
        raise ConfigError(f"--medium {a.medium}: not an empty directory (the cases flip bytes in its files)")
    if a.capacity_mib is not None and not a.capacity_mib > 0:
        raise ConfigError(f"--capacity-mib {a.capacity_mib}: must be above 0")
    if a.json is not None and not a.json.parent.is_dir():
        raise ConfigError(f"--json {a.json}: no such directory {a.json.parent}")
    cfg = adapter_config(a.adapter, a.config, a.medium)
    os.environ.setdefault("LMCACHE_LOG_LEVEL", "WARNING")  # before LMCache is imported: its INFO lines are noise here
    made = not a.medium.exists()
    a.medium.mkdir(parents=True, exist_ok=True)
    try:
        build(cfg).close()
    except (ConfigError, ValueError, KeyError, TypeError, ImportError) as exc:  # LMCache's word on the config
        if made:  # the empty directory this run made, nothing of the user's
            shutil.rmtree(a.medium, ignore_errors=True)
        raise ConfigError(f"the adapter could not be built from {json.dumps(cfg)}: {exc}") from None
    import importlib.metadata

    lmcache = importlib.metadata.version("lmcache")
    print(f"kvtier conformance: {cfg['type']} adapter, LMCache {lmcache}, medium {a.medium}", flush=True)
    capacity = a.capacity_mib or (KVTIER_CAPACITY_MIB if a.adapter == "kvtier" else None)
    cases = run_cases(cfg, a.medium, capacity)
    for c in cases:
        print(c.line(), flush=True)
    failed = [c for c in cases if c.verdict == "fail"]
    print(f"{len(cases) - len(failed)} of {len(cases)} cases pass or do not apply")
    if a.json is not None:
        from .outputs.provenance import write_run_json

        doc = {"adapter": cfg, "lmcache": lmcache, "cases": [asdict(c) for c in cases]}
        write_run_json(a.json, doc, argv=["kvtier", "conformance", *(argv or sys.argv[1:])])
    return 1 if failed else 0
