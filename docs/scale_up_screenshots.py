"""Re-make the README's scale-up screenshots: the docs' two runs of scenarios/scale_up.yaml (the
new replica without and with pre-warming), their comparison, and pictures of its cold-start panel
and of the cold run's latency over time. Needs chromium (apt-get install chromium); ~2 minutes.

    .venv/bin/python docs/scale_up_screenshots.py
"""

from __future__ import annotations

import os
import secrets
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
    out = Path(tempfile.mkdtemp(prefix="latscope-scale-up-"))
    env = {**os.environ, "LATSCOPE_REF_ADMIN_TOKEN": secrets.token_hex(16)}
    latscope = [sys.executable, "-m", "latscope.cli"]
    for name, prewarm in (("scale-cold", "--no-prewarm"), ("scale-warm", "--prewarm")):
        subprocess.run([*latscope, "run", "scenarios/scale_up.yaml", "--out", str(out / name), "--quiet"],
                       cwd=REPO, env={**env, "PREWARM": prewarm}, check=True)
    compare = out / "compare.html"
    subprocess.run([*latscope, "compare", str(out / "scale-cold"), str(out / "scale-warm"), "-o", str(compare)],
                   cwd=REPO, check=True)
    with Browser(out) as browser:
        page = browser.open(compare.as_uri(), wait_for=PLOTS_DONE)
        page.screenshot_of("#coldstart", REPO / "docs" / "scale_up_coldstart.png", width=1200, scale=0.8)
        page = browser.open((out / "scale-cold" / "report.html").as_uri(), wait_for=PLOTS_DONE)
        page.screenshot_of("#latency-time", REPO / "docs" / "scale_up_latency.png", width=1200, scale=0.8)
    print(f"runs and comparison in {out}; screenshots in docs/")


if __name__ == "__main__":
    main()
