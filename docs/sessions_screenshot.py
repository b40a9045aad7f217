"""Re-make the README's picture of the report's "Sessions and prefix cache" panel: one run of
scenarios/chat_sessions.yaml against the reference server (its prefix cache on). Needs chromium
(apt-get install chromium); ~80 seconds.

    .venv/bin/python docs/sessions_screenshot.py
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from capacity_screenshot import REPO, chromium_path, screenshot  # this folder's screenshot helper


def main() -> None:
    if chromium_path() is None:
        sys.exit("chromium not found: apt-get install chromium")
    out = Path(tempfile.mkdtemp(prefix="latscope-sessions-"))
    subprocess.run([sys.executable, "-m", "latscope.cli", "run", "scenarios/chat_sessions.yaml", "--out", str(out / "run"),
                    "--quiet", "--workers", "1"], cwd=REPO, check=True)
    screenshot(out / "run" / "report.html", REPO / "docs" / "sessions.png", selector="#sessions")
    print(f"run in {out}; screenshot in docs/sessions.png")


if __name__ == "__main__":
    main()
