"""The error contract of every `kvtier` subcommand (docs/errors.md), through the dispatcher in this process:

- a refusal (a bad value, a missing file) is exit 2 and exactly one line on stderr, `kvtier SUB: ...`;
- a bug (here planted: an internal function made to raise RuntimeError or a plain ValueError) is exit 1 and one
  line naming the exception and a log file, which exists and holds the traceback; never a traceback on stderr;
- `kvtier bench` and `kvtier replay` still write what they measured when the bug strikes mid-run.

No servers but the in-process fake OpenAI server, no sleeps. Crash logs go to tmp_path (tempfile.tempdir)."""

from __future__ import annotations

import ast
import json
import pkgutil
import re
import tempfile
from pathlib import Path

import pytest
import yaml

from replay.cli import SUBCOMMANDS, main

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def logs_in_tmp(tmp_path, monkeypatch):
    """Crash logs in this test's directory (the dispatcher writes them to tempfile.gettempdir())."""
    logs = tmp_path / "logs"
    logs.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(logs))
    monkeypatch.chdir(tmp_path)
    return logs


def kvtier(capsys, *argv: str) -> tuple[int, list[str]]:
    try:
        rc = main(list(argv))
    except SystemExit as exc:  # argparse's own refusals
        rc = exc.code
    return rc, capsys.readouterr().err.strip().splitlines()


def refused(capsys, sub: str, *argv: str, said: str = "") -> str:
    rc, lines = kvtier(capsys, sub, *argv)
    assert rc == 2, lines
    assert len(lines) == 1 and lines[0].startswith(f"kvtier {sub}: "), lines
    assert said in lines[0]
    return lines[0]


def bug(capsys, logs: Path, sub: str, *argv: str, planted: str = "planted") -> str:
    """Exit 1, one line naming the exception and the log file; the log holds the traceback. Returns the line."""
    rc, lines = kvtier(capsys, sub, *argv)
    assert rc == 1, lines
    assert not any("Traceback" in ln for ln in lines), lines
    said = [ln for ln in lines if ln.startswith(f"kvtier {sub}: internal error (")]
    assert len(said) == 1, lines
    m = re.search(r"the traceback is in (\S+\.log)$", said[0])
    assert m and planted in said[0], said[0]
    log = Path(m.group(1))
    assert log.parent == logs and log.name.startswith(f"kvtier-{sub}-")
    text = log.read_text()
    assert "Traceback (most recent call last)" in text and planted in text and f"command: kvtier {sub}" in text
    assert log.stat().st_mode & 0o077 == 0  # the owner's alone: a command line may hold a secret
    return said[0]


def plant(monkeypatch, target: str, exc: type[BaseException] = RuntimeError, after: int = 0, wrap: bool = False):
    """Make `target` (module.attr) raise `exc("planted bug")`, on its call number after + 1 (the real one before)."""
    owner_name, _, name = target.rpartition(".")
    owner = pkgutil.resolve_name(owner_name)
    real = getattr(owner, name)
    calls = [0]

    def check() -> None:
        calls[0] += 1
        if calls[0] > after:
            raise exc("planted bug")

    if wrap:  # a coroutine function: the real call first, then the bug

        async def planted(*a, **k):
            out = await real(*a, **k)
            check()
            return out
    else:

        def planted(*a, **k):
            check()
            return real(*a, **k)

    monkeypatch.setattr(owner, name, planted)
    return calls


# ---- bench ----------------------------------------------------------------------------------------------------------
def bench_config(tmp_path: Path) -> str:
    cfg = {
        "model": "small",
        "model_configs": {"small": {"num_layers": 4, "kv_heads": 2, "head_dim": 64}},
        "user_templates": {
            "chat": {"context_tokens": [64, 256], "generate_tokens": [16, 64], "think_time_s": [0.0, 0.0]}
        },
        "request_model": "kvtier",
        "size_unit": "GB",
        "gpu_mem_gb": 0,
        "cpu_mem_gb": 0.002,
        "storage_capacity_gb": 0.2,
        "random_buffer_mb": 16,
        "duration": 30,
        "num_users": 2,
        "seed": 11,
        "progress": False,
        "cache_dir": str(tmp_path / "cache"),
        "output": str(tmp_path / "out.json"),
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def test_bench(capsys, tmp_path, logs_in_tmp, monkeypatch):
    config = bench_config(tmp_path)
    refused(capsys, "bench", "--config", config, "--num-users", "-3", said="--num-users")
    refused(capsys, "bench", "--config", str(tmp_path / "missing.yaml"), said="missing.yaml")
    assert not (tmp_path / "out.json").exists()
    # A bug on the third request of the run: the run stops there, what it measured is written, then exit 1.
    plant(monkeypatch, "replay.synthetic.driver.SyntheticDriver._record_request", after=2)
    line = bug(capsys, logs_in_tmp, "bench", "--config", config)
    out = tmp_path / "out.json"
    assert f"partial results in {out}" in line
    doc = json.loads(out.read_text())
    assert doc["status"] == "failed" and doc["error"] == "internal error: RuntimeError: planted bug"
    assert doc["summary"]["elapsed_time"] < 20  # ended by the bug, not by the 30 s window
    assert not (tmp_path / "cache").exists()  # cleaned up as after any run


# ---- replay ---------------------------------------------------------------------------------------------------------
def test_replay(capsys, tmp_path, logs_in_tmp, monkeypatch):
    from replay.openai.fake_server import FakeServer, FakeServerConfig

    out = tmp_path / "out.json"
    refused(capsys, "replay", "--base-url", "ftp://x", "--model", "m", "--output", str(out), said="--base-url")
    refused(
        capsys,
        "replay",
        *("--base-url", "http://127.0.0.1:9", "--model", "m", "--output", str(out)),
        *("--source", "sharegpt", "--dataset-path", str(tmp_path / "missing.json")),
        said="missing.json",
    )
    assert not out.exists()
    # A bug after the third request came back: the run is aborted, the requests done are written, then exit 1.
    plant(monkeypatch, "replay.openai.driver.send_streaming", after=3, wrap=True)
    with FakeServer(FakeServerConfig()) as srv:
        argv = ["--base-url", srv.base_url, "--model", "fake", "--output", str(out), "--quiet"]
        argv += ["--source", "synthetic", "--input-len", "4", "--output-len", "4", "--num-requests", "40"]
        argv += ["--max-concurrency", "1"]
        line = bug(capsys, logs_in_tmp, "replay", *argv)
    assert f"partial results in {out}" in line
    doc = json.loads(out.read_text())
    assert doc["aborted"] == "internal error: RuntimeError: planted bug"
    assert 3 <= doc["completed"] < 40


# ---- compare, check, merge, report: result files in ------------------------------------------------------------------
def test_compare(capsys, tmp_path, logs_in_tmp, monkeypatch):
    refused(capsys, "compare", str(tmp_path / "a.json"), said="a.json")
    (tmp_path / "a.json").write_text("{}")
    plant(monkeypatch, "replay.synthetic.compare.load_result", ValueError)  # a plain ValueError is a bug
    bug(capsys, logs_in_tmp, "compare", str(tmp_path / "a.json"))


def test_check(capsys, tmp_path, logs_in_tmp, monkeypatch):
    refused(capsys, "check", str(tmp_path / "a.json"), said="a.json")
    refused(capsys, "check", str(tmp_path), said="not a run directory")  # a directory: a harness run's check
    plant(monkeypatch, "replay.synthetic.check.load_runs", ValueError)
    bug(capsys, logs_in_tmp, "check", str(tmp_path / "a.json"))


def test_merge(capsys, tmp_path, logs_in_tmp, monkeypatch):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    refused(capsys, "merge", str(a), str(b), "--output", str(tmp_path / "m.json"), said="a.json")
    a.write_text("{}")
    b.write_text("{}")
    refused(capsys, "merge", str(a), str(a), said="given twice")
    plant(monkeypatch, "replay.synthetic.merge.load_source")
    bug(capsys, logs_in_tmp, "merge", str(a), str(b), "--output", str(tmp_path / "m.json"))
    assert not (tmp_path / "m.json").exists()


def test_report(capsys, tmp_path, logs_in_tmp, monkeypatch):
    refused(capsys, "report", str(tmp_path / "a.json"), "-o", str(tmp_path / "r.html"), said="a.json")
    (tmp_path / "a.json").write_text("{}")
    plant(monkeypatch, "replay.outputs.html.cli.load_run")
    bug(capsys, logs_in_tmp, "report", str(tmp_path / "a.json"), "-o", str(tmp_path / "r.html"))


# ---- plan -----------------------------------------------------------------------------------------------------------
def test_plan(capsys, tmp_path, logs_in_tmp, monkeypatch):
    argv = ["--input-len", "5", "--output-len", "5", "--block-size", "16", "--kv-bytes-per-token", "1000"]
    argv += ["--tier", "dram=1GB", "--quiet", "--concurrency", "2", "--rounds", "3"]
    refused(capsys, "plan", *argv, "--rounds", "0", said="--rounds")
    refused(capsys, "plan", *argv, "--config", 'x="--tier \'unclosed"', said="--config x")
    plant(monkeypatch, "replay.plan.cli.run")
    bug(capsys, logs_in_tmp, "plan", *argv, "--output", str(tmp_path / "p.json"))


# ---- throttlefs, sweep: deploy/ --------------------------------------------------------------------------------------
def test_throttlefs(capsys, tmp_path, logs_in_tmp, monkeypatch):
    back = tmp_path / "back"
    back.mkdir()
    refused(capsys, "throttlefs", str(tmp_path / "nomnt"), "--backing", str(back), said="does not exist")
    refused(capsys, "throttlefs", str(tmp_path), "--backing", str(back), "--bw", "fast", said="not a rate")
    plant(monkeypatch, "deploy.throttle.cli.check_paths")
    bug(capsys, logs_in_tmp, "throttlefs", str(tmp_path / "nomnt"), "--backing", str(back))


def test_sweep(capsys, tmp_path, logs_in_tmp, monkeypatch):
    base = ["--bw", "1GB/s", "--lat-ms", "0", "--driver", "bench", "--output", str(tmp_path / "s.json")]
    refused(capsys, "sweep", *base, "--repeat", "0", said="--repeat")
    refused(capsys, "sweep", "--bw", "1XB/s", *base[2:], said="1XB/s")
    plant(monkeypatch, "deploy.sweep.cli._check_driver_args", ValueError)
    bug(capsys, logs_in_tmp, "sweep", *base)
    assert not (tmp_path / "s.json").exists()


# ---- distill: tracing/ keeps its own DistillError (it imports nothing of the project), the dispatcher its bugs ------
def test_distill(capsys, tmp_path, logs_in_tmp, monkeypatch):
    refused(capsys, "distill", "-i", str(tmp_path / "trace.txt"), said="trace.txt")
    (tmp_path / "trace.txt").write_text("not a trace\n")
    plant(monkeypatch, "tracing.distill.parse_trace")
    bug(capsys, logs_in_tmp, "distill", "-i", str(tmp_path / "trace.txt"))


# ---- mlperf: the MLPerf harness's shim and run summary --------------------------------------------------------------
def test_mlperf(capsys, tmp_path, logs_in_tmp, monkeypatch):
    refused(capsys, "mlperf", "summary", str(tmp_path / "nope"), said="nope: not a directory")
    (tmp_path / "ref").mkdir()
    (tmp_path / "ref" / "kv-cache.py").write_text("")
    refused(capsys, "mlperf", "shim", str(tmp_path / "ref"), said="no kvtier shim's")
    (tmp_path / "run" / "option_1").mkdir(parents=True)
    plant(monkeypatch, "replay.mlperf.cli.summarize")
    bug(capsys, logs_in_tmp, "mlperf", "summary", str(tmp_path / "run"))
    assert not list((tmp_path / "run").glob("kvcache_run_summary_*"))


# ---- conformance: an LMCache L2 adapter through failures -------------------------------------------------------------
def test_conformance(capsys, tmp_path, logs_in_tmp, monkeypatch):
    pytest.importorskip("lmcache")
    capsys.readouterr()  # what LMCache logs as it is imported
    medium = str(tmp_path / "m")
    refused(capsys, "conformance", "--adapter", "fs", "--config", "{}", "--medium", medium, said="one of them")
    refused(capsys, "conformance", "--config", '{"type": "fs"}', "--medium", medium, said="could not be built")
    plant(monkeypatch, "replay.conformance.run_cases")
    bug(capsys, logs_in_tmp, "conformance", "--adapter", "fs", "--medium", medium)


def test_every_subcommand_is_covered_here():
    tested = {name.removeprefix("test_") for name in globals() if name.startswith("test_")}
    assert set(SUBCOMMANDS) <= tested


def test_an_unwritable_log_place_still_gives_the_traceback(capsys, tmp_path, monkeypatch):
    """No log can be made (the temp directory is gone): the line says so and the traceback follows it."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "gone"))
    plant(monkeypatch, "replay.synthetic.check.load_runs")
    rc, lines = kvtier(capsys, "check", "x.json")
    assert rc == 1 and "no log written" in lines[0] and "traceback follows" in lines[0]
    assert lines[1].startswith("Traceback") and "planted bug" in lines[-1]


def test_a_log_never_replaces_a_file(capsys, tmp_path, logs_in_tmp, monkeypatch):
    """The log's name is taken with O_EXCL: a file (or a link planted) under that name is left alone."""
    import datetime as dt
    import os

    victim = tmp_path / "victim"
    victim.write_text("mine")
    stamp = dt.datetime.now().strftime("%Y%m%dT%H%M%S")
    for s in {stamp, (dt.datetime.now() + dt.timedelta(seconds=1)).strftime("%Y%m%dT%H%M%S")}:
        os.symlink(victim, logs_in_tmp / f"kvtier-check-{s}-{os.getpid()}.log")
    plant(monkeypatch, "replay.synthetic.check.load_runs")
    line = bug(capsys, logs_in_tmp, "check", "x.json")
    assert line.endswith(f"-{os.getpid()}-1.log")
    assert victim.read_text() == "mine"


# ---- the refusal classes ---------------------------------------------------------------------------------------------
REFUSALS = {  # raised for what the user gave: each derives from UserError (one line, exit 2)
    "kvconnector.errors": ["ConfigError"],
    "replay.common.json_files": ["InputError"],
    "replay.sources.base": ["WorkloadError"],
    "replay.outputs.results_file": ["ResultsFileError"],
    "replay.outputs.html.kinds": ["ReportError"],
    "replay.synthetic.compare": ["CompareError"],
    "replay.synthetic.merge": ["MergeError"],
    "replay.synthetic.check": ["BadInput"],
    "replay.mlperf.record": ["RunDirError"],
    "replay.mlperf.run": ["RuleRefusal"],
    "replay.plan.cli": ["_ConfigFlagsError"],
    "deploy.throttle.settings": ["SettingError"],
    "deploy.redis_cluster": ["ClusterRefused"],
    "deploy.ceph": ["CephRefused"],
    "deploy.mooncake_store": ["StoreRefused"],
}
NOT_REFUSALS = {  # failures or bugs, never the user's input: exit 1 where they escape
    # the store failed, a miss; or its caller misused the library (a key no tier holds, a call after close): a bug
    "kvconnector.errors": [
        "StorageFullError",
        "CorruptEntryError",
        "EntryNotFound",
        "InvalidArgumentError",
        "StoreClosedError",
    ],
    "kvconnector.vllm.driver": ["DriverTimeout"],  # an I/O did not finish in time
    "replay.openai.mpi_run": ["JobFailed"],  # another rank failed (it carries that rank's exit status)
    "replay.openai.server_metrics": ["_TooLarge"],  # a /metrics page over the bound: recorded, not raised out
    "replay.openai.prometheus_source": ["PrometheusError"],  # a query failed: recorded in the run's scrape errors
    "replay.openai.client": ["_SSEError"],  # the server's stream is malformed: recorded on the request
    "replay.sources.block_traces": ["LoadStopped"],  # a signal stopped a trace's load in a worker thread
    "deploy.throttle.runner": ["MountError"],  # throttlefs did not mount
    "deploy.throttle.control": ["ControlError"],  # the control endpoint failed or refused a change
    "deploy.redis_cluster": ["ClusterError"],  # the cluster did not start (ClusterRefused: what was asked)
    "deploy.ceph": ["CephError"],  # the cluster did not start or answer (CephRefused: what was asked)
    "deploy.mooncake_store": ["StoreError"],  # the store did not start (StoreRefused: what was asked)
    "deploy.sweep.cli": ["StackFailed"],  # the stack did not start
    "deploy.nodes": ["NoFreeNet"],  # no free subnet for the nodes' bridge
    "deploy.slurm": ["SlurmError"],  # a Slurm daemon exited or its nodes did not come up (refusals: exit 2 itself)
    "deploy.processes": ["NotHealthy"],  # a server exited or did not answer during start-up
    # run-stack.sh's Python (standard library only: the thin script may find a bare python3) answers exit 2 itself
    "deploy.run_stack": ["Refused"],
    "benchmarks.ttft_kvtier_vs_lmcache": ["BenchError"],  # benchmark scripts, not subcommands
    "benchmarks.bench_scaling": ["BenchFailed"],
    # tracing/ imports nothing of the project (it runs alone on a node): its refusals answer exit 2 themselves
    "tracing.distill": ["_ArgError"],
    "tracing.distiller": ["DistillError"],
    "tracing.histparse": ["TraceParseError"],
    "tracing.session": ["TraceSessionError", "TracingUnavailable"],  # bench turns the latter into a ConfigError
}


@pytest.mark.parametrize("module, name", [(m, n) for m, names in REFUSALS.items() for n in names])
def test_refusals_are_user_errors(module, name):
    from kvconnector.errors import UserError

    cls = getattr(__import__(module, fromlist=[name]), name)
    assert issubclass(cls, UserError)


@pytest.mark.parametrize("module, name", [(m, n) for m, names in NOT_REFUSALS.items() for n in names])
def test_failures_are_not_user_errors(module, name):
    from kvconnector.errors import UserError

    cls = getattr(__import__(module, fromlist=[name]), name)
    assert not issubclass(cls, UserError)


def test_every_error_class_is_classified():
    """A new exception class (a name ending in Error, or any subclass of an exception) is sorted into one list."""
    known = {(m, n) for d in (REFUSALS, NOT_REFUSALS) for m, names in d.items() for n in names}
    found = set()
    for top in ("kvconnector", "replay", "deploy", "tracing", "benchmarks"):
        for path in (REPO / top).rglob("*.py"):
            module = ".".join(path.relative_to(REPO).with_suffix("").parts)
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.ClassDef):
                    continue
                bases = {ast.unparse(b) for b in node.bases}
                if node.name.endswith("Error") or any(b.endswith(("Error", "Exception")) for b in bases):
                    found.add((module, node.name))
    bases = {("kvconnector.errors", "KvtierError"), ("kvconnector.errors", "UserError")}
    unclassified = sorted(found - known - bases)
    assert not unclassified, f"sort these into REFUSALS or NOT_REFUSALS: {unclassified}"
