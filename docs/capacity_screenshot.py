"""Screenshot a latscope HTML page (capacity.html, report.html, compare.html) in headless Chromium,
for the README: the top of the page, or one section of it.

    .venv/bin/python docs/capacity_screenshot.py results/mm1-capacity-1   # a capacity directory -> docs/capacity.png
    .venv/bin/python docs/capacity_screenshot.py page.html out.png 1200 1400  # any page, its top 1400 px

For the README's picture, use a real search, e.g. against the M/M/1 target whose capacity theory
knows (`python -m latscope.targets.queue --port 0 --service-ms 4`, then `latscope capacity` on a
scenario pointing at it); the tests' sample (tests/report/capacity_sample.py) is full of hostile
strings on purpose.

From Python: `screenshot(html_path, png_path, width, height)`, and `screenshot_run(scenario, png, selector)`,
which runs a scenario and pictures one panel of its report (the other docs/*_screenshot.py). Needs chromium (apt-get install
chromium); it drives it with the tests' DevTools-protocol client (tests/report/browser_cdp.py).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "report"))
from browser_cdp import Browser, PLOTS_DONE, chromium_path  # noqa: E402  (the tests' DevTools-protocol driver)



def screenshot(html_path: str | Path, png_path: str | Path, width: int = 1200, height: int | None = 1400,
               selector: str | None = None, scale: float = 0.8) -> Path:
    """`html_path` laid out `width` CSS pixels wide, once its plots are drawn, as a PNG at `png_path`:
    the top `height` pixels (None: the whole page), or only the element matching CSS `selector`."""
    if chromium_path() is None:
        raise RuntimeError("chromium not found: apt-get install chromium")
    png = Path(png_path)
    png.parent.mkdir(parents=True, exist_ok=True)
    # chromium's helper processes may still write its profile for a moment after the browser exits
    with tempfile.TemporaryDirectory(prefix="latscope-shot-", ignore_cleanup_errors=True) as tmp, \
            Browser(Path(tmp), width=width) as browser:
        page = browser.open(Path(html_path).resolve().as_uri(), wait_for=PLOTS_DONE)
        if page.errors:
            raise RuntimeError(f"{html_path}: JavaScript errors: {page.errors}")
        if selector:
            return page.screenshot_of(selector, png, width=width, scale=scale)
        return page.screenshot(png, width=width, max_height=height, scale=scale)


def screenshot_run(scenario: str, png: str, selector: str, workers: int | None = 1, check: bool = True) -> None:
    """`latscope run SCENARIO` (a path from the repository; `workers`: its --workers, None: the default;
    `check`: a failed run stops here), then its report's `selector` as docs/`png`."""
    if chromium_path() is None:
        sys.exit("chromium not found: apt-get install chromium")
    out = Path(tempfile.mkdtemp(prefix="latscope-shot-run-"))
    subprocess.run([sys.executable, "-m", "latscope.cli", "run", scenario, "--out", str(out / "run"), "--quiet",
                    *(["--workers", str(workers)] if workers else [])], cwd=REPO, check=check)
    screenshot(out / "run" / "report.html", REPO / "docs" / png, selector=selector)
    print(f"run in {out}; screenshot in docs/{png}")


def main(argv: list[str]) -> None:
    """CAPACITY_DIR|PAGE.html [PNG] [WIDTH] [HEIGHT]: a capacity directory's page is (re)written first."""
    from latscope.report import write_capacity_page

    if not argv:
        sys.exit(__doc__)
    source = Path(argv[0])
    html = write_capacity_page(source) if source.is_dir() else source
    png = Path(argv[1]) if len(argv) > 1 else REPO / "docs" / "capacity.png"
    width = int(argv[2]) if len(argv) > 2 else 1200
    height = int(argv[3]) if len(argv) > 3 else 1400
    print(screenshot(html, png, width, height))


if __name__ == "__main__":
    main(sys.argv[1:])
