"""`latscope run --distributed`: the Locust master it becomes, and what its coordinator is told."""

from __future__ import annotations

import shlex

import pytest
from click.testing import CliRunner

from conftest import REPO
from latscope import cli
from latscope.distributed import launch


class Became(Exception):
    """Raised in place of os.execv, with the argv the process would have become."""


def became(monkeypatch, *args: str) -> list[str]:
    def exec_locust(argv: list[str]) -> None:
        raise Became(argv)

    monkeypatch.setattr(launch, "exec_locust", exec_locust)
    result = CliRunner().invoke(cli.main, ["run", str(REPO / "scenarios" / "smoke.yaml"), "--distributed", *args])
    assert isinstance(result.exception, Became), result.output
    return result.exception.args[0]


def test_the_master_is_locust_with_latscopes_locustfile_and_the_coordinator_gets_the_run_options(monkeypatch):
    argv = became(monkeypatch, "--expect-workers", "3", "--bind", "0.0.0.0:0", "--quiet", "--gate", "--metrics-port", "0",
                  "--junit", "j.xml", "--set", "seed=5", "--on-node-loss", "continue")
    assert argv[1:5] == ["-m", "locust", "-f", str(launch.locustfile_path())]
    flags = dict(zip(argv[5:], argv[6:]))
    assert flags["--expect-workers"] == "3" and flags["--master-bind-host"] == "0.0.0.0"
    assert flags["--master-bind-port"] == "0" and flags["--latscope-set"] == "seed=5"
    assert flags["--latscope-on-node-loss"] == "continue"
    run_args = next(a for a in argv if a.startswith("--latscope-run-args=")).split("=", 1)[1]
    # a flag, a value of 0 (falsy, still given) and a path reach the coordinator as they were given
    assert shlex.split(run_args) == ["--quiet", "--gate", "--metrics-port", "0", "--metrics-host", "127.0.0.1",
                                     "--junit", "j.xml"]


def test_distributed_refuses_local_workers_and_a_bad_bind(monkeypatch):
    for args, message in ((["--workers", "2"], "--workers is for a run on this machine"),
                          (["--bind", "nope"], "give HOST:PORT")):
        monkeypatch.setattr(launch, "exec_locust", lambda argv: pytest.fail("became Locust"))
        result = CliRunner().invoke(cli.main, ["run", str(REPO / "scenarios" / "smoke.yaml"), "--distributed", *args])
        assert result.exit_code == 2 and message in result.output
