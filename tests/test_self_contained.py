"""The repository stands alone: a user's clone has nothing beside it, so no scenario, test, doc,
benchmark or example may reach a file outside it (issue 29: two shipped scenarios and seven tests
read their traces from a folder beside the clone, which only the developers have).

Three ways a file can leave the repository, each checked over every tracked text file:
- a relative path with `..` (`../../x/y.csv`) that climbs above the repository root from the folder
  of the file that names it (where a scenario's paths, and a Markdown link, resolve);
- Python that walks up from its own location past the root (`Path(__file__).parents[3]`,
  `.parent.parent…`, `REPO.parent`);
- the developers' material by name (its folder `DEVELOPERS`, with data/, reference/, DESIGN.md).
And every file a scenario reads (traces, datasets, length samples, tensors) resolves inside the
repository and exists.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from pydantic import BaseModel

from conftest import REPO
from latscope.scenario import load_scenario

# Text we read; data/ holds the traces themselves (numbers, no references).
TEXT_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".txt", ".sh", ".cfg", ".ini", ".json", ".proto", ""}
SKIP_PREFIXES = ("data/", "tests/data/")

# A relative path that climbs: one or more "../" then the rest of the path.
CLIMB = re.compile(r"(?<![\w./-])((?:\.\./)+)([\w./-]*)")
# Python walking up from its own file: Path(__file__)[.resolve()].parents[k] or .parent × k, then
# any more .parent; or a root constant's parent.
UP = re.compile(r"Path\(__file__\)(?:\.resolve\(\))?(\.parents\[(\d+)\]|(?:\.parent)+)((?:\.parent)*)")
ROOT_PARENT = re.compile(r"\b(REPO|ROOT|REPO_ROOT)\.parent\b")
DEVELOPERS = "shared"  # the folder beside the developers' clone; spelled once, so this file names no path into it
DEVELOPERS_ONLY = re.compile(DEVELOPERS + r"/(data|reference|DESIGN\.md|hooks)\b")


def tracked_text_files() -> list[Path]:
    names = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout.decode()
    files = [REPO / n for n in names.split("\0") if n]
    files += [REPO / n for n in subprocess.run(["git", "ls-files", "-z", "--others", "--exclude-standard"], cwd=REPO,
                                                capture_output=True, check=True).stdout.decode().split("\0") if n]
    return sorted({f for f in files if f.suffix in TEXT_SUFFIXES and f.is_file() and not f.is_symlink()
                   and not str(f.relative_to(REPO)).startswith(SKIP_PREFIXES)})


def inside(path: Path) -> bool:
    return path.resolve().is_relative_to(REPO.resolve())


def leaving_references(path: Path) -> list[str]:
    """`file:line: reference` for each way `path`'s text reaches outside the repository."""
    found = []
    depth = len(path.relative_to(REPO).parts) - 1  # folders between the root and this file
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        where = f"{path.relative_to(REPO)}:{number}"
        for climb, rest in CLIMB.findall(line):
            if not inside(path.parent / (climb + rest)):
                found.append(f"{where}: {climb + rest}")
        if path.suffix == ".py":
            for up, k, more in UP.findall(line):
                levels = (int(k) + 1 if k else up.count(".parent")) + more.count(".parent")
                if levels > depth + 1:  # parents[depth] is the root; one more is outside
                    found.append(f"{where}: {up + more} climbs {levels} folders from a file {depth} below the root")
            found += [f"{where}: {m.group(0)}" for m in ROOT_PARENT.finditer(line)]
        found += [f"{where}: {m.group(0)}" for m in DEVELOPERS_ONLY.finditer(line)]
    return found


def test_no_file_reference_leaves_the_repository():
    files = tracked_text_files()
    assert len(files) > 200 and REPO / "scenarios" / "trace_replay.yaml" in files
    leaving = [ref for f in files if f != Path(__file__) for ref in leaving_references(f)]  # (this one spells the patterns out)
    assert leaving == [], "references outside the repository:\n" + "\n".join(leaving)


def test_the_checks_catch_each_way_out(tmp_path):
    """Each pattern above, planted in a file in the repository's tree, is found (and the harmless
    neighbours are not): the check cannot pass by matching nothing."""
    probe = REPO / "tests" / f"_probe_{tmp_path.name}.py"
    probe.write_text("\n".join([
        'TRACE = "../../elsewhere/x.csv"',                        # tests/ -> ../../ leaves
        'LOCAL = "../data/azure_llm_conv_trace.csv"',            # tests/ -> ../data stays
        'A = Path(__file__).resolve().parents[2] / "x"',         # tests/x.py: parents[1] is the root
        'B = Path(__file__).resolve().parents[1] / "data"',
        'C = Path(__file__).parent.parent.parent',
        'D = REPO.parent / "elsewhere"',
        f'E = "see {DEVELOPERS}/DESIGN.md"',
    ]))
    try:
        found = [ref.split(": ", 1)[1] for ref in leaving_references(probe)]
    finally:
        probe.unlink()
    assert found == ["../../elsewhere/x.csv", ".parents[2] climbs 3 folders from a file 1 below the root",
                     ".parent.parent.parent climbs 3 folders from a file 1 below the root", "REPO.parent",
                     f"{DEVELOPERS}/DESIGN.md"]


def scenario_files() -> list[Path]:
    """Every scenario shipped or used by the tests and examples (the hostile corpus is bad on purpose)."""
    found = []
    for f in tracked_text_files():
        rel = f.relative_to(REPO).as_posix()
        if f.suffix in (".yaml", ".yml") and "phases:" in f.read_text() and "tests/scenario/corpus/" not in rel:
            found.append(f)
    return found


def files_read(model: object) -> list[str]:
    """The paths a scenario names for latscope to read (traces, datasets, length samples, tensors)."""
    if isinstance(model, BaseModel):
        return [v for name in type(model).model_fields for v in (
            [getattr(model, name)] if name in ("file", "npy") and isinstance(getattr(model, name), str)
            else files_read(getattr(model, name)))]
    if isinstance(model, (list, tuple)):
        return [v for item in model for v in files_read(item)]
    if isinstance(model, dict):
        return [v for item in model.values() for v in files_read(item)]
    return []


@pytest.mark.parametrize("path", scenario_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_file_a_scenario_reads_is_inside_the_repository(path, monkeypatch):
    monkeypatch.setenv("LATSCOPE_REF_ADMIN_TOKEN", "t0ken")  # scale_up.yaml's admin action needs one
    scenario = load_scenario(path)
    for written in files_read(scenario):
        resolved = scenario.resolve_path(written)
        assert inside(resolved) and resolved.is_file(), f"{path.relative_to(REPO)}: {written} -> {resolved}"


def test_the_traces_scenarios_replay_are_found():
    """The two shipped trace replays read the repository's data/ (and the walk above sees them)."""
    reads = {p.name: files_read(load_scenario(p)) for p in (REPO / "scenarios" / "trace_replay.yaml",
                                                            REPO / "scenarios" / "mooncake_replay.yaml")}
    assert reads == {"trace_replay.yaml": ["../data/azure_llm_conv_trace.csv"],
                     "mooncake_replay.yaml": ["../data/mooncake_conversation_trace.jsonl"]}
