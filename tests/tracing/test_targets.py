"""What a name means to the tracer: matching rules on command lines as vLLM
0.32, LMCache and bystanders have them, resolution on real processes (a
stand-in stack: renamed engine, KV server found by its port, a decoy), and
live captures through the wrapper (a child started while tracing is traced,
per-process breakdown, one capture per instance, the no-I/O warning)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import free_port
from trace_helpers import TRACING, disk_tmp_dir, needs_bpftrace, needs_root, wait_attached

from tracing.distill import validate_job
from tracing.histparse import parse_trace
from tracing.report import format_processes, process_rows, read_matched
from tracing.targets import Proc, kv_server_ports, name_matches, resolve

SH = TRACING / "storage_latency_stack.sh"
WL = Path(__file__).with_name("stack_workload.py")


def P(comm: str, *argv: str, pid: int = 10, ppid: int = 1) -> Proc:
    return Proc(pid, ppid, comm, tuple(argv))


KVCFG = json.dumps(
    {
        "kv_connector": "LMCacheMPConnector",
        "kv_connector_module_path": "lmcache.integration.vllm.lmcache_mp_connector",
        "kv_connector_extra_config": {"lmcache.mp.host": "tcp://127.0.0.1", "lmcache.mp.port": 5555},
    }
)


@pytest.mark.parametrize(
    "proc,name,hit",
    [
        (P("python", "/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model", "m"), "vllm", True),
        (P("VLLM::EngineCor", "VLLM::EngineCore"), "vllm", True),  # setproctitle: comm and argv renamed
        (P("VLLM::Worker_TP", "VLLM::Worker_TP0"), "vllm", True),
        (P("vllm", "/usr/local/bin/vllm", "serve", "m"), "vllm", True),
        (P("python", "python3", "-m", "lmcache.v1.multiprocess.http_server", "--port", "5555"), "lmcache", True),
        (P("lmcache_server", "/usr/bin/lmcache_server"), "lmcache", True),
        # bystanders: the name is in the arguments, not the program
        (P("tail", "tail", "-f", "/tmp/vllm0.log"), "vllm", False),
        (P("grep", "grep", "vllm"), "vllm", False),
        (P("python", "python", "-m", "pytest", "-k", "vllm"), "vllm", False),
        (P("vllmx", "vllmx"), "vllm", False),  # a longer word is another program
        # the engine's own command line names LMCache's module: not a program
        (
            P("python", "python", "-m", "vllm.entrypoints.openai.api_server", "--kv-transfer-config", KVCFG),
            "lmcache",
            False,
        ),
    ],
)
def test_name_matching_rules(proc, name, hit):
    assert (name_matches(proc, name) is not None) == hit


def test_kv_server_port_from_the_engines_command_line():
    assert kv_server_ports(P("python", "python", "-m", "vllm.x", "--kv-transfer-config", KVCFG)) == [5555]
    assert kv_server_ports(P("python", "python", "-m", "vllm.x", f"--kv-transfer-config={KVCFG}")) == [5555]
    inproc = json.dumps({"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"})
    assert kv_server_ports(P("python", "python", "-m", "vllm.x", "--kv-transfer-config", inproc)) == []
    assert kv_server_ports(P("python", "python", "--kv-transfer-config", "{not json")) == []


class FakeStack:
    """Stand-in instances (front + engine + KV server on its own port) and a decoy doing I/O."""

    made = 0

    def __init__(self, work: Path, seconds: float, instances: int = 1):
        # a name of this test's own: tests running side by side (xdist) must not match each other's stacks
        FakeStack.made += 1
        self.tag = f"k{os.getpid() % 10000}{chr(96 + FakeStack.made)}"  # k1234a::Engine: within 15 characters
        self.procs: list[subprocess.Popen] = []
        self.fronts, self.engines, self.servers = [], [], []
        self.work = work
        for i in range(instances):
            d = work / f"inst{i}"
            d.mkdir(parents=True, exist_ok=True)
            port = free_port()
            srv = self._start("kvserver", str(port), str(d / "kv.dat"), str(seconds))
            assert srv.stdout.readline().strip() == "ready"
            cfg = json.dumps(
                {"kv_connector": "LMCacheMPConnector", "kv_connector_extra_config": {"lmcache.mp.port": port}}
            )
            front = self._start("front", str(d), str(seconds), self.tag, "--kv-transfer-config", cfg)
            line = front.stdout.readline().split()
            assert line[0] == "ready"
            self.servers.append(srv.pid)
            self.fronts.append(front)
            self.engines.append(int(line[1]))
        # a process with the name in its arguments only (and in its file name), doing I/O
        self.decoy = subprocess.Popen(
            [
                sys.executable,
                str(Path(__file__).with_name("io_workload.py")),
                str(work / f"{self.tag}-decoy.dat"),
                str(seconds),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        self.procs.append(self.decoy)
        assert self.decoy.stdout.readline().strip() == "ready"

    def _start(self, *args: str) -> subprocess.Popen:
        # own process group: the forked children go with their front at the end
        p = subprocess.Popen(
            [sys.executable, str(WL), *args], stdout=subprocess.PIPE, text=True, start_new_session=True
        )
        self.procs.append(p)
        return p

    def start_late(self, i: int = 0) -> int:
        (self.work / f"inst{i}" / "go").touch()
        line = self.fronts[i].stdout.readline().split()
        assert line[0] == "late"
        return int(line[1])

    def close(self):
        for p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                p.kill()
            p.wait()


@pytest.fixture
def work():
    w = Path(disk_tmp_dir()) / f"kvtier-targets-{os.getpid()}"
    w.mkdir(exist_ok=True)
    yield w
    shutil.rmtree(w, ignore_errors=True)


@pytest.mark.slow
def test_resolve_finds_engine_children_and_kv_server_not_the_decoy(work):
    st = FakeStack(work, 20, instances=2)
    try:
        ms = {m.pid: m for m in resolve([st.tag], [])}
        for i in range(2):
            front, eng, srv = st.fronts[i].pid, st.engines[i], st.servers[i]
            assert {front, eng, srv} <= set(ms), ms
            assert f"task name '{st.tag}::Front'" in ms[front].why
            assert "KV server of" in ms[srv].why and "port" in ms[srv].why
            # one instance per engine, its KV server in it
            assert ms[front].group == ms[eng].group == ms[srv].group
        assert ms[st.fronts[0].pid].group != ms[st.fronts[1].pid].group
        assert st.decoy.pid not in ms
        # --no-kv-server: the server's task is "python3", its program stack_workload: not matched
        assert st.servers[0] not in {m.pid for m in resolve([st.tag], [], kv_server=False)}
        # a pid alone is that process; --children adds its children
        assert {m.pid for m in resolve([], [st.fronts[0].pid], kv_server=False)} == {st.fronts[0].pid}
        kids = {m.pid for m in resolve([], [st.fronts[0].pid], children=True, kv_server=False)}
        assert kids == {st.fronts[0].pid, st.engines[0]}
    finally:
        st.close()


live = [pytest.mark.slow, needs_root, needs_bpftrace]


def _live(f):
    for mark in reversed(live):
        f = mark(f)
    return f


def _trace(work: Path, out: Path, *args: str, timeout: float = 120) -> subprocess.Popen:
    return subprocess.Popen(
        ["bash", str(SH), *args, "--dev", str(work), "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@_live
def test_name_traces_the_stack_and_a_child_started_while_tracing(work, tmp_path):
    st = FakeStack(work, 40)
    out = tmp_path / "t"
    try:
        tr_proc = _trace(work, out, st.tag, "--duration", "10", "--fio")
        wait_attached(out, tr_proc)  # from here bpftrace follows forks and the watcher rescans: a child now is late
        late = st.start_late()
        _, err = tr_proc.communicate(timeout=120)
        assert tr_proc.returncode == 0, err
        # the matched set is printed at start: pid, task, why
        assert re.search(
            rf"^storage_latency_stack:\s+{st.engines[0]} \[1\] {st.tag}::Engine: {st.tag}: task name", err, re.M
        )
        assert re.search(rf"^storage_latency_stack:\s+{st.servers[0]} \[1\] \S+: KV server of \d+ \(port", err, re.M)
        matched = read_matched(out / "matched.tsv")
        assert late in matched and "started while tracing" in matched[late]["why"], matched
        tr = parse_trace((out / "trace.txt").read_text())
        rows = {r["pid"]: r for r in process_rows(tr, matched)}
        # block I/O attributed to each: the engine, the KV server and the late child (followed from its fork)
        for pid in (st.engines[0], st.servers[0], late):
            assert rows[pid]["read_bytes"] > 0 and rows[pid]["write_bytes"] > 0, (pid, rows)
        assert st.decoy.pid not in rows  # it did as much I/O, on the same disk
        assert f"kvtier_follow: {late} {st.fronts[0].pid} 1" in (out / "trace.txt").read_text()
        table = format_processes(tr, matched)
        assert f"{st.tag}::Late" in table and "KV server of" in table
        assert validate_job((out / "job.fio").read_text()) is None
    finally:
        st.close()


@_live
def test_per_instance_captures_each_get_a_job(work, tmp_path):
    st = FakeStack(work, 30, instances=2)
    out = tmp_path / "t"
    try:
        p = _trace(work, out, st.tag, "--per-instance", "--duration", "6", "--fio", "--no-syscalls")
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        for g in (1, 2):
            d = out / f"group{g}"
            assert validate_job((d / "job.fio").read_text()) is None
            assert f"instance{g}-distilled" in (d / "job.fio").read_text()
            tr = parse_trace((d / "trace.txt").read_text())
            pids = {r["pid"] for r in process_rows(tr) if r["read_bytes"] + r["write_bytes"] > 0}
            # each capture holds its instance's processes only
            assert st.engines[g - 1] in pids and st.servers[g - 1] in pids, pids
            assert st.engines[2 - g] not in pids and st.servers[2 - g] not in pids, pids
    finally:
        st.close()


@_live
def test_warns_while_tracing_when_the_targets_do_no_block_io(tmp_path):
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "kvidle"])
    try:
        # comm "python3", no name match: trace it by pid with --children (the watcher runs)
        p = _trace(Path("/var/tmp"), tmp_path / "t", "--pid", str(idle.pid), "--children", "--duration", "9")
        lines, seen_at = [], None
        t0 = time.monotonic()
        for line in p.stderr:
            lines.append(line)
            if "no block I/O from the traced processes" in line and seen_at is None:
                seen_at = time.monotonic() - t0
        p.wait(timeout=60)
        total = time.monotonic() - t0
        assert seen_at is not None, "".join(lines)
        assert seen_at < total - 2, (seen_at, total)  # said while tracing, not at the end
    finally:
        idle.kill()
        idle.wait()


def test_report_breaks_bytes_down_by_process_and_instance(tmp_path):
    text = (
        "# kvtier layers_on: owner perproc block\n"
        "capture_window_ns: 1000000000\n"
        "@proc_read_bytes[101, python]: 4194304\n"
        "@proc_read_bytes[202, python]: 1048576\n"
        "@proc_write_bytes[101, python]: 2097152\n"
        "@proc_write_bytes[303, VLLM::Worker]: 8192\n"
        "@io_read_bytes[135168]: 3\n"
        "# kvtier missed_events: 0\n"
    )
    tsv = tmp_path / "matched.tsv"
    tsv.write_text(
        "# pid\tgroup\tcomm\twhy\tcmdline\n"
        "101\t1\tpython\tKV server of 100 (port 5555)\tpython -m lmcache...\n"
        "202\t2\tpython\tKV server of 200 (port 5556)\tpython -m lmcache...\n"
        "303\t1\tVLLM::Worker\tchild of 100\tVLLM::Worker\n"
        "100\t1\tpython\tvllm: program 'vllm.entrypoints.openai.api_server'\tpython -m vllm...\n"
    )
    tr = parse_trace(text)
    rows = {r["pid"]: r for r in process_rows(tr, read_matched(tsv))}
    assert rows[101]["read_bytes"] == 4 << 20 and rows[101]["write_bytes"] == 2 << 20 and rows[101]["group"] == 1
    assert rows[100]["read_bytes"] == 0 and rows[100]["group"] == 1  # matched, no I/O: listed
    table = format_processes(tr, read_matched(tsv))
    assert "instance 1: 3 processes, read 4.0 MiB, write 2.0 MiB" in table
    assert "instance 2: 1 process, read 1.0 MiB, write 0 B" in table
    assert "issued to the device: read 396.0 KiB" in table
    # a --per-instance capture: its instance only
    per = parse_trace(
        text.replace("# kvtier layers_on", "# kvtier filter: vllm instance 2 dev loop0 (7:0)\n# kvtier layers_on")
    )
    table2 = format_processes(per, read_matched(tsv))
    assert "KV server of 200" in table2 and "KV server of 100" not in table2
    # one process traced: no per-process counts in the trace, so none are shown as zero
    one = parse_trace("capture_window_ns: 1\n@issued_read: 0\n")
    assert "    -          -" in format_processes(one, {7: {"group": 1, "comm": "fio", "why": "--pid", "cmdline": ""}})
