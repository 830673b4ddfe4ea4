"""Nothing left behind after a kill: `kvtier bench` processes are SIGKILLed for real in the middle of a run, and the
next run on the same directory removes what a dead run left, says so in one line, and never touches what a live
run, a kept cache (--keep-cache) or the user holds. `--num-clients` children die with their parent; a run leaves
neither its `client-N/` directories nor the part of --cache-dir's path it created."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvconnector.entry_format import ENTRY_NAME
from replay.common.leftovers import made_dirs, remove_empty

pytestmark = pytest.mark.slow

SHORT = ["--num-users", "3", "--duration", "1", "--cpu-mem-gb", "0", "--gpu-mem-gb", "0"]
SHORT += ["--storage-capacity-gb", "0.2", "--max-context-tokens", "256", "--seed", "1"]
LONG = [*SHORT[:2], "--duration", "120", *SHORT[4:]]


def bench(args: list[str], out: Path, env: dict | None = None, **kw) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "replay.cli", "bench", *args, "--output", str(out)]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, **kw)


def wait_for(pred, what: str, timeout_s: float = 90):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        got = pred()
        if got:
            return got
        time.sleep(0.1)
    pytest.fail(f"timed out waiting for {what}")


def run_dirs_with_entries(base: Path) -> list[Path]:
    """Run directories below `base` holding entries. Runs remove theirs while this looks (os.walk passes over a
    directory gone meanwhile; rglob raised FileNotFoundError)."""
    found = []
    for top, dirs, _ in os.walk(base):
        for name in dirs:
            if name.startswith("kvtier-run-"):
                try:
                    if any(ENTRY_NAME.fullmatch(n) for n in os.listdir(os.path.join(top, name))):
                        found.append(Path(top, name))
                except FileNotFoundError:
                    continue
    return found


def children_of(pid: int) -> list[int]:
    out = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                stat = Path(f"/proc/{p}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(p))
    return out


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def finish(p: subprocess.Popen, timeout_s: float = 120) -> str:
    _, err = p.communicate(timeout=timeout_s)
    return err


@pytest.mark.parametrize("cache", ["existing", "missing/nested/path"])
@pytest.mark.parametrize("clients", [1, 2])
def test_a_killed_runs_cache_is_removed_by_the_next_run_and_said_in_one_line(tmp_path, cache, clients):
    cache_dir = tmp_path / cache
    if cache == "existing":
        cache_dir.mkdir()
        (cache_dir / "users-file.txt").write_text("mine")  # a user's file beside: never touched
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    first = bench([*LONG, "--cache-dir", str(cache_dir), "--num-clients", str(clients)], tmp_path / "a.json", env)
    try:
        wait_for(lambda: len(run_dirs_with_entries(cache_dir)) == clients, "the run's cache to fill")
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(30)
        first.stderr.close()
    if clients > 1:
        # The clients die with their parent (SIGTERM: each removes its own cache, as on Ctrl-C).
        wait_for(lambda: not run_dirs_with_entries(cache_dir), "the clients to clean up after the parent's kill")
        leftovers = list(tmp_path.glob("kvtier-clients-*"))
        assert len(leftovers) == 1  # the parent's work files: only it could remove them
    else:
        assert run_dirs_with_entries(cache_dir)  # a SIGKILLed run removes nothing; the next one does
    second = bench([*SHORT, "--cache-dir", str(cache_dir), "--num-clients", str(clients)], tmp_path / "b.json", env)
    err = finish(second)
    assert second.returncode == 0, err
    said = [line for line in err.splitlines() if "left by runs no longer alive" in line]
    assert len(said) == 1, err
    assert not list(tmp_path.glob("kvtier-clients-*"))
    left = sorted(p.relative_to(cache_dir).as_posix() for p in cache_dir.rglob("*"))
    assert left == (["users-file.txt"] if cache == "existing" else [])


@pytest.mark.parametrize("keep_cache", [False, True])
def test_a_live_runs_cache_and_a_kept_one_are_never_removed(tmp_path, keep_cache):
    cache_dir = tmp_path / "cache"
    kept = []
    if keep_cache:
        p = bench([*SHORT, "--cache-dir", str(cache_dir), "--keep-cache"], tmp_path / "k.json")
        assert finish(p) is not None and p.returncode == 0
        kept = list(cache_dir.glob("kvtier-run-*"))
        assert len(kept) == 1
    live = bench([*LONG, "--cache-dir", str(cache_dir)], tmp_path / "live.json")
    try:
        (live_dir,) = wait_for(
            lambda: [d for d in run_dirs_with_entries(cache_dir) if d not in kept], "the live run's cache"
        )
        other = bench([*SHORT, "--cache-dir", str(cache_dir)], tmp_path / "b.json")
        err = finish(other)
        assert other.returncode == 0, err
        assert "no longer alive" not in err
        assert live_dir.is_dir() and all(d.is_dir() for d in kept)
        assert live.poll() is None
    finally:
        live.send_signal(signal.SIGTERM)
        finish(live)
    # The live run made the cache directory: it removes it at its end unless the kept run's cache is in it.
    assert (sorted(cache_dir.iterdir()) if cache_dir.exists() else []) == kept


@pytest.mark.parametrize("depth", [1, 3, 6])
@pytest.mark.parametrize("clients", [1, 2, 3])
def test_a_run_leaves_no_directory_it_created(tmp_path, depth, clients):
    """Neither `client-N/` nor the missing part of --cache-dir's path outlive a run."""
    cache_dir = tmp_path.joinpath(*[f"d{i}" for i in range(depth)])
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    p = bench([*SHORT, "--cache-dir", str(cache_dir), "--num-clients", str(clients)], tmp_path / "out.json", env)
    err = finish(p)
    assert p.returncode == 0, err
    assert sorted(x.name for x in tmp_path.iterdir()) == ["out.json"]


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT])
def test_clients_die_with_their_parent(tmp_path, sig):
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    parent = bench([*LONG, "--cache-dir", str(tmp_path / "cache"), "--num-clients", "2"], tmp_path / "o.json", env)
    try:
        kids = wait_for(lambda: len(children_of(parent.pid)) == 2 and children_of(parent.pid), "two clients")
        wait_for(lambda: len(run_dirs_with_entries(tmp_path / "cache")) == 2, "the clients to run")
    finally:
        parent.send_signal(sig)
        parent.wait(60)
        parent.stderr.close()
    wait_for(lambda: not any(alive(k) for k in kids), "the clients to end")
    wait_for(lambda: not run_dirs_with_entries(tmp_path / "cache"), "the clients' caches to go")


WATCHED = """
import os, signal, sys, time
from replay.common.leftovers import watchdog
# Ctrl-C ends it as it ends a kvtier run, also when started where SIGINT is ignored (a background job of a script).
signal.signal(signal.SIGINT, signal.default_int_handler)
hold = watchdog(run=[["touch", sys.argv[1]]], remove=sys.argv[2:])
print("watched", flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("kill", ["SIGKILL", "SIGKILL-group", "SIGTERM", "SIGINT-group"])
@pytest.mark.parametrize("dirs", [1, 3])
def test_a_watchdog_cleans_up_after_a_killed_run(tmp_path, kill, dirs):
    """What no signal reaches (daemons, a dead mount) is cleaned up by the watchdog once its run is gone, also when
    the run's whole process group is killed."""
    done = tmp_path / "down-ran"
    made = [tmp_path / f"made-{i}" for i in range(dirs)]
    for d in made:
        (d / "sub").mkdir(parents=True)
        (d / "sub" / "f").write_text("x")
    p = subprocess.Popen(
        [sys.executable, "-c", WATCHED, str(done), *map(str, made)],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert p.stdout.readline().strip() == "watched"
        assert not done.exists() and all(d.exists() for d in made)
    finally:
        sig = getattr(signal, kill.split("-")[0])
        if kill.endswith("-group"):
            os.killpg(p.pid, sig)
        else:
            p.send_signal(sig)
        p.wait(30)
        p.stdout.close()
    wait_for(lambda: done.exists() and not any(d.exists() for d in made), "the watchdog to clean up", 60)


FAKE = """
import time
from replay.openai.fake_server import FakeServer
s = FakeServer(process=True).__enter__()
print(s._proc.pid, flush=True)
time.sleep(600)
"""


def test_a_fake_server_dies_with_whoever_started_it():
    p = subprocess.Popen([sys.executable, "-c", FAKE], stdout=subprocess.PIPE, text=True)
    try:
        server = int(p.stdout.readline())
        assert alive(server)
    finally:
        p.kill()
        p.wait()
        p.stdout.close()
    wait_for(lambda: not alive(server), "the fake server to end", 30)


def test_a_second_remove_empty_removes_a_parent_emptied_since(tmp_path):
    """MPI ranks share --cache-dir's missing parent: the rank that made it cleans up while another rank's directory
    is still in it, and removes it on its second call, once every rank has cleaned up."""
    mine, theirs = tmp_path / "cache" / "rank-0", tmp_path / "cache" / "rank-1"
    made = made_dirs(str(mine))
    os.makedirs(mine)
    theirs.mkdir()
    remove_empty(made)
    assert not mine.exists() and theirs.parent.exists()
    theirs.rmdir()
    remove_empty(made)
    assert not (tmp_path / "cache").exists()
