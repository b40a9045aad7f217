"""The `latscope` program (the console script, and `python -m latscope`): SIGINT and SIGTERM are
handled from its first line, before the second of imports that `latscope.cli` and a run need
(latscope.interrupt), so that a signal at any moment exits 1 with a sentence, never by the signal
or with a traceback."""

from __future__ import annotations

import signal
import sys

from latscope.interrupt import BEFORE_START, SIGNALS, Interrupted, StopRequest


def main() -> None:
    """Install the signal handling, then hand over to the click commands."""
    StopRequest().install()
    try:
        from latscope.cli import main as commands
    except Interrupted:
        print(f"error: {BEFORE_START}", file=sys.stderr)
        sys.exit(1)
    try:
        commands()
    finally:
        # Everything is written and said. A signal while the interpreter shuts down (after it has
        # put the default handlers back) would otherwise make the exit status the signal's.
        for s in SIGNALS:
            signal.signal(s, signal.SIG_IGN)


if __name__ == "__main__":
    main()
