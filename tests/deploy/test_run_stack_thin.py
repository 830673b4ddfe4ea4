"""deploy/run-stack.sh is only the command-line entry of deploy/run_stack.py: no Python inside it, and its answers
to a wrong command line are what they were when it was all shell (one line on stderr, exit 2, nothing started)."""

from __future__ import annotations

import re
import subprocess

from deploy import RUN_STACK


def run(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(RUN_STACK), *args], capture_output=True, text=True, timeout=60, **kw)


def test_run_stack_is_thin():
    text = RUN_STACK.read_text()
    assert len(text.splitlines()) < 40
    code = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    assert not [line for line in code if "<<" in line], "a heredoc"
    assert not [line for line in code if re.search(r"(^|\s)-c(\s|$)", line)], "python -c"
    assert code[-1] == 'exec "$PY" -m deploy.run_stack "$@"'


def test_help_is_an_unknown_command():
    res = run("--help")
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr == "run-stack.sh: unknown command --help (up, down, status, restart-lmcache)\n"


def test_no_command_is_the_usage_line():
    res = run()
    assert res.returncode == 2 and res.stderr.count("\n") == 1
    assert res.stderr.startswith("run-stack.sh: usage: run-stack.sh up|down|status|restart-lmcache [options]")


def test_bad_flag_is_one_line_and_exit_2(tmp_path):
    for sub, message in [("up", "up: unknown option --bogus"), ("down", "down: unknown option --bogus")]:
        res = run(sub, "--bogus", "--state-dir", str(tmp_path))
        assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
        assert res.stderr.startswith(f"run-stack.sh: {message}"), res.stderr
    assert list(tmp_path.iterdir()) == []


def test_status_and_down_without_a_stack(tmp_path):
    res = run("status", "--state-dir", str(tmp_path))
    assert (res.returncode, res.stdout) == (1, "not running\n")
    res = run("down", "--state-dir", str(tmp_path))
    assert (res.returncode, res.stdout) == (0, f"nothing to stop (no {tmp_path}/pids)\n")


def test_status_reads_the_state_directory(tmp_path):
    (tmp_path / "pids").write_text("vllm0 999999999\n")
    (tmp_path / "endpoints.json").write_text('{"instances": [], "prometheus": null}\n')
    res = run("status", "--state-dir", str(tmp_path))
    assert res.returncode == 0
    assert res.stdout == 'vllm0 999999999 gone\n{"instances": [], "prometheus": null}\n'


def test_the_entry_runs_outside_a_checkout_python(tmp_path):
    """$PYTHON picks the interpreter of the entry (standard library only, so a bare python3 does)."""
    res = run("status", "--state-dir", str(tmp_path), env={"PATH": "/usr/bin:/bin", "PYTHON": "python3"})
    assert (res.returncode, res.stdout) == (1, "not running\n"), res.stderr
