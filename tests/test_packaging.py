"""SLOW (about a minute and a half, most of it pip): the wheel and sdist a user installs, and the lean
install they give (issue 29).

Builds the sdist and, from it, the wheel (`python -m build`: a wheel built from the sdist proves the sdist
complete), checks both with `twine check --strict`, installs the wheel with no extras into a fresh venv
from the package index (pip reaches it here and in CI; without it the module is skipped, saying so) and
runs latscope from there, away from this checkout: `latscope init` against a local HTTP target, `latscope
run`, `latscope report`, and the clear sentences a lean install says when a scenario needs an extra it
lacks. Deselect with `-m "not slow"`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
import time
import urllib.request
import venv
import zipfile
from pathlib import Path

import pytest

from conftest import REPO, free_port

pytestmark = pytest.mark.slow
pytest.importorskip("build", reason="the packaging tests need `build` and `twine`: pip install -e '.[dev]'")
pytest.importorskip("twine", reason="the packaging tests need `build` and `twine`: pip install -e '.[dev]'")

PACKAGES = ("latscope", "reference_server")
EXTRA_ONLY = ("onnx", "onnxruntime", "locust")  # the `server` and `distributed` extras: not in a lean install
SERVER_SENTENCE = "pip install 'latscope[server]'"
DISTRIBUTED_SENTENCE = "pip install 'latscope[distributed]'"
TIMINGS: dict[str, float] = {}  # seconds per step and sizes in KiB, printed at the end (pytest -s)


def run(argv: list[str], cwd: Path, timeout: float = 120, **kwargs) -> subprocess.CompletedProcess:
    """`argv` with an environment that points at no checkout and no other venv."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, **kwargs)


def timed(step: str, argv: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    start = time.monotonic()
    done = run(argv, cwd, timeout)
    TIMINGS[step] = round(time.monotonic() - start, 1)
    return done


@pytest.fixture(scope="module", autouse=True)
def print_timings():
    yield
    print("\ntest_packaging: seconds per step, sizes in KiB:", json.dumps(TIMINGS))


@pytest.fixture(scope="module")
def index(tmp_path_factory) -> None:
    """Skip the module, saying why, when pip cannot reach a package index (the build needs setuptools
    from it, the fresh venv everything)."""
    probe = tmp_path_factory.mktemp("probe")
    done = run([sys.executable, "-m", "pip", "download", "--no-deps", "--dest", str(probe), "click"], probe, 90)
    if done.returncode != 0:
        pytest.skip(f"pip cannot reach the package index (needed to build and to install the wheel): "
                    f"{' '.join((done.stderr or done.stdout).strip().splitlines()[-1:])}")


@pytest.fixture(scope="module")
def dists(index, tmp_path_factory) -> dict[str, Path]:
    """The sdist and the wheel built from it, as a user's `python -m build` makes them."""
    out = tmp_path_factory.mktemp("dist")
    done = timed("build sdist+wheel", [sys.executable, "-m", "build", "--outdir", str(out), str(REPO)], out, 240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (sdist,), (wheel,) = sorted(out.glob("*.tar.gz")), sorted(out.glob("*.whl"))
    TIMINGS["wheel KiB"], TIMINGS["sdist KiB"] = wheel.stat().st_size // 1024, sdist.stat().st_size // 1024
    return {"sdist": sdist, "wheel": wheel}


@pytest.fixture(scope="module")
def lean(dists, tmp_path_factory) -> Path:
    """A fresh venv with the wheel installed, no extras; its bin/ directory. This venv's pip installs
    into it (`pip --python`): the same install, without seconds of ensurepip; no .pyc: seconds more."""
    home = tmp_path_factory.mktemp("lean")
    venv.create(home / "venv", with_pip=False)
    bin_dir = home / "venv" / "bin"
    done = timed("pip install wheel", [sys.executable, "-m", "pip", "--python", str(bin_dir / "python"), "install",
                                        "--no-compile", str(dists["wheel"])], home, 280)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return bin_dir


def files_of_packages() -> set[str]:
    """Every file of the packages in this checkout, as a path in the wheel (no caches)."""
    return {path.relative_to(REPO).as_posix() for package in PACKAGES for path in (REPO / package).rglob("*")
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"}


def test_the_sdist_and_the_wheel_pass_twine_check(dists):
    done = run([sys.executable, "-m", "twine", "check", "--strict", str(dists["sdist"]), str(dists["wheel"])], REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("PASSED") == 2


def test_the_wheel_holds_the_packages_with_their_data_and_nothing_else(dists):
    with zipfile.ZipFile(dists["wheel"]) as whl:
        names = set(whl.namelist())
        metadata = whl.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        entry_points = whl.read(next(n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()
    packaged = {n for n in names if not n.split("/")[0].endswith(".dist-info")}
    # every file the packages have here: the presets (data) and `latscope init`'s starters among them
    assert packaged == files_of_packages()
    assert {n for n in packaged if n.startswith("latscope/presets/") and n.endswith(".yaml")}
    assert "latscope/init/starters.py" in packaged
    assert {n.split("/")[0] for n in names} == {"latscope", "reference_server", "latscope-0.1.0.dist-info"}
    assert "latscope-0.1.0.dist-info/licenses/LICENSE" in names
    assert "latscope = latscope.__main__:main" in entry_points
    assert "latscope-ref = reference_server.__main__:main" in entry_points
    # ONNX, ONNX Runtime and Locust only with an extra; `dev` (README's first command) brings the server
    requires = re.findall(r"^Requires-Dist: (.+)$", metadata, re.M)
    for req in requires:
        if re.match(r"(onnx|onnxruntime|locust)\b", req):
            assert "extra ==" in req, req
    assert set(re.findall(r"^Provides-Extra: (\S+)$", metadata, re.M)) >= {"server", "distributed", "all", "dev", "docs"}
    dev_pulls = next(r for r in requires if r.startswith("latscope[") and 'extra == "dev"' in r)
    assert "server" in dev_pulls and "distributed" in dev_pulls


def test_the_sdist_holds_the_license_readme_and_package_data_but_not_the_tests(dists):
    with tarfile.open(dists["sdist"]) as sdist:
        names = {n.partition("/")[2] for n in sdist.getnames()}
    assert {"LICENSE", "README.md", "pyproject.toml", "MANIFEST.in"} <= names
    assert files_of_packages() <= names  # (and the wheel above was built from it)
    assert not {n for n in names if n.startswith("tests/") or n.endswith(".pyc")}


def test_a_lean_install_has_neither_the_server_nor_the_distributed_extra(lean, tmp_path):
    probe = ("import importlib.util, json, latscope; print(json.dumps({'file': latscope.__file__, "
             f"'found': [m for m in {EXTRA_ONLY!r} if importlib.util.find_spec(m)]}}))")
    done = run([str(lean / "python"), "-c", probe], tmp_path)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["found"] == []
    assert Path(seen["file"]).is_relative_to(lean.parent)  # the wheel's latscope, not this checkout's


def wait_ready(url: str, proc: subprocess.Popen, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read()
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"{url} not ready in {timeout_s} s")


def test_a_lean_install_runs_a_scenario_against_a_local_http_target_and_reports_it(lean, tmp_path):
    port = free_port()
    target = subprocess.Popen([str(lean / "python"), "-m", "latscope.targets.echo", "--port", str(port)],
                              cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_ready(f"http://127.0.0.1:{port}/health", target)
        url = f"http://127.0.0.1:{port}"
        done = timed("latscope init", [str(lean / "latscope"), "init", url], tmp_path)
        assert done.returncode == 0 and "wrote latscope.yaml: http to" in done.stdout, done.stdout + done.stderr
        # a use-case preset: read from the installed package (latscope/presets/), pointed at the URL
        done = run([str(lean / "latscope"), "init", url, "--use-case", "fraud_scoring", "-o", "preset.yaml"], tmp_path)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "\nname: fraud_scoring\n" in (tmp_path / "preset.yaml").read_text()
        out = tmp_path / "results"
        done = timed("latscope run (2 s)", [str(lean / "latscope"), "run", "latscope.yaml", "--quiet", "--workers", "1",
                                            "--out", str(out), "--set", "phases.0.duration=0.5s",
                                            "--set", "phases.1.duration=1.5s", "--set", "phases.1.arrival.rate=20",
                                            "--set", "output.report=false"], tmp_path)
        assert done.returncode == 0, done.stdout + done.stderr
    finally:
        target.terminate()
        target.wait(10)
    requests = json.loads((out / "summary.json").read_text())["requests"]
    assert requests["completed"] > 0 and requests["errors"] == 0, requests
    assert not (out / "report.html").exists()
    done = timed("latscope report", [str(lean / "latscope"), "report", str(out)], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (out / "report.html").stat().st_size > 1_000_000  # plotly.js embedded: plotly is a core dependency


def test_a_lean_install_says_which_extra_a_scenario_needs(lean, tmp_path):
    """The shipped scenarios launch the reference server: without `latscope[server]` the run fails (exit 1)
    quoting the server's one line; `--distributed` without `latscope[distributed]` says so too."""
    scenario = str(REPO / "scenarios" / "smoke.yaml")
    # a ready_url on a free port: only the launched process's exit can end the wait
    ready = f"target.launch.ready_url=http://127.0.0.1:{free_port()}/v2/health/ready"
    done = timed("latscope run smoke.yaml (fails)", [str(lean / "latscope"), "run", scenario, "--quiet", "--out",
                                                     str(tmp_path / "smoke"), "--set", ready], tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "launched target exited with code 1 before it was ready" in done.stderr
    assert SERVER_SENTENCE in done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    for argv in ([str(lean / "latscope-ref"), "serve"], [str(lean / "python"), "-m", "reference_server", "serve"]):
        done = run(argv, tmp_path, 30)
        assert (done.returncode, done.stdout) == (1, ""), argv
        assert done.stderr.count("\n") == 1 and SERVER_SENTENCE in done.stderr, done.stderr
    done = run([str(lean / "latscope"), "run", scenario, "--distributed", "--quiet"], tmp_path, 60)
    assert done.returncode != 0 and DISTRIBUTED_SENTENCE in done.stderr, done.stdout + done.stderr
