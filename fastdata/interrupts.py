"""Ctrl-C during a command of the command line: wherever it comes, the command ends with KeyboardInterrupt.

Python's own handler raises KeyboardInterrupt wherever the main thread happens to be, and two kinds of place lose
it there:
- an import: the importer may swallow it (torch's C code imports numpy and clears any error that import raises),
  leaving a half-made module behind; the command then fails later with an unrelated traceback, or runs on as if
  no Ctrl-C had come;
- code that Python runs where an exception cannot propagate (a fork hook such as logging's, run each time a
  DataLoader starts a worker; a `__del__`; a weakref callback): Python prints "Exception ignored in ..." and the
  command runs on.
`CtrlC` holds the interrupt in both cases and raises it again a moment later, where it can propagate.
"""

from __future__ import annotations

import signal
import sys
import threading
from types import FrameType
from typing import Any


class CtrlC:
    """For the length of a `with` block in the main thread: Ctrl-C raises KeyboardInterrupt where it can
    propagate. `received` tells whether a Ctrl-C came at all; `held`, whether one came and has not been raised
    since (the block ended first)."""

    #: while an interrupt is held, how often to look whether it can be raised now (seconds)
    LOOK_AGAIN_S = 0.02

    def __init__(self) -> None:
        self.received = False
        self.held = False
        self._saved_handler: Any = None
        self._saved_hook: Any = None
        self._timer: threading.Timer | None = None  # the latest look-again
        self._armed = False  # a look-again is due
        self._closing = False

    def __enter__(self) -> CtrlC:
        if threading.current_thread() is threading.main_thread():  # only there can a signal handler be set
            self._saved_handler = signal.signal(signal.SIGINT, self._on_interrupt)
            self._saved_hook, sys.unraisablehook = sys.unraisablehook, self._on_unraisable
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._closing = True  # from here a Ctrl-C is only noted: the command's outcome is being reported
        if self._timer is not None:
            self._timer.cancel()
            self._timer.join()
        if self._saved_handler is not None:
            signal.signal(signal.SIGINT, self._saved_handler)
            sys.unraisablehook = self._saved_hook

    def _on_interrupt(self, signum: int, frame: FrameType | None) -> None:
        self.received = True
        if self._closing:
            return
        if importing(frame):
            self._hold()
            return
        self.held = False
        raise KeyboardInterrupt

    def _on_unraisable(self, unraisable: Any) -> None:
        """A KeyboardInterrupt raised where it could not propagate is held (and raised again), not printed."""
        if not isinstance(unraisable.exc_value, KeyboardInterrupt):
            self._saved_hook(unraisable)
            return
        self.received = True
        if not self._closing:
            self._hold()

    def _hold(self) -> None:
        self.held = True
        if not self._armed:
            self._armed = True
            self._timer = threading.Timer(self.LOOK_AGAIN_S, self._look_again)
            self._timer.daemon = True
            self._timer.start()

    def _look_again(self) -> None:
        """(in the timer's thread) Interrupt the main thread again, by a real SIGINT (which also wakes a blocking
        call): its handler raises the interrupt, or holds it once more. The look-again is the standard library's
        one-shot delayed call (`threading.Timer`), not a `fastdata.background` thread: it has no loop to stop and
        nothing to hand over, and the block's end cancels and joins it."""
        self._armed = False
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)  # type: ignore[arg-type]  # it runs: ident set


def importing(frame: FrameType | None) -> bool:
    """Whether `frame` (where the main thread was interrupted) runs inside an import."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False
