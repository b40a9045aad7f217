"""Re-make the README's picture of the report's "Sessions and prefix cache" panel: one run of
scenarios/chat_sessions.yaml against the reference server (its prefix cache on). Needs chromium
(apt-get install chromium); ~80 seconds.

    .venv/bin/python docs/sessions_screenshot.py
"""

from __future__ import annotations

from capacity_screenshot import screenshot_run  # this folder's screenshot helper


def main() -> None:
    screenshot_run("scenarios/chat_sessions.yaml", "sessions.png", "#sessions")


if __name__ == "__main__":
    main()
