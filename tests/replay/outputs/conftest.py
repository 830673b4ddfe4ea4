"""Results documents for the output writers, written by a current `kvtier bench`: one short run of the tiny model with
the prefix cache, RAG, the autoscaler and QoS on (one class with an SLA no run meets, so both verdicts are there), and
the same as two clients for the sections a multi-client run adds. Each run happens once per session (once per session
under xdist too: the first worker writes the document, the others read it); tests get a copy to change freely.
Tests read the numbers they expect from these documents, never from constants."""

import copy
import json
from pathlib import Path

import pytest
from bench_helpers import run
from filelock import FileLock

# interactive's targets are below any real latency (always missed), the others' far above (always met)
QOS = {
    "interactive": {"priority": 3, "target_p95_ms": 0.001, "target_p99_ms": 0.002},
    "responsive": {"priority": 2, "target_p95_ms": 60_000, "target_p99_ms": 60_000},
    "batch": {"priority": 1, "target_p95_ms": 60_000, "target_p99_ms": 60_000},
}
RUN = {
    "duration": 2.0,
    "num_users": 8,
    "enable_rag": True,
    "rag_num_docs": 3,
    "enable_autoscaling": True,
    "autoscaler": {"interval_s": 0.25, "cooldown_s": 0},  # several steps in 2 s
    "qos_profiles": QOS,
}


def _bench(tmp: Path, **overrides) -> dict:
    (tmp / "cache").mkdir()  # the multi-client driver looks up the block device of an existing directory
    doc = run(tmp, **RUN, **overrides)
    assert doc.pop("_rc") == 0 and doc["status"] == "completed", doc.get("error")
    return doc


def _once(name: str, tmp_path_factory, worker_id: str, **overrides) -> dict:
    tmp = tmp_path_factory.mktemp(name)
    if worker_id == "master":  # no xdist: the session fixture already runs once
        return _bench(tmp, **overrides)
    shared = tmp_path_factory.getbasetemp().parent / f"{name}.json"  # this session's folder, shared by its workers
    with FileLock(f"{shared}.lock"):
        if not shared.exists():
            shared.write_text(json.dumps(_bench(tmp, **overrides)))
        return json.loads(shared.read_text())


@pytest.fixture(scope="session")
def _single_run(tmp_path_factory, worker_id) -> dict:
    return _once("bench-single", tmp_path_factory, worker_id)


@pytest.fixture(scope="session")
def _clients_run(tmp_path_factory, worker_id) -> dict:
    return _once("bench-clients", tmp_path_factory, worker_id, num_clients=2)


@pytest.fixture
def sample_doc(_single_run) -> dict:
    """One client's document: every section but `clients`."""
    return copy.deepcopy(_single_run)


@pytest.fixture
def full_doc(_clients_run) -> dict:
    """Two clients merged: the single-client sections plus `clients` and summary.num_clients."""
    return copy.deepcopy(_clients_run)
