"""The three ways a stop signal is heard (replay/common/cli.py): inside an event loop, raised, or handled; each puts
the previous handlers back. Real signals sent to this process."""

import asyncio
import os
import signal
import threading

import pytest

from replay.common.cli import Interrupted, loop_stop_signals, stop_signals_handled, stop_signals_raise
from replay.mpi import recorded_stop_signals

STOPS = (signal.SIGINT, signal.SIGTERM)


def _handlers() -> dict:
    return {sig: signal.getsignal(sig) for sig in STOPS}


@pytest.mark.parametrize("sig", STOPS)
def test_a_signal_in_the_loop_calls_back_and_the_previous_handlers_come_back(sig):
    before = _handlers()
    heard: list[int] = []

    async def run() -> bool:
        loop = asyncio.get_running_loop()
        done = asyncio.Event()

        def on_signal(signum: int) -> None:
            heard.append(signum)
            done.set()

        with loop_stop_signals(loop, on_signal) as installed:
            os.kill(os.getpid(), sig)
            await asyncio.wait_for(done.wait(), timeout=10)
        return installed

    assert asyncio.run(run()) is True
    assert heard == [sig]
    assert _handlers() == before


def test_off_the_main_thread_nothing_is_installed_and_nothing_changes():
    before = _handlers()
    result: list = []

    def in_thread() -> None:
        async def run() -> bool:
            with loop_stop_signals(asyncio.get_running_loop(), lambda _s: None) as installed:
                result.append(_handlers())
                return installed

        result.append(asyncio.run(run()))

    t = threading.Thread(target=in_thread)
    t.start()
    t.join(timeout=30)
    assert result == [before, False]
    assert _handlers() == before


def test_the_loop_handlers_are_removed_when_the_block_raises():
    before = _handlers()

    async def run() -> None:
        with loop_stop_signals(asyncio.get_running_loop(), lambda _s: None):
            raise ValueError("a bug in the window")

    with pytest.raises(ValueError):
        asyncio.run(run())
    assert _handlers() == before


def test_a_signal_outside_the_loop_raises_interrupted_with_its_signal():
    before = _handlers()
    with pytest.raises(Interrupted) as caught, stop_signals_raise():
        os.kill(os.getpid(), signal.SIGTERM)
    assert caught.value.signum == signal.SIGTERM and caught.value.exit_code == 143
    assert _handlers() == before


def test_recorded_signals_are_kept_and_an_event_loop_inside_puts_the_recording_back():
    before = _handlers()
    heard: list[int] = []
    with recorded_stop_signals() as received:
        recording = _handlers()

        async def run() -> None:
            loop = asyncio.get_running_loop()
            done = asyncio.Event()
            with loop_stop_signals(loop, lambda s: (heard.append(s), done.set())):
                os.kill(os.getpid(), signal.SIGINT)
                await asyncio.wait_for(done.wait(), timeout=10)

        asyncio.run(run())
        assert _handlers() == recording
        os.kill(os.getpid(), signal.SIGTERM)
    assert heard == [signal.SIGINT] and received == [signal.SIGTERM]
    assert _handlers() == before


def test_a_handled_signal_reaches_the_handler_with_its_number():
    got: list[int] = []
    with stop_signals_handled(lambda signum, _frame: got.append(signum)):
        os.kill(os.getpid(), signal.SIGINT)
    assert got == [signal.SIGINT]
