"""The docs (README.md, docs/*.md, mkdocs.yml) stay true to the code: the site builds with
`mkdocs build --strict` (a broken link, anchor or include fails), every page is in the nav, every
YAML snippet validates with the loader it is written for, every `latscope` command and flag a page
names exists (and every `--set` it applies to a shipped scenario is accepted), every repository
path a page names exists, and the README stays a front page of under 200 lines.

How YAML snippets are recognised (```yaml blocks):
- a first line `# not a scenario: <why>` skips the block (none needed today);
- a mapping whose keys are all the gate file's (slos, regression, min_capacity_rps) and that has
  `regression` or `min_capacity_rps` is a gate file: `latscope.scenario.gate_file.load_gate_file`;
- a mapping whose keys are all scenario keys is a scenario. With both `target` and `phases` it is
  validated as written; otherwise it is a fragment, laid over a minimal scenario (a target on
  127.0.0.1 and one 60 s constant-rate phase: the fragment's top-level keys replace those), so a
  page can show one section at a time;
- anything else fails, naming the page and line.
A snippet is written to <tmp>/scenarios/ beside a <tmp>/data link to the repository's data/, so
`../data/…` resolves as it would from scenarios/. When every file it names exists, its plan is
built too (trace columns, lengths and blocks read for real)."""

from __future__ import annotations

import copy
import importlib.util
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import click
import pytest
import yaml

from latscope.cli import main
from latscope.errors import ScenarioError
from latscope.plan import build_plan
from latscope.scenario import load_scenario
from latscope.scenario.gate_file import GateFile, load_gate_file
from latscope.scenario.schema import Scenario

from conftest import REPO

DOCS = REPO / "docs"
PAGES = [REPO / "README.md", *sorted(DOCS.glob("*.md"))]
README_MAX_LINES = 200


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence
    info: str
    body: str

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


def code_blocks(page: Path) -> list[Block]:
    """Fenced code blocks, indented ones (inside list items) included, their bodies dedented."""
    blocks, lines = [], page.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)", lines[i])
        if not m:
            i += 1
            continue
        indent, fence, info = len(m.group(1)), m.group(2), m.group(3)
        body, j = [], i + 1
        while j < len(lines) and lines[j].strip() != fence:
            body.append(lines[j][indent:] if lines[j][:indent].strip() == "" else lines[j])
            j += 1
        blocks.append(Block(page, i + 1, info, "\n".join(body) + "\n"))
        i = j + 1
    return blocks


def inline_code(page: Path) -> list[tuple[int, str]]:
    """(line, text) of each `inline code` span outside fenced blocks."""
    spans, in_fence = [], None
    for number, line in enumerate(page.read_text().splitlines(), 1):
        m = re.match(r"^\s*(`{3,}|~{3,})", line)
        if m:
            in_fence = None if in_fence == m.group(1) else (in_fence or m.group(1))
            continue
        if in_fence is None:
            spans += [(number, s) for s in re.findall(r"`([^`\n]+)`", line)]
    return spans


def code_texts(page: Path) -> list[tuple[str, str]]:
    """(where, text) of every piece of code on a page: block lines (backslash continuations joined;
    a comment is prose, so only its `quoted` spans count) and inline spans."""
    texts, page_name = [], page.relative_to(REPO)
    for block in code_blocks(page):
        lines, k = block.body.splitlines(), 0
        while k < len(lines):
            where, line = f"{page_name}:{block.line + 1 + k}", lines[k]
            while line.endswith("\\") and k + 1 < len(lines):
                k += 1
                line = line[:-1] + " " + lines[k].strip()
            k += 1
            hash_ = re.search(r"(^|\s)#", line)
            code, comment = (line[:hash_.start()], line[hash_.end():]) if hash_ else (line, "")
            texts += [(where, code)] + [(where, q) for q in re.findall(r"`([^`]+)`", comment)]
    texts += [(f"{page_name}:{n}", s) for n, s in inline_code(page)]
    return texts


# --- the site -----------------------------------------------------------------------------------

def _nav_pages(nav) -> set[str]:
    if isinstance(nav, str):
        return {nav}
    if isinstance(nav, list):
        return set().union(*(_nav_pages(item) for item in nav)) if nav else set()
    if isinstance(nav, dict):
        return set().union(*(_nav_pages(v) for v in nav.values()))
    return set()


def test_every_page_is_in_the_nav():
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    assert _nav_pages(config["nav"]) == {p.name for p in DOCS.glob("*.md")}


@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None,
                    reason="mkdocs and mkdocs-material are not installed (pip install -e '.[docs]' or '.[dev]')")
def test_the_site_builds_strict(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                             str(REPO / "mkdocs.yml"), "--site-dir", str(tmp_path / "site")],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-4000:]
    # The included pages really got their text (an include that silently vanished would still build).
    assert "Flags (each also read from the environment variable shown)" in (tmp_path / "site" / "reference-server.html").read_text()
    assert "generator (benchmarks/generator.py)" in (tmp_path / "site" / "benchmark-results.html").read_text()


def test_the_readme_is_a_front_page():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) < README_MAX_LINES
    # .ci/run runs exactly these two commands.
    assert "python3 -m venv .venv && .venv/bin/pip install -q -e '.[dev]' && .venv/bin/latscope run scenarios/burst.yaml" in text
    assert ".venv/bin/python -m pytest -q" in text
    assert "docs/report.png" in text


def test_the_readme_links_resolve():
    text = (REPO / "README.md").read_text()
    links = [t for t in re.findall(r"\]\(([^)\s]+)\)", text) if not re.match(r"[a-z]+:", t)]
    assert links
    missing = [t for t in links if not (REPO / t.split("#")[0]).exists()]
    assert not missing, missing


# --- YAML snippets ------------------------------------------------------------------------------

SCENARIO_KEYS = set(Scenario.model_fields)
GATE_KEYS = set(GateFile.model_fields)
MINIMAL = {"name": "docs-snippet", "target": {"url": "http://127.0.0.1:9"},
           "phases": [{"name": "p", "duration": "60s", "arrival": {"type": "constant", "rate": 1}}]}
YAML_BLOCKS = [b for page in PAGES for b in code_blocks(page) if b.info == "yaml"]


def _files_named(data) -> list[str]:
    if isinstance(data, dict):
        return [v for k, v in data.items() if k in ("file", "npy") and isinstance(v, str)] + \
            [f for v in data.values() for f in _files_named(v)]
    if isinstance(data, list):
        return [f for v in data for f in _files_named(v)]
    return []


@pytest.fixture
def snippet_dir(tmp_path) -> Path:
    """<tmp>/scenarios, beside <tmp>/data -> the repository's data/: `../data/…` resolves."""
    (tmp_path / "data").symlink_to(REPO / "data")
    (tmp_path / "scenarios").mkdir()
    return tmp_path / "scenarios"


def test_the_docs_have_yaml_snippets():
    assert len(YAML_BLOCKS) >= 15


@pytest.mark.parametrize("block", YAML_BLOCKS, ids=[b.where for b in YAML_BLOCKS])
def test_yaml_snippet_validates(block, snippet_dir, monkeypatch):
    first = block.body.lstrip().splitlines()[0] if block.body.strip() else ""
    if first.startswith("# not a scenario"):
        assert re.match(r"# not a scenario: \S", first), f"{block.where}: say why it is not a scenario"
        return
    data = yaml.safe_load(block.body)
    assert isinstance(data, dict), f"{block.where}: a YAML snippet should be a mapping (or marked '# not a scenario: why')"
    for name in re.findall(r"\$\{(\w+)\}", block.body):  # ${VAR} without a default must be set to load
        if name not in os.environ:
            monkeypatch.setenv(name, "docs-test-value")
    path = snippet_dir / "snippet.yaml"
    keys = set(data)
    if keys <= GATE_KEYS and keys & {"regression", "min_capacity_rps"}:
        path.write_text(block.body)
        load_gate_file(path)
        return
    unknown = keys - SCENARIO_KEYS
    assert not unknown, f"{block.where}: {sorted(unknown)} are neither scenario nor gate-file keys"
    if not {"target", "phases"} <= keys:  # a fragment: one section shown at a time
        data = {**copy.deepcopy(MINIMAL), **data}
        path.write_text(yaml.safe_dump(data, sort_keys=False))
    else:
        path.write_text(block.body)
    try:
        scenario = load_scenario(path)
    except ScenarioError as exc:
        pytest.fail(f"{block.where}: {exc}")
    files = [snippet_dir / f for f in _files_named(data)]
    for f in files:
        if f.as_posix().count("../data/"):
            assert f.exists(), f"{block.where}: {f.name} is not in data/"
    if all(f.exists() for f in files):
        build_plan(scenario)


# --- commands and flags -------------------------------------------------------------------------

COMMAND = re.compile(r"(?<![\w./-])latscope\s+(.*)")
CUT = re.compile(r"\s#|[|;&)>`]")


def _options(command: click.Command) -> set[str]:
    names = {"--help", "-h"}
    for param in command.params:
        names.update(getattr(param, "opts", ()), getattr(param, "secondary_opts", ()))
    return names


def _invocations(page: Path) -> list[tuple[str, click.Command | None, str, list[str]]]:
    """(where, command or None, its name, its tokens after the command name) of every `latscope …`."""
    found = []
    for where, text in code_texts(page):
        for m in COMMAND.finditer(text):
            rest = CUT.split(m.group(1), maxsplit=1)[0]
            try:
                tokens = shlex.split(rest)
            except ValueError:
                tokens = rest.split()
            if not tokens or not re.fullmatch(r"[a-z][a-z-]*", tokens[0]):
                continue
            command, name, tokens = main.commands.get(tokens[0]), tokens[0], tokens[1:]
            if isinstance(command, click.Group) and tokens and not tokens[0].startswith("-"):
                name = f"{name} {tokens[0]}"
                command, tokens = command.commands.get(tokens[0]), tokens[1:]
            found.append((where, command, name, tokens))
    return found


def test_the_pages_name_commands():
    names = {name for page in PAGES for _, _, name, _ in _invocations(page)}
    assert {"run", "init", "validate", "report", "compare", "gate", "baseline save", "capacity", "worker"} <= names


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(REPO)) for p in PAGES])
def test_every_command_and_flag_a_page_names_exists(page):
    problems = []
    for where, command, name, tokens in _invocations(page):
        if command is None:
            problems.append(f"{where}: no command `latscope {name}`")
            continue
        options = _options(command)
        for token in tokens:
            flag = re.match(r"\[?(--?[A-Za-z][\w-]*)", token)
            if flag and flag.group(1) not in options:
                problems.append(f"{where}: `latscope {name}` has no option {flag.group(1)}")
    assert not problems, "\n".join(problems)


def _set_overrides(tokens: list[str]) -> tuple[str | None, list[str]]:
    """The scenario file (first positional) and the --set values of a command's tokens."""
    scenario, sets, i = None, [], 0
    while i < len(tokens):
        if tokens[i] == "--set" and i + 1 < len(tokens):
            sets.append(tokens[i + 1])
            i += 2
            continue
        if tokens[i].startswith("--set="):
            sets.append(tokens[i][len("--set="):])
        elif scenario is None and not tokens[i].startswith("-") and tokens[i].endswith(".yaml"):
            scenario = tokens[i]
        i += 1
    return scenario, sets


def test_every_set_applies_to_the_scenario_it_names(monkeypatch):
    checked = 0
    for page in PAGES:
        for where, command, name, tokens in _invocations(page):
            scenario, sets = _set_overrides(tokens)
            if name not in ("run", "validate", "capacity") or not sets or scenario is None:
                continue
            path = REPO / scenario
            if not path.exists():
                continue  # a file of the reader's (first.yaml); the path test covers scenarios/…
            for var in re.findall(r"\$\{(\w+)\}", path.read_text()):
                monkeypatch.setenv(var, os.environ.get(var, "docs-test-value"))
            try:
                load_scenario(path, sets)
            except Exception as exc:  # noqa: BLE001 — the message names the page
                pytest.fail(f"{where}: latscope {name} {scenario} --set {' --set '.join(sets)}: {exc}")
            checked += 1
    assert checked >= 5


# --- paths --------------------------------------------------------------------------------------

PATH = re.compile(r"(?<![\w/.~-])(?:\.\./)?((?:scenarios|examples|benchmarks|data|dashboards|tests|latscope|"
                  r"reference_server|docs)/[\w./-]*[\w/])")


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(REPO)) for p in PAGES])
def test_every_path_a_page_names_exists(page):
    missing = [f"{where}: {m}" for where, text in code_texts(page) for m in PATH.findall(text)
               if not (REPO / m).exists()]
    assert not missing, "\n".join(missing)
