"""Re-make the README's picture of the report's "Why the tail" panel (docs/why-tail.png): one run of
scenarios/why-tail.yaml (4 simulated replicas, one 150 ms slower to its first token), its report's
first card. Needs chromium (apt-get install chromium); ~25 seconds.

    .venv/bin/python docs/why_tail_screenshot.py
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
    out = Path(tempfile.mkdtemp(prefix="latscope-why-"))
    # exit 1 is expected: the scenario's TTFT SLO fails, by design (the slow replica)
    subprocess.run([sys.executable, "-m", "latscope.cli", "run", "scenarios/why-tail.yaml", "--out", str(out / "run"),
                    "--quiet"], cwd=REPO, check=False)
    screenshot(out / "run" / "report.html", REPO / "docs" / "why-tail.png", selector="#why")
    print(f"run in {out}; screenshot in docs/why-tail.png")


if __name__ == "__main__":
    main()
