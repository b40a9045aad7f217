"""StartupError: the one exception that ends `latscope-ref serve` with a message instead of a traceback.

Its own module, with nothing else in it and importing nothing from the package, because every stage
of a start raises it (the config's model check, the backend choice, the port reservations, the admin
API, the generator's load) and the CLI and each replica's entry point catch it: any module can import
it without importing the others, so raising it never makes an import cycle.
"""

from __future__ import annotations


class StartupError(Exception):
    """The server cannot start as configured; the message names the flag or file to fix."""
