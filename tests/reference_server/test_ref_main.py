"""`python -m reference_server` without `latscope[server]`: one line saying what to install, exit 1, no
traceback (reference_server/__main__.py). The import of ONNX or ONNX Runtime is made to fail in a real
subprocess; tests/test_packaging.py checks the same in a fresh venv that really lacks them."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import REPO

# Runs the module as `python -m reference_server` does, with `import NAME` failing as when it is not installed.
BLOCKED = """
import runpy, sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == {name!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
sys.meta_path.insert(0, Block())
sys.argv = ["reference_server", "serve", "--http-port", "0", "--grpc-port", "-1"]
runpy.run_module("reference_server", run_name="__main__", alter_sys=True)
"""


@pytest.mark.parametrize("name", ["onnx", "onnxruntime"])
def test_without_onnx_or_onnxruntime_the_server_says_to_install_the_server_extra(name):
    done = subprocess.run([sys.executable, "-c", BLOCKED.format(name=name)], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr.endswith("pip install 'latscope[server]'\n") and done.stderr.count("\n") == 1, done.stderr
    assert f"({name} is not installed)" in done.stderr


def test_another_missing_module_is_not_blamed_on_the_server_extra():
    """Only ONNX and ONNX Runtime are what `latscope[server]` adds: a missing core dependency keeps its traceback."""
    done = subprocess.run([sys.executable, "-c", BLOCKED.format(name="click")], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 1
    assert "latscope[server]" not in done.stderr and "No module named 'click'" in done.stderr
