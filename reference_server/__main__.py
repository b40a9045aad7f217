"""`python -m reference_server serve ...` and `latscope-ref`: the reference server's command line.

The server runs on ONNX and ONNX Runtime, which `pip install latscope` leaves out (they come with
`latscope[server]`). Without them the user gets one line saying what to install, not a traceback: a
scenario that launches the server quotes this line in its launch failure (latscope/run/launch.py).
"""

from __future__ import annotations

import sys

SERVER_MODULES = ("onnx", "onnxruntime")  # what `latscope[server]` installs and the server imports


def main() -> None:
    try:
        from reference_server.cli import main as cli_main
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").partition(".")[0]
        if missing not in SERVER_MODULES:
            raise
        print(f"Error: the reference server needs ONNX and ONNX Runtime ({missing} is not installed): "
              "pip install 'latscope[server]'", file=sys.stderr)
        sys.exit(1)
    cli_main()


if __name__ == "__main__":
    main()
