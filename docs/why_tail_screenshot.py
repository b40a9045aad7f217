"""Re-make the README's picture of the report's "Why the tail" panel (docs/why-tail.png): one run of
scenarios/why-tail.yaml (4 simulated replicas, one 150 ms slower to its first token), its report's
first card. Needs chromium (apt-get install chromium); ~25 seconds.

    .venv/bin/python docs/why_tail_screenshot.py
"""

from __future__ import annotations

from capacity_screenshot import screenshot_run  # this folder's screenshot helper


def main() -> None:
    screenshot_run("scenarios/why-tail.yaml", "why-tail.png", "#why", workers=None,
                   check=False)  # exit 1 is expected: the scenario's TTFT SLO fails, by design (the slow replica)


if __name__ == "__main__":
    main()
