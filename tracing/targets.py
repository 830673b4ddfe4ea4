"""Which processes "vllm" means on an inference node: the tracer's target set.

    python3 -m tracing.targets resolve vllm [--pid P] [--children] [--no-kv-server]
    python3 -m tracing.targets watch --out DIR ... (run by the wrapper while tracing)

A user who types `storage_latency_stack.sh vllm` means the serving stack, and
the storage I/O of that stack is not done by a process whose task name is
"vllm": vLLM 0.32 renames its engine (`VLLM::EngineCor`) and workers
(`VLLM::Worker_TP`) with setproctitle, the front end (`python -m vllm...`)
does no KV I/O, and in the LMCache multi-process stack the KV cache server
(`python -m lmcache.v1.multiprocess.http_server`, task name `python`, not a
child of vLLM) does it all. So a name NAME matches a process when:

1. its task name is NAME or starts with NAME and a separator (`VLLM::...`,
   case-insensitive), or its program is: the executable's base name, or the
   module of `python -m MODULE`, or the script of `python SCRIPT.py`, by the
   same rule. The rest of the command line is not looked at, so
   `tail -f vllm.log`, `grep vllm` or `pytest -k vllm` are not the engine;
2. it descends from a matched process (found now, and followed in the kernel
   as it forks while tracing);
3. it is the KV cache server a matched engine names in its own command line:
   `--kv-transfer-config` with `lmcache.mp.port` (LMCacheMPConnector). The
   process listening on that TCP port is the server that engine uses. A name
   match on `lmcache` would also catch another engine's server on the same
   node; the port catches this engine's, whatever its command line.

Pids (`--pid`) match that process; `--children` adds their descendants.

Processes are grouped by instance: each matched process that descends from
no other matched process roots a group, its descendants and its KV server
join it (run-stack --instances 2 gives two groups: vllm0 with lmcache0,
vllm1 with lmcache1). The tracer reports per process and per group, and can
run one capture per group.

The watcher rescans /proc every second while tracing and hands processes
that newly match (a restarted KV server, a new engine) to the running
bpftrace through a mailbox: a `pidfd_open(pid, MAIL_FLAG | group)` call
from the watcher's own pid, which the script's probe reads (the flags are
invalid, so the call itself does nothing). bpftrace 0.17 offers no other
way to update a map from outside. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import time
from dataclasses import dataclass, field

__all__ = [
    "MAIL_FLAG",
    "Match",
    "Proc",
    "kv_server_ports",
    "listening_pids",
    "main",
    "name_matches",
    "program_names",
    "resolve",
    "scan",
]

# flags no kernel accepts for pidfd_open (PIDFD_NONBLOCK and PIDFD_THREAD are
# 0x800 and 0x80): the call fails with EINVAL and only the probe sees it
MAIL_FLAG = 0x40000000
_SEP = re.compile(r"[:._\-/ ]")
_INTERPRETERS = re.compile(r"^(python[0-9.]*|pypy[0-9.]*|uv|uvx)$")


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    comm: str
    argv: tuple[str, ...]

    @property
    def cmdline(self) -> str:
        return " ".join(self.argv) if self.argv else f"[{self.comm}]"


@dataclass
class Match:
    pid: int
    group: int
    why: str
    comm: str
    cmdline: str
    kv_ports: list[int] = field(default_factory=list)

    def tsv(self) -> str:
        clean = re.sub(r"[\t\n\r]", " ", self.cmdline)
        return f"{self.pid}\t{self.group}\t{self.comm}\t{self.why}\t{clean}"


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def read_proc(pid: int) -> Proc | None:
    stat = _read(f"/proc/{pid}/stat")
    if stat is None:
        return None
    text = stat.decode(errors="replace")
    # comm is in parentheses and may itself hold ") ": split at the last one
    lp, rp = text.find("("), text.rfind(")")
    comm = text[lp + 1 : rp]
    fields = text[rp + 2 :].split()
    if fields[0] in ("Z", "X"):  # exited, not yet reaped: no I/O to come
        return None
    cmd = _read(f"/proc/{pid}/cmdline") or b""
    argv = tuple(a.decode(errors="replace") for a in cmd.split(b"\0") if a)
    return Proc(pid, int(fields[1]), comm, argv)


def scan() -> dict[int, Proc]:
    out = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            p = read_proc(int(name))
            if p is not None and p.ppid != 2 and p.pid != 2:  # kernel threads do no process I/O of their own
                out[p.pid] = p
    return out


def program_names(p: Proc) -> list[str]:
    """What the command line runs: the executable, and for an interpreter the
    module of -m or the script."""
    if not p.argv:
        return []
    names = [os.path.basename(p.argv[0])]
    if _INTERPRETERS.match(names[0]):
        args = list(p.argv[1:])
        while args:
            a = args.pop(0)
            if a == "-m" and args:
                names.append(args[0])
                break
            if a.startswith("-m") and len(a) > 2:
                names.append(a[2:])
                break
            if a in ("-c",):
                break
            if a.startswith("-"):
                continue
            names.append(os.path.basename(a).removesuffix(".py"))
            break
    return names


def _token_matches(token: str, name: str) -> bool:
    t, n = token.lower(), name.lower()
    return t == n or (t.startswith(n) and bool(_SEP.match(t[len(n)])))


def name_matches(p: Proc, name: str) -> str | None:
    """Why p matches the name, or None."""
    if _token_matches(p.comm, name):
        return f"task name {p.comm!r}"
    for prog in program_names(p):
        if _token_matches(prog, name):
            return f"program {prog!r}"
    return None


def kv_server_ports(p: Proc) -> list[int]:
    """The LMCache MP server ports a vLLM command line names."""
    ports = []
    for i, a in enumerate(p.argv):
        raw = None
        if a.startswith("--kv-transfer-config="):
            raw = a.split("=", 1)[1]
        elif a == "--kv-transfer-config" and i + 1 < len(p.argv):
            raw = p.argv[i + 1]
        if raw is None:
            continue
        try:
            cfg = json.loads(raw)
            extra = cfg.get("kv_connector_extra_config") or {}
            port = extra.get("lmcache.mp.port")
            if port is not None:
                ports.append(int(port))
        except (ValueError, AttributeError, TypeError):
            continue
    return ports


def _listen_inodes(ports: set[int]) -> dict[int, int]:
    """socket inode -> port, for TCP sockets listening on one of ports."""
    out = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        data = _read(table)
        if not data:
            continue
        for line in data.decode().splitlines()[1:]:
            f = line.split()
            if len(f) < 10 or f[3] != "0A":  # 0A: LISTEN
                continue
            port = int(f[1].rsplit(":", 1)[1], 16)
            if port in ports:
                out[int(f[9])] = port
    return out


def listening_pids(ports: set[int], procs: dict[int, Proc]) -> dict[int, int]:
    """port -> pid of the process holding a socket listening on it."""
    inodes = _listen_inodes(ports)
    found: dict[int, int] = {}
    if not inodes:
        return found
    for pid in sorted(procs):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                port = inodes.get(int(link[8:-1]))
                if port is not None and port not in found:
                    found[port] = pid
        if len(found) == len(set(inodes.values())):
            break
    return found


def _ancestors(pid: int, procs: dict[int, Proc]) -> list[int]:
    out, seen = [], set()
    while pid in procs and pid not in seen:
        seen.add(pid)
        pid = procs[pid].ppid
        out.append(pid)
    return out


def resolve(
    names: list[str],
    pids: list[int],
    *,
    children: bool = False,
    kv_server: bool = True,
    procs: dict[int, Proc] | None = None,
    exclude: set[int] | None = None,
) -> list[Match]:
    """The matched set, grouped by instance (see the module docstring)."""
    procs = scan() if procs is None else procs
    skip = set(exclude or ())
    me = os.getpid()
    skip |= {me, *_ancestors(me, procs)}
    why: dict[int, str] = {}
    follow: set[int] = set()  # their descendants are matched too
    for pid in pids:
        if pid in procs:
            why[pid] = "--pid"
            if children:
                follow.add(pid)
    for pid, p in procs.items():
        if pid in skip or pid in why:
            continue
        for n in names:
            w = name_matches(p, n)
            if w:
                why[pid] = f"{n}: {w}"
                follow.add(pid)
                break
    kids: dict[int, list[int]] = {}
    for pid, p in procs.items():
        kids.setdefault(p.ppid, []).append(pid)

    def descendants(pid: int) -> list[int]:
        out, todo = [], list(kids.get(pid, []))
        while todo:
            c = todo.pop()
            out.append(c)
            todo += kids.get(c, [])
        return out

    for pid in list(follow):
        for c in descendants(pid):
            if c not in why and c not in skip:
                why[c] = f"{'child' if procs[c].ppid == pid else 'descendant'} of {pid}"
    # KV servers named by the matched engines' command lines
    kv_of: dict[int, list[int]] = {}
    if kv_server:
        wanted = {port: pid for pid in sorted(why) for port in kv_server_ports(procs[pid])}
        for port, spid in listening_pids(set(wanted), procs).items():
            kv_of.setdefault(wanted[port], []).append(port)
            if spid not in why and spid not in skip:
                why[spid] = f"KV server of {wanted[port]} (port {port})"
                for c in descendants(spid):
                    if c not in why and c not in skip:
                        why[c] = f"{'child' if procs[c].ppid == spid else 'descendant'} of {spid}"
            elif spid in why and spid != wanted[port]:
                why[spid] += f"; KV server of {wanted[port]} (port {port})"
    # groups: a matched process with no matched ancestor roots one; a KV
    # server joins its engine's group
    matched = set(why)
    root: dict[int, int] = {}
    for pid in sorted(matched):
        r = pid
        for a in _ancestors(pid, procs):
            if a in matched:
                r = a
        root[pid] = r
    engine_of_server: dict[int, int] = {}
    if kv_server:
        for eng, ports in kv_of.items():
            for spid in (listening_pids(set(ports), procs) or {}).values():
                if root.get(spid) == spid and root[eng] != spid:
                    engine_of_server[spid] = root[eng]
    for pid in sorted(matched):
        r = root[pid]
        if r in engine_of_server:
            root[pid] = engine_of_server[r]
    group_of_root: dict[int, int] = {}
    for r in sorted(set(root.values())):
        group_of_root[r] = len(group_of_root) + 1
    return [
        Match(pid, group_of_root[root[pid]], why[pid], procs[pid].comm, procs[pid].cmdline, kv_of.get(pid, []))
        for pid in sorted(matched)
    ]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python3 -m tracing.targets",
        description="Resolve the tracer's targets (names, pids) into processes, grouped by instance.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=(
            "examples:\n"
            "  python3 -m tracing.targets resolve vllm            # engine, workers, KV server\n"
            "  python3 -m tracing.targets resolve vllm,lmcache --pid 4242 --children\n"
        ),
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("resolve", "watch"):
        s = sub.add_parser(name)
        s.add_argument("names", nargs="*", help="names, comma-separated or repeated")
        s.add_argument("--pid", type=int, action="append", default=[])
        s.add_argument("--children", action="store_true", help="with --pid: their descendants too")
        s.add_argument("--no-kv-server", action="store_true", help="do not add the engines' KV cache servers")
        s.add_argument("--exclude", type=int, action="append", default=[])
        s.add_argument("--out", help="resolve: write matched.tsv here; watch: append to DIR/matched.tsv")
        if name == "watch":
            s.add_argument("--trace", action="append", required=True, help="a trace file to wait for and read")
            s.add_argument("--interval-s", type=float, default=1.0)
            s.add_argument("--captures", default="0", help="instances with a capture, comma-separated; 0: one of all")
    return p


def _names(raw: list[str]) -> list[str]:
    return [n for r in raw for n in r.split(",") if n]


def _mail(pid: int, group: int) -> None:
    try:
        fd = os.pidfd_open(pid, MAIL_FLAG | group)
        os.close(fd)  # a kernel that took the flags: harmless, closed
    except OSError:
        pass


def _group_for(m: Match, procs: dict[int, Proc], known: dict[int, int]) -> int:
    """A new match joins its matched ancestor's group, or its engine's (a
    KV server); else it starts a new one."""
    for a in _ancestors(m.pid, procs):
        if a in known:
            return known[a]
    e = re.search(r"KV server of (\d+)", m.why)
    if e and int(e.group(1)) in known:
        return known[int(e.group(1))]
    return max(known.values(), default=0) + 1


def _append(tsv: str, m: Match, captures: set[int]) -> None:
    if 0 not in captures and m.group not in captures:
        # --per-instance: one bpftrace per instance found at start
        print(
            f"storage_latency_stack: NOT traced: {m.pid} {m.comm} ({m.why}) is a new instance; "
            "--per-instance traces the instances found at start (restart the tracer to add it)",
            file=sys.stderr,
            flush=True,
        )
        return
    with open(tsv, "a") as f:
        f.write(m.tsv() + "\n")
    print(f"storage_latency_stack: now tracing {m.pid} [{m.group}] {m.comm} ({m.why})", file=sys.stderr, flush=True)


_FOLLOW_RE = re.compile(r"kvtier_follow: (\d+) (\d+) (\d+)")


def watch(args) -> int:
    """Rescan while tracing; mail new matches to bpftrace; list the children
    the kernel followed; forward bpftrace's warnings; append what is new to
    matched.tsv. Ends when the wrapper stops it (SIGTERM)."""
    # Ctrl-C reaches the whole group: bpftrace prints its maps, the wrapper
    # ends this watcher with SIGTERM once it has
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    names = _names(args.names)
    captures = {int(c) for c in args.captures.split(",") if c.strip()}
    known: dict[int, int] = {}
    tsv = os.path.join(args.out, "matched.tsv")
    with open(tsv) as f:
        for line in f:
            if line.strip() and not line.startswith("#"):
                pid, group = line.split("\t")[:2]
                known[int(pid)] = int(group)
    # until the probes are attached, a mail would go unseen
    for trace in args.trace:
        while True:
            try:
                with open(trace, errors="replace") as f:
                    if "Tracing storage I/O by layer" in f.read():
                        break
            except FileNotFoundError:
                pass
            time.sleep(0.05)
    pos = dict.fromkeys(args.trace, 0)
    pending: dict[int, tuple[int, int, float]] = {}
    while True:
        procs = scan()
        # what the kernel followed: listed, with the command line it has now
        for trace in args.trace:
            try:
                with open(trace, errors="replace") as f:
                    f.seek(pos[trace])
                    chunk = f.read()
                    pos[trace] = f.tell()
            except FileNotFoundError:
                continue
            for line in chunk.splitlines():
                if "kvtier_warn:" in line:
                    text = line[line.index("kvtier_warn:") + len("kvtier_warn:") :].strip().rstrip('"}').strip()
                    print(f"storage_latency_stack: WARNING: {text}", file=sys.stderr, flush=True)
                fm = _FOLLOW_RE.search(line)
                if fm:
                    pid, parent, group = (int(x) for x in fm.groups())
                    pending.setdefault(pid, (parent, group, time.monotonic()))
        # a followed child is listed a moment after its fork, once it has
        # exec'd or renamed itself (at the fork it is a copy of its parent)
        for pid, (parent, group, t) in list(pending.items()):
            if time.monotonic() - t < 0.5:
                continue
            del pending[pid]
            if pid not in known:
                known[pid] = group
                p = read_proc(pid)
                comm, cmd = (p.comm, p.cmdline) if p else ("?", "(exited)")
                why = f"child of {parent} (started while tracing)"
                _append(tsv, Match(pid, group, why, comm, cmd), captures)
        for m in resolve(
            names,
            args.pid,
            children=args.children,
            kv_server=not args.no_kv_server,
            procs=procs,
            exclude=set(args.exclude),
        ):
            if m.pid in known:
                continue
            g = _group_for(m, procs, known)
            known[m.pid] = m.group = g
            m.why += " (started while tracing)"
            _mail(m.pid, g)
            _append(tsv, m, captures)
        time.sleep(args.interval_s)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.cmd == "watch":
        return watch(args)
    ms = resolve(
        _names(args.names),
        args.pid,
        children=args.children,
        kv_server=not args.no_kv_server,
        exclude=set(args.exclude),
    )
    lines = ["# pid\tgroup\tcomm\twhy\tcmdline"] + [m.tsv() for m in ms]
    if args.out:
        with open(os.path.join(args.out, "matched.tsv"), "w") as f:
            f.write("\n".join(lines) + "\n")
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
