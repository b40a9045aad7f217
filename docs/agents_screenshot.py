"""Re-make the docs' picture of the report's "Agents" panel: one run of scenarios/agents.yaml against the
reference server (tool calls, its prefix cache on). Needs chromium (apt-get install chromium); ~80 seconds.

    .venv/bin/python docs/agents_screenshot.py
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
    out = Path(tempfile.mkdtemp(prefix="latscope-agents-"))
    subprocess.run([sys.executable, "-m", "latscope.cli", "run", "scenarios/agents.yaml", "--out", str(out / "run"),
                    "--quiet", "--workers", "1"], cwd=REPO, check=True)
    screenshot(out / "run" / "report.html", REPO / "docs" / "agents.png", selector="#agents")
    print(f"run in {out}; screenshot in docs/agents.png")


if __name__ == "__main__":
    main()
