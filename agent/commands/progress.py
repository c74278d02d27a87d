"""Progress for people on stderr: a command that works for more than ``SLOW_S`` says what
it is doing (``after``), and numba's compilation of kernels, the slow first run of a
command, is said when it starts and timed apart from the work (``Compilation``)."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

#: A command still at work after this long prints a line saying what it does.
SLOW_S = 2.0


def say(message: str) -> None:
    """One line on stderr (never on stdout: that is the command's answer)."""
    print(message, file=sys.stderr, flush=True)


@contextmanager
def after(message: str, seconds: float = SLOW_S) -> Iterator[None]:
    """Say ``message`` if the block is still running after ``seconds``."""
    timer = threading.Timer(seconds, say, (message,))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


class Compilation:
    """Times numba's compilation (its ``numba:compile`` events, outermost only: a kernel
    compiled for another counts once) while the block runs, and says ``message`` when
    the first compilation starts. Kernels loaded from numba's cache are not compiled: a
    later run says nothing and counts no time. ``seconds``: the time compiling."""

    def __init__(self, message: str) -> None:
        self.message = message
        self.seconds = 0.0
        self._depth = 0
        self._started = 0.0
        self._said = False

    def on_start(self, event: Any) -> None:
        if self._depth == 0:
            self._started = time.perf_counter()
            if not self._said:
                self._said = True
                say(self.message)
        self._depth += 1

    def on_end(self, event: Any) -> None:
        self._depth -= 1
        if self._depth == 0:
            self.seconds += time.perf_counter() - self._started

    @contextmanager
    def watching(self) -> Iterator[Compilation]:
        """Listen to numba's compile events while the block runs (a no-op without
        numba)."""
        try:
            from numba.core import event
        except ImportError:
            yield self
            return
        outer = self

        class Forward(event.Listener):
            def on_start(self, ev: Any) -> None:
                outer.on_start(ev)

            def on_end(self, ev: Any) -> None:
                outer.on_end(ev)

        with event.install_listener("numba:compile", Forward()):
            yield self
