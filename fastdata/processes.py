"""Stopping child processes, one way for every pool of them (the conversion workers, the shard assemblers).

The invariant `stop_processes` keeps: when it returns, every process it was given has exited and been joined (its
`exitcode` is set, no zombie is left), and it never waits without a bound on a process that may not end:

1. each process gets until one shared deadline, `grace` seconds from the call, to end by itself (what the caller
   asked of it before the call, such as an end-of-work message; 0: no wait);
2. those still alive are sent SIGTERM, and get `term_grace` seconds more, together;
3. those still alive then (a process that ignores or handles SIGTERM and goes on) are sent SIGKILL, which no process
   can ignore, and joined.

So a call waits at most `grace + term_grace` seconds plus the moment SIGKILL takes; a pool whose work is not wanted
any more (an error, Ctrl-C) calls it with `grace=0`. `exit_description` says how a process that died ended, for the
message that reports it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from multiprocessing.process import BaseProcess

#: seconds a process has to end after SIGTERM before it is sent SIGKILL
TERM_GRACE = 2.0


def stop_processes(processes: Sequence[BaseProcess], grace: float = 0.0, term_grace: float = TERM_GRACE) -> None:
    """Stop the started processes `processes` as the module says: `grace` seconds to end by themselves, then
    SIGTERM, `term_grace` seconds later SIGKILL; every one has exited and been joined when this returns."""
    _join_until(processes, time.monotonic() + grace)
    alive = [process for process in processes if process.is_alive()]
    for process in alive:
        process.terminate()
    _join_until(alive, time.monotonic() + term_grace)
    for process in alive:
        if process.is_alive():
            process.kill()
    for process in alive:
        process.join()


def _join_until(processes: Sequence[BaseProcess], deadline: float) -> None:
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))


def exit_description(process: BaseProcess, wait: float = 1.0) -> str:
    """How `process`, which is ending, ended: "exit code N" or "killed by signal N" (after waiting up to `wait`
    seconds for it to be reaped; "exit code None" if it has not ended by then)."""
    process.join(wait)
    code = process.exitcode
    return f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}"
