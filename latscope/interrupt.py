"""Ctrl-C and SIGTERM, from the program's first line to its last, so that no moment of a run is
unguarded: a signal at any moment exits 1, with a sentence or a complete results directory.

Two regimes, switched once by the run when it is about to create its results directory:

- before (nothing written yet): the first signal raises `Interrupted` at once, wherever the program
  is (importing, loading the scenario, building the plan): the CLI says "nothing was written" and
  exits 1. Raising is what makes a long plan build stoppable.
- after `commit()` (a results directory exists or is about to): a signal only records the request;
  the run loop polls `reason` and stops in order, so the directory is always complete. A second
  signal sets `hurry`: the run skips what it may (waiting for workers, the HTML report) and exits.

Only the standard library here: `latscope.__main__` installs this before anything heavy is imported.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Iterator

SIGNALS = (signal.SIGINT, signal.SIGTERM)
BEFORE_START = "stopped before the run started; nothing was written"


class Interrupted(KeyboardInterrupt):
    """A signal before the run committed to a results directory. A KeyboardInterrupt, so that code
    catching `Exception` lets it through and click turns it into exit 1 for commands other than run."""


class StopRequest:
    """The handler of SIGINT and SIGTERM (see the module docstring for its two regimes)."""

    def __init__(self) -> None:
        self.reason: str | None = None  # "interrupted by SIGINT", once a signal came
        self.count = 0
        self.committed = False

    @property
    def hurry(self) -> bool:
        """A second signal came: finish the results directory and exit, skipping the optional."""
        return self.count > 1

    def commit(self) -> None:
        """From now on a signal is a request the run loop checks, never an exception."""
        self.committed = True

    def __call__(self, signum: int, frame: object) -> None:
        self.count += 1
        if self.reason is None:
            self.reason = f"interrupted by {signal.Signals(signum).name}"
            if not self.committed:
                raise Interrupted(self.reason)
        # a later signal before commit() is dropped: the program is already unwinding to its exit

    def install(self) -> StopRequest:
        """Make this the handler of SIGINT and SIGTERM (main thread only; elsewhere a no-op)."""
        if threading.current_thread() is threading.main_thread():
            for s in SIGNALS:
                signal.signal(s, self)
        return self

    @contextmanager
    def handling(self) -> Iterator[StopRequest]:
        """This handler for the block; the previous ones restored after it."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = {s: signal.getsignal(s) for s in SIGNALS}
        self.install()
        try:
            yield self
        finally:
            for s, h in previous.items():
                signal.signal(s, h if h is not None else signal.SIG_DFL)


@contextmanager
def guarded() -> Iterator[StopRequest]:
    """The StopRequest handling SIGINT now (the one `latscope.__main__` installed at start-up), or,
    when there is none (`python -m latscope.cli`, a test's CliRunner), a new one for the block."""
    current = signal.getsignal(signal.SIGINT) if threading.current_thread() is threading.main_thread() else None
    if isinstance(current, StopRequest):
        yield current
    else:
        with StopRequest().handling() as stop:
            yield stop


@contextmanager
def blocked() -> Iterator[None]:
    """SIGINT and SIGTERM held back (not lost) in this thread for the block. A process started inside
    inherits the mask: a worker starts deaf to the Ctrl-C meant for the whole process group until
    it has set its own handlers (engine.worker_main), instead of printing a KeyboardInterrupt
    traceback from the middle of its imports (multiprocessing starts its resource tracker so, bpo-33613)."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
