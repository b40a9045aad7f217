"""Deprecated: the example HTTP target now lives in `latscope.targets.echo`.

    python -m latscope.targets.echo --port 8765

This alias keeps `python -m latscope.builtin_target` (shown in an older README) working for one
release; it will then be removed.
"""

from latscope.targets.echo import MAX_BODY_BYTES, main, make_app  # noqa: F401

if __name__ == "__main__":
    main()
