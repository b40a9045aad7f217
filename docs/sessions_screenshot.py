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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "report"))
from browser_cdp import Browser, PLOTS_DONE, chromium_path  # noqa: E402  (the tests' DevTools-protocol driver)



def main() -> None:
    if chromium_path() is None:
        sys.exit("chromium not found: apt-get install chromium")
    out = Path(tempfile.mkdtemp(prefix="latscope-sessions-"))
    subprocess.run([sys.executable, "-m", "latscope.cli", "run", "scenarios/chat_sessions.yaml", "--out", str(out / "run"),
                    "--quiet", "--workers", "1"], cwd=REPO, check=True)
    with Browser(out) as browser:
        page = browser.open((out / "run" / "report.html").as_uri(), wait_for=PLOTS_DONE)
        page.screenshot_of("#sessions", REPO / "docs" / "sessions.png", width=1200, scale=0.8)
    print(f"run in {out}; screenshot in docs/sessions.png")


if __name__ == "__main__":
    main()
