"""The live displays both drivers share (replay/outputs/progress.py): on stderr only, drawn on a terminal only."""

import pytest

from replay.outputs.progress import LiveLine, StepBars, stderr_is_terminal


@pytest.fixture
def terminal(monkeypatch):
    monkeypatch.setenv("TTY_COMPATIBLE", "1")
    monkeypatch.setenv("TTY_INTERACTIVE", "1")
    monkeypatch.setenv("COLUMNS", "120")
    assert stderr_is_terminal()


@pytest.fixture
def no_terminal(monkeypatch):
    for var in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"):
        monkeypatch.delenv(var, raising=False)
    assert not stderr_is_terminal()  # pytest captures stderr


def test_a_live_line_is_drawn_on_stderr_on_a_terminal(terminal, capsys):
    with LiveLine() as line:
        assert line.drawn
        line.show("requests 42")
    out, err = capsys.readouterr()
    assert out == "" and "requests 42" in err


def test_a_transient_line_is_erased_at_the_end_and_a_lasting_one_kept(terminal, capsys):
    with LiveLine(transient=True) as line:
        line.show("sent 3/9")
    assert capsys.readouterr().err.endswith("\x1b[2K")  # the cursor back up and the line cleared
    with LiveLine() as line:
        line.show("requests 9")
    assert capsys.readouterr().err.replace("\x1b[?25h", "").rstrip("\n").endswith("requests 9")


def test_off_a_terminal_a_plain_line_now_and_then_or_nothing(no_terminal, capsys):
    with LiveLine(plain_every_s=3600) as line:
        assert not line.drawn
        line.show("first")
        line.show("second")  # within the hour: not printed
    assert capsys.readouterr() == ("", "first\n")
    with LiveLine() as line:
        line.show("never")
    assert capsys.readouterr() == ("", "")


def test_a_line_turned_off_prints_nothing_even_on_a_terminal(terminal, capsys):
    with LiveLine(enabled=False, plain_every_s=0) as line:
        line.show("hidden")
    assert capsys.readouterr() == ("", "")


def test_step_bars_on_a_terminal_and_not_off_one(terminal, capsys, monkeypatch):
    with StepBars() as bars:
        bars.update("precondition", 5, 10)
        bars.update("pre-populate", 1, 4)
    err = capsys.readouterr().err
    assert "precondition" in err and "pre-populate" in err
    monkeypatch.setenv("TTY_COMPATIBLE", "0")
    with StepBars() as bars:
        bars.update("precondition", 5, 10)
    assert capsys.readouterr() == ("", "")
