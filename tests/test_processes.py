"""`stop_processes` keeps its invariant with real child processes: when it returns, every process has exited and
been joined, whether it ends when asked, dies at SIGTERM, or ignores SIGTERM (then SIGKILL ends it); a process that
ends by itself within the grace is not signalled. No assertion depends on how fast a process ends: the children
say when they are ready, and a call that never returns fails after a generous bound instead of hanging the suite."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from typing import Any

import pytest

from fastdata.processes import exit_description, stop_processes

CONTEXT = multiprocessing.get_context("fork")
#: a bound no healthy call comes near, so that a broken helper fails the test instead of hanging the suite
NEVER = 120.0


def _sleep_forever(ready: Any, ignore_sigterm: bool) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN if ignore_sigterm else signal.SIG_DFL)
    ready.set()
    while True:
        time.sleep(1)


def _exit_when_told(ready: Any, told: Any) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # ends only when told: a signal would show in the exit code
    ready.set()
    told.wait()


def _exit_with(code: int) -> None:
    os._exit(code)


def started(target: Any, *args: Any) -> Any:
    """A started child running `target(ready, *args)`, once it said it is ready (its signal handling set)."""
    ready = CONTEXT.Event()
    process = CONTEXT.Process(target=target, args=(ready, *args), daemon=True)
    process.start()
    assert ready.wait(NEVER), "the child did not start"
    return process


def stop_within_bound(processes: list[Any], **options: Any) -> None:
    """`stop_processes(processes, **options)` on a thread; fails (after killing the children itself) if the call
    has not returned after NEVER seconds."""
    call = threading.Thread(target=stop_processes, args=(processes,), kwargs=options, daemon=True)
    call.start()
    call.join(NEVER)
    if call.is_alive():
        for process in processes:
            if process.is_alive():
                os.kill(process.pid, signal.SIGKILL)
        pytest.fail(f"stop_processes({options}) did not return: it waits on a process that does not end")


def test_a_process_that_ignores_sigterm_is_killed_and_joined():
    stubborn = started(_sleep_forever, True)
    stop_within_bound([stubborn], grace=0.0, term_grace=0.5)
    assert not stubborn.is_alive()
    assert stubborn.exitcode == -signal.SIGKILL  # it did ignore SIGTERM: SIGKILL ended it


def test_a_process_that_takes_sigterm_dies_of_it():
    plain = started(_sleep_forever, False)
    stop_within_bound([plain], grace=0.0, term_grace=NEVER)
    assert plain.exitcode == -signal.SIGTERM


def test_a_process_that_ends_when_asked_is_not_signalled():
    told = CONTEXT.Event()
    polite = started(_exit_when_told, told)
    told.set()  # what a pool does before stopping it gracefully: its end-of-work message
    stop_within_bound([polite], grace=NEVER, term_grace=0.5)
    assert polite.exitcode == 0


def test_every_process_of_a_mixed_pool_has_exited_when_it_returns():
    told = CONTEXT.Event()
    finished = CONTEXT.Process(target=_exit_with, args=(3,), daemon=True)
    finished.start()
    finished.join(NEVER)
    pool = [started(_sleep_forever, True), started(_sleep_forever, False), finished,
            started(_exit_when_told, told), started(_sleep_forever, True)]
    stop_within_bound(pool, grace=0.0, term_grace=0.5)
    assert [process.is_alive() for process in pool] == [False] * len(pool)
    assert all(process.exitcode is not None for process in pool)
    assert pool[0].exitcode == pool[4].exitcode == -signal.SIGKILL
    assert finished.exitcode == 3


def test_exit_description_says_how_a_process_ended():
    finished = CONTEXT.Process(target=_exit_with, args=(3,), daemon=True)
    finished.start()
    assert exit_description(finished, wait=NEVER) == "exit code 3"
    killed = started(_sleep_forever, True)
    os.kill(killed.pid, signal.SIGKILL)
    assert exit_description(killed, wait=NEVER) == "killed by signal 9"
