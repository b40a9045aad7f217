"""A damaged results directory is bad input: `latscope report`, `compare` and `gate` say which file
is wrong and how, in one line, and exit 2, never a traceback (issue 30). One real run (a short one
against a loopback target) is damaged a file at a time, in a copy per case; the real command line
reads it, in-process for most cases and as a real process for one case of each command."""

from __future__ import annotations

import base64
import json
import random
import shutil
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Callable

import pytest
from click.testing import CliRunner
from hdrh.codec import V2_COMPRESSION_COOKIE_BASE

from conftest import REPO, scenario_dict, serve
from latscope.api import run_scenario
from latscope.cli import main
from latscope.errors import ResultsError
from latscope.results import read_events
from latscope.results.hlog import _OUTER, read_sparse
from latscope.targets.echo import make_app

GATE_FILE = ("slos:\n  - {metric: latency, class: all, stat: p99, limit_ms: 1000}\n"
             "regression:\n  checks:\n    - {metric: latency, class: all, stat: p50}\n")


@pytest.fixture(scope="module")
def fresh_run(tmp_path_factory) -> Path:
    """A real run (1 s at 40 req/s against a loopback target, one worker), written by today's code."""
    folder = tmp_path_factory.mktemp("fresh")
    with serve(make_app(delay_ms=1)) as url:
        scenario = scenario_dict(url, folder, [{"name": "steady", "duration": "1s", "arrival": {"type": "constant", "rate": 40}}],
                                 slos=[{"metric": "latency", "class": "all", "stat": "p99", "limit_ms": 1000}])
        result = run_scenario(scenario, out=folder / "run", workers=1)
    assert not result.partial and result.summary["requests"]["completed"] == 40
    return result.path


def _summary(edit: Callable[[dict], object]) -> Callable[[Path], None]:
    def damage(run: Path) -> None:
        data = json.loads((run / "summary.json").read_text())
        edit(data)
        (run / "summary.json").write_text(json.dumps(data))  # NaN as NaN: json.dumps allows it
    return damage


def _garbage(size: int, seed: int) -> bytes:
    """Seeded random bytes, in lines (a newline every 100 bytes: not one torn line)."""
    raw = random.Random(seed).randbytes(size)
    return b"\n".join(raw[i:i + 100] for i in range(0, size, 100)) + b"\n"


def _first_latency_line(run: Path) -> int:
    lines = (run / "histograms.hlog").read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if line.startswith("Tag=latency/"))


def _random_payload(run: Path) -> None:
    """The first latency interval's histogram replaced by base64 of random bytes."""
    path = run / "histograms.hlog"
    lines = path.read_text().splitlines()
    at = _first_latency_line(run) - 1
    tag, start, length, peak, _ = lines[at].split(",", 4)
    lines[at] = ",".join((tag, start, length, peak, base64.b64encode(random.Random(7).randbytes(300)).decode()))
    path.write_text("\n".join(lines) + "\n")


def _text(name: str, text: str) -> Callable[[Path], None]:
    return lambda run: (run / name).write_text(text)


ALL = ("report", "compare", "gate")
# (case, damage, the file named, what the line says (a function of the damaged directory), commands)
CASES = [
    ("requests_is_a_string", _summary(lambda s: s.update(requests="lots")), "summary.json",
     lambda run: 'requests is "lots", not a mapping', ALL),
    ("metrics_is_a_list", _summary(lambda s: s.update(metrics=[1, 2])), "summary.json",
     lambda run: "metrics is a list, not a mapping", ALL),
    ("a_percentile_is_text", _summary(lambda s: s["metrics"]["latency"]["all"].update(p99_ms="fast")), "summary.json",
     lambda run: 'metrics.latency.all.p99_ms is "fast", not a number or null', ALL),
    ("a_phase_without_its_start", _summary(lambda s: s["phases"][0].pop("start_s")), "summary.json",
     lambda run: "phases[0]: `start_s` is missing", ALL),
    ("schema_version_is_text", _summary(lambda s: s.update(schema_version="1")), "summary.json",
     lambda run: 'schema_version is "1", not an integer', ALL),
    ("a_nan", _summary(lambda s: s.update(duration_s=float("nan"))), "summary.json",
     lambda run: "NaN is not a JSON number", ALL),
    ("summary_nested_100000_deep", _text("summary.json", "[" * 100_000 + "]" * 100_000), "summary.json",
     lambda run: "nested deeper than JSON can be read", ALL),
    ("events_of_binary_garbage", lambda run: (run / "events.jsonl").write_bytes(_garbage(4000, 3)), "events.jsonl:1",
     lambda run: "not UTF-8 text", ALL),
    ("an_event_that_is_an_array", lambda run: (run / "events.jsonl").write_text('{"event": "run_start"}\n[1, 2]\n{"event": "run_end"}\n'),
     "events.jsonl:2", lambda run: "an array, not a JSON object", ALL),
    ("scenario_not_yaml", _text("scenario.yaml", "name: x\ntarget: [unclosed\n"), "scenario.yaml:3",
     lambda run: "not YAML", ALL),
    ("scenario_a_list", _text("scenario.yaml", "- 1\n- 2\n"), "scenario.yaml",
     lambda run: "not a scenario (a YAML list, not a mapping)", ALL),
    ("scenario_slos_not_slos", _text("scenario.yaml", "name: x\nslos:\n  - {metric: latency, stat: p99}\n"), "scenario.yaml",
     lambda run: "slos.0", ("gate",)),  # only the gate reads the scenario's SLOs
    ("hlog_payload_of_random_bytes", _random_payload, "histograms.hlog",
     lambda run: f"histograms.hlog:{_first_latency_line(run)}: malformed interval line", ALL),
]
# one case of each command as a real process: what a user's shell (and a recursion limit) sees
SUBPROCESS = {("summary_nested_100000_deep", "report"), ("events_of_binary_garbage", "compare"),
              ("hlog_payload_of_random_bytes", "gate")}


def _args(command: str, run: Path, pristine: Path, tmp: Path) -> list[str]:
    if command == "report":
        return ["report", str(run), "--cdn", "-o", str(tmp / "report.html")]
    if command == "compare":
        return ["compare", str(pristine), str(run), "--cdn", "-o", str(tmp / "compare.html")]
    (tmp / "gate.yaml").write_text(GATE_FILE)
    return ["gate", str(run), "--baseline", str(pristine), "--slo", str(tmp / "gate.yaml")]


def test_the_undamaged_run_passes_every_command(fresh_run, tmp_path):
    """The control: what the cases below damage is a directory every command reads (exit 0)."""
    run = Path(shutil.copytree(fresh_run, tmp_path / "run"))
    for command in ("report", "compare"):
        result = CliRunner().invoke(main, _args(command, run, fresh_run, tmp_path))
        assert result.exit_code == 0, (command, result.output, result.exception)
    # the gate reads every file and judges: its verdict (pass, or 4 when a loaded box stamped the short run
    # invalid, or its 40 values leave the p50 ratio too wide) is not what this checks, that it got one is
    result = CliRunner().invoke(main, _args("gate", run, fresh_run, tmp_path))
    assert result.exit_code in (0, 4) and "latency/all p50" in result.output and "latency/all p99" in result.output, (
        result.output, result.stderr, result.exception)


@pytest.mark.parametrize(("case", "damage", "named", "says", "command"),
                         [(case, damage, named, says, command) for case, damage, named, says, commands in CASES
                          for command in commands],
                         ids=[f"{case}-{command}" for case, *_, commands in CASES for command in commands])
def test_a_damaged_file_is_one_line_and_exit_2(fresh_run, tmp_path, case, damage, named, says, command):
    run = Path(shutil.copytree(fresh_run, tmp_path / "run"))
    damage(run)
    args = _args(command, run, fresh_run, tmp_path)
    if (case, command) in SUBPROCESS:
        done = subprocess.run([sys.executable, "-m", "latscope.cli", *args], cwd=REPO, capture_output=True, text=True,
                              timeout=60)
        code, stderr = done.returncode, done.stderr
    else:
        result = CliRunner().invoke(main, args)
        assert isinstance(result.exception, SystemExit), result.exception  # not an exception that got away
        code, stderr = result.exit_code, result.stderr
    assert "Traceback" not in stderr
    assert code == 2, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("error: ") and f"{run}/{named}" in lines[0] and says(run) in lines[0], lines[0]


def test_a_torn_last_event_is_left_out_but_a_bad_complete_line_is_refused(tmp_path):
    """A run killed mid-write tears its last line (no newline at its end): left out. A last line that
    ends in a newline was written whole, so a bad one is damage."""
    events = tmp_path / "events.jsonl"
    events.write_bytes(b'{"event": "run_start", "t_s": 0}\n{"event": "ab\xc3')  # torn inside a UTF-8 character
    assert [e["event"] for e in read_events(tmp_path)] == ["run_start"]
    events.write_bytes(b'{"event": "run_start", "t_s": 0}\n{"event": "ab\n')
    with pytest.raises(ResultsError, match=r"events.jsonl:2: not a JSON event"):
        read_events(tmp_path)
    events.write_text('{"event": "run_start", "t_s": "soon"}\n')
    with pytest.raises(ResultsError, match=r"events.jsonl:1: `t_s` is neither a finite number nor null"):
        read_events(tmp_path)


def test_a_histogram_that_inflates_without_bound_is_refused(tmp_path):
    """A payload that inflates past 64 MiB (a few KB of zlib) is refused at its line, not inflated."""
    deflate, mib = zlib.compressobj(9), bytes(1 << 20)
    bomb = b"".join(deflate.compress(mib) for _ in range(65)) + deflate.flush()  # 65 MiB of zeros in 66 KB
    blob = base64.b64encode(_OUTER.pack(V2_COMPRESSION_COOKIE_BASE, len(bomb)) + bomb).decode()
    path = tmp_path / "histograms.hlog"
    path.write_text("#[StartTime: 1.000 (seconds since epoch)]\n#[BaseTime: 1.000 (seconds since epoch)]\n"
                    f"Tag=latency/all,0.000,1.000,1.000,{blob}\n")
    with pytest.raises(ValueError, match=r"histograms.hlog:3: malformed interval line .*inflates past 64 MiB"):
        list(read_sparse(path, "latency/"))
