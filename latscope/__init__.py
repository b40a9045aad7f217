"""latscope: open-loop load testing and latency observability for inference endpoints.

The Python API (latscope/api.py, docs/python-api.md) is re-exported here, loaded on first use of
one of its names: `import latscope` itself loads nothing else, because the program installs its
signal handlers before any heavy import (latscope.__main__) and a Locust process imports the
package beside gevent (latscope.distributed.locustfile)."""

__version__ = "0.1.0"

_API = ("Capacity", "Results", "find_capacity", "load_scenario", "open_results", "run_scenario")
__all__ = ["__version__", *_API]


def __getattr__(name: str) -> object:
    if name in _API:
        import importlib  # by name: the package's own import runs nothing (tests/test_layers.py)

        return getattr(importlib.import_module("latscope.api"), name)
    raise AttributeError(f"module 'latscope' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_API})
