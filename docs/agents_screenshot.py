"""Re-make the docs' picture of the report's "Agents" panel: one run of scenarios/agents.yaml against the
reference server (tool calls, its prefix cache on). Needs chromium (apt-get install chromium); ~80 seconds.

    .venv/bin/python docs/agents_screenshot.py
"""

from __future__ import annotations

from capacity_screenshot import screenshot_run  # this folder's screenshot helper


def main() -> None:
    screenshot_run("scenarios/agents.yaml", "agents.png", "#agents")


if __name__ == "__main__":
    main()
