"""Re-make the README's picture of a distributed run's generator-health panel: scenarios/smoke.yaml
(it launches the reference server on 127.0.0.1) from a Locust master and two workers on this machine,
the second in a time namespace whose monotonic clock reads 1000 s ahead (unshare, no root needed).
Needs chromium (apt-get install chromium); ~40 seconds.

    .venv/bin/python docs/distributed_screenshot.py
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from capacity_screenshot import REPO, chromium_path, screenshot  # this folder's screenshot helper

LATSCOPE = [sys.executable, "-m", "latscope"]
SHIFTED = ["unshare", "--user", "--map-root-user", "--time", "--fork", "--monotonic", "1000"]


def main() -> None:
    if chromium_path() is None:
        sys.exit("chromium not found: apt-get install chromium")
    out = Path(tempfile.mkdtemp(prefix="latscope-distributed-"))
    log = out / "master.log"
    master = subprocess.Popen([*LATSCOPE, "run", "scenarios/smoke.yaml", "--distributed", "--expect-workers", "2",
                               "--bind", "127.0.0.1:0", "--quiet", "--out", str(out / "run")],
                              cwd=REPO, stdout=open(log, "w"), stderr=subprocess.STDOUT)
    while not (found := re.search(r"listening on 127\.0\.0\.1:(\d+)", log.read_text())):
        if master.poll() is not None:
            sys.exit(log.read_text())
        time.sleep(0.1)
    worker = [*LATSCOPE, "worker", "--master-host", "127.0.0.1", "--master-port", found.group(1), "--engines", "1"]
    workers = [subprocess.Popen(worker, cwd=REPO), subprocess.Popen(SHIFTED + worker, cwd=REPO)]
    master.wait()
    for w in workers:
        w.wait()
    screenshot(out / "run" / "report.html", REPO / "docs" / "distributed.png", selector="#generator")
    print(f"run in {out}; screenshot in docs/distributed.png")


if __name__ == "__main__":
    main()
