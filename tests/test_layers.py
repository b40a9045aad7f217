"""The import graph of latscope and reference_server, read from their source with `ast`: a one-way
street (no cycles) with the arrows docs/architecture.md allows, and modules small enough to read.

Edges are the modules a module imports, at module level or inside a function; imports under
`if TYPE_CHECKING:` are left out (they never run), except where the modules of one package are
checked for cycles (a circle for type hints still ties two modules together). `from pkg import name` is an edge to the module
pkg.name when there is one, else to pkg.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from conftest import REPO

PACKAGES = ("latscope", "reference_server")
MAX_LINES = 600
# What the measuring side is made of: the results directory's readers never import it (DESIGN.md:
# each stage reads only what the stage before it wrote; the results directory is the contract).
MEASURING = ("latscope.engine", "latscope.intervals", "latscope.run", "latscope.protocols", "latscope.plan",
             "latscope.workload", "latscope.arrivals", "latscope.request_log")
READERS = ("latscope.analysis", "latscope.report", "latscope.results")


def module_files() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports_of(path: Path, name: str, modules: set[str], type_checking: bool = False) -> set[str]:
    """The internal modules `name` (at `path`) imports, TYPE_CHECKING imports left out (counted too
    with `type_checking`)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child) and not type_checking:
                for other in child.orelse:
                    visit(other)
                continue
            if isinstance(child, ast.Import):
                found.update(alias.name for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:  # relative: from the package, `level - 1` packages up
                    anchor = package.split(".")[: len(package.split(".")) - (child.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                for alias in child.names:
                    full = f"{base}.{alias.name}"
                    found.add(full if full in modules else base)
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    return {m for m in found if m in modules}


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    files = module_files()
    return {name: imports_of(path, name, set(files)) - {name} for name, path in files.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return found


def within(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def arrows(graph: dict[str, set[str]], source: tuple[str, ...], target: tuple[str, ...]) -> list[str]:
    return sorted(f"{a} -> {b}" for a, deps in graph.items() if within(a, source) for b in deps if within(b, target))


def test_the_graph_is_read_and_sees_lazy_imports_but_not_type_checking_ones(graph):
    # orchestrator imports the report inside a function; telemetry.session imports the scenario for typing only
    assert "latscope.report" in graph["latscope.run.orchestrator"]
    assert "latscope.scenario" not in graph["latscope.telemetry.session"]
    assert {"latscope.engine", "latscope.scenario", "reference_server.server", "reference_server.proto"} <= graph.keys()


def test_no_import_cycles(graph):
    assert cycles(graph) == []


def package_cycles(graph: dict[str, set[str]]) -> list[tuple[str, list[str]]]:
    """(package, its modules in a cycle) for every cycle among the modules of one package: the
    package's __init__ and the modules and subpackages directly in it."""
    files = module_files()
    groups: dict[str, set[str]] = {}
    for name, path in files.items():
        if path.name == "__init__.py":
            groups.setdefault(name, set()).add(name)
        if "." in name:
            groups.setdefault(name.rpartition(".")[0], set()).add(name)
    return [(package, cycle) for package, members in sorted(groups.items())
            for cycle in cycles({m: graph.get(m, set()) & members for m in members})]


def test_no_cycle_between_modules_of_one_package_typing_imports_included():
    """Inside a package (latscope.scenario, latscope.run, reference_server, …) no modules import each
    other round in a circle, not even through `if TYPE_CHECKING:` imports: a circle for type hints
    still means neither module can be read, or moved, without the other."""
    files = module_files()
    typed = {name: imports_of(path, name, set(files), type_checking=True) - {name} for name, path in files.items()}
    assert "latscope.scenario" in typed["latscope.telemetry.session"]  # typing-only imports are edges here
    assert package_cycles(typed) == []
    # the check sees such a circle: the one actions.py closed when it imported Scenario for a type hint
    typed["latscope.scenario.actions"] = typed["latscope.scenario.actions"] | {"latscope.scenario.schema"}
    assert package_cycles(typed) == [("latscope.scenario", ["latscope.scenario.actions", "latscope.scenario.schema"])]


def test_what_reads_a_results_directory_never_imports_what_measures(graph):
    assert arrows(graph, READERS, MEASURING) == []


def test_the_scenario_imports_only_errors(graph):
    outside = {b for a, deps in graph.items() if within(a, ("latscope.scenario",)) for b in deps
               if not within(b, ("latscope.scenario",))}
    assert outside <= {"latscope.errors"}


def test_the_demo_targets_import_nothing_from_latscope(graph):
    assert [e for e in arrows(graph, ("latscope.targets",), ("latscope",)) if "-> latscope.targets" not in e] == []


def test_the_reference_server_is_a_separate_program(graph):
    assert arrows(graph, ("reference_server",), ("latscope",)) == []
    # latscope speaks the reference server's wire format only through its proto package (on purpose:
    # the KServe v2 gRPC messages, compiled once)
    used = {b for a, deps in graph.items() if within(a, ("latscope",)) for b in deps if within(b, ("reference_server",))}
    assert used and all(within(b, ("reference_server.proto",)) for b in used)


def test_no_module_is_over_600_lines():
    long = {name: n for name, path in module_files().items() if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_a_forbidden_arrow_is_caught(tmp_path):
    """The checks above can fail: an analysis module that imported the engine would be an arrow from a
    reader to the measuring side, and a scenario module that imported the plan would close a cycle."""
    files = module_files()
    graph = {name: imports_of(path, name, set(files)) - {name} for name, path in files.items()}
    graph["latscope.analysis.coldstart"] = graph["latscope.analysis.coldstart"] | {"latscope.engine"}
    graph["latscope.scenario.schema"] = graph["latscope.scenario.schema"] | {"latscope.plan"}
    assert arrows(graph, READERS, MEASURING) == ["latscope.analysis.coldstart -> latscope.engine"]
    assert any("latscope.plan" in c and "latscope.scenario.schema" in c for c in cycles(graph))


def external_imports(path: Path) -> set[str]:
    """The top-level names of every package a file imports (internal ones too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module.split(".")[0])
    return found


def test_locust_and_gevent_live_in_one_module_which_imports_only_the_framing(graph):
    """`import locust` patches the whole interpreter for gevent, under which no asyncio engine can run
    (latscope/distributed/locustfile.py): only the locustfile imports it, and the locustfile imports
    of latscope only what it relays with, so that nothing that measures is ever loaded beside gevent."""
    users = {name for name, path in module_files().items() if external_imports(path) & {"locust", "gevent", "zmq"}}
    assert users == {"latscope.distributed.locustfile"}
    relay = {"latscope", "latscope.distributed", "latscope.distributed.frames", "latscope.distributed.validate"}
    assert graph["latscope.distributed.locustfile"] <= relay  # the framing, and the checks of what a worker says
    assert graph["latscope.distributed.validate"] <= relay
    # and only the command line reaches the distributed package from the rest of latscope
    assert [e for e in arrows(graph, ("latscope",), ("latscope.distributed",))
            if not e.startswith(("latscope.distributed", "latscope.cli "))] == []


def test_nothing_latscope_loads_needs_the_server_extra(graph):
    """`pip install latscope` leaves out what the `server` extra brings (ONNX, ONNX Runtime: the
    reference server's model and backends): no module latscope can load, its own or a reference_server
    one it reaches (the proto package), imports them, at module level or inside a function."""
    import tomllib

    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["server"]
    server_only = {req.split(">")[0].split("=")[0].split("[")[0].strip().lower() for req in extra}
    assert {"onnx", "onnxruntime"} <= server_only
    files = module_files()
    reached, todo = set(), [name for name in graph if within(name, ("latscope",))]
    while todo:
        name = todo.pop()
        if name not in reached:
            reached.add(name)
            todo.extend(graph[name])
    assert {name for name in reached if external_imports(files[name]) & server_only} == set()
    # the check sees such an import: the reference server's own backend is one, and latscope never reaches it
    assert "onnxruntime" in external_imports(files["reference_server.backends.onnxruntime"])
    assert "reference_server.backends.onnxruntime" not in reached


def test_the_python_api_sits_on_top_beside_the_command_line(graph):
    """latscope.api (open a results directory, run a scenario, the capacity search) is what the command
    line is built on: nothing else imports it, and the package itself imports nothing (its lazy
    `__getattr__` loads the API by name on first use), so `import latscope` stays cheap and no arrow
    from a module that reads `latscope.__version__` closes a cycle through the API."""
    assert sorted(a for a, deps in graph.items() if "latscope.api" in deps) == ["latscope.cli"]
    assert graph["latscope"] == set()
