"""The suite's shared helpers (tests/helpers.py) and the `root` marker's skip (tests/conftest.py)."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import free_port, wait_for

REPO = Path(__file__).resolve().parents[1]


def test_wait_for_returns_the_first_truthy_value():
    calls = iter([0, None, "", 7, 8])
    assert wait_for(lambda: next(calls), timeout_s=5, interval_s=0) == 7


def test_wait_for_fails_with_what_it_waited_for():
    with pytest.raises(AssertionError, match=r"timed out after 0.05 s waiting for the moon"):
        wait_for(lambda: False, timeout_s=0.05, interval_s=0.01, what="the moon")


def test_a_predicate_that_fails_stops_the_wait_at_once():
    def child_alive():
        raise AssertionError("the child exited with 1")

    with pytest.raises(AssertionError, match="the child exited with 1"):
        wait_for(child_alive, timeout_s=60)


def test_free_port_can_be_listened_on():
    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()


@pytest.mark.root(reason="the marker's own check")
def test_marked_root_runs_only_as_root():
    assert os.geteuid() == 0


@pytest.mark.slow
def test_the_root_marker_skips_with_its_reason_when_not_root():
    # pytest in a child that believes it is not root, on the test above
    script = (
        "import os, sys, pytest; os.geteuid = lambda: 1000\n"
        "sys.exit(pytest.main(['-q', '-rs', '-p', 'no:cacheprovider', sys.argv[1]]))\n"
    )
    node = f"{Path(__file__).relative_to(REPO)}::test_marked_root_runs_only_as_root"
    p = subprocess.run([sys.executable, "-c", script, node], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "1 skipped" in p.stdout and "needs root: the marker's own check" in p.stdout, p.stdout


def test_the_packages_are_the_repository_s():
    import kvconnector
    import replay
    import tracing

    for package in (kvconnector, replay, tracing):
        assert Path(package.__file__).resolve().parent == REPO / package.__name__, package.__file__


@pytest.mark.slow
@pytest.mark.parametrize("how", ["python -m pytest", "pytest"])
def test_the_suite_imports_the_repository_s_packages_from_any_directory(tmp_path, how):
    # tests/ has folders named like the packages; started elsewhere, pytest must still import the real ones
    cmd = (
        [sys.executable, "-m", "pytest"] if how == "python -m pytest" else [str(Path(sys.executable).parent / "pytest")]
    )
    node = f"{Path(__file__)}::test_the_packages_are_the_repository_s"
    p = subprocess.run(
        cmd + ["-q", "-p", "no:cacheprovider", node], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    assert "1 passed" in p.stdout, p.stdout
