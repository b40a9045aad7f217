"""The deployment examples in examples/distributed/ (Dockerfile, Docker Compose, Kubernetes, README),
checked without Docker or a cluster.

Every command they run or show is parsed by what will run it: the click command (`latscope ...`,
`python -m reference_server serve ...`) or Locust's parser with latscope's locustfile loaded
(`locust ...`, the Locust operator's arguments). The scenario each run names is found where the
image has it and validates with the command's overrides. And the pieces agree: the master binds the
port the workers and its Service use, the load goes to the target's service and port, the results
land on a volume, the workers are as many as the master expects.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
import subprocess
import sys
import tomllib
from functools import cache
from pathlib import Path, PurePosixPath
from urllib.parse import SplitResult, urlsplit

import click
import pytest
import yaml

from latscope.cli import main as latscope_main
from latscope.scenario import load_scenario
from reference_server.cli import main as reference_server_main
from reference_server.config import ServerConfig

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples" / "distributed"
DOCKERFILE = EXAMPLES / "Dockerfile"
COMPOSE_FILE = EXAMPLES / "docker-compose.yml"
K8S_DIR = EXAMPLES / "kubernetes"
OPERATOR_FILE = K8S_DIR / "00-namespace.yaml"  # its comment holds the locust-operator LocustTest
README = EXAMPLES / "README.md"
LOCUSTFILE = REPO / "latscope" / "distributed" / "locustfile.py"

DEFAULT_BIND = "127.0.0.1:5557"  # `latscope run --distributed --bind`'s default
DEFAULT_MASTER_PORT = "5557"  # `latscope worker --master-port`'s default
LOCUSTFILE_IMPORT = "from latscope.distributed.locustfile import *"
REFERENCE_SERVER = ["python", "-m", "reference_server"]


# --- reading commands ----------------------------------------------------------------------------

def option_values(argv: list[str], name: str) -> list[str]:
    """Every value given to option `name`, as `--name VALUE` or `--name=VALUE`."""
    values = []
    for i, token in enumerate(argv):
        if token == name and i + 1 < len(argv):
            values.append(argv[i + 1])
        elif token.startswith(name + "="):
            values.append(token.split("=", 1)[1])
    return values


def option_value(argv: list[str], name: str, default: str | None = None) -> str | None:
    values = option_values(argv, name)
    assert len(values) <= 1, f"{name} given {len(values)} times: {shlex.join(argv)}"
    return values[0] if values else default


def options(argv: list[str]) -> list[str]:
    """The long options in argv, without their `=VALUE`."""
    return [token.split("=", 1)[0] for token in argv if token.startswith("--")]


def parse(group: click.Group, program: str, args: list[str]) -> click.Context:
    """Parse `args` (the subcommand first) with the click command that will run them.

    Unknown options are reported by name, all at once; a bad value with click's own message."""
    name, *rest = args
    command = group.commands.get(name)
    assert command is not None, f"`{program} {name}`: no such subcommand ({', '.join(sorted(group.commands))})"
    known = {opt for param in command.params if isinstance(param, click.Option)
             for opt in (*param.opts, *param.secondary_opts)}
    unknown = [opt for opt in options(rest) if opt not in known]
    assert not unknown, f"`{program} {name}` has no option {', '.join(unknown)}"
    try:
        return command.make_context(f"{program} {name}", list(rest))
    except click.ClickException as exc:
        pytest.fail(f"`{program} {name}`: {exc.format_message()}")


def host_port(address: str) -> tuple[str, str]:
    host, _, port = address.rpartition(":")
    return host, port


# --- the Dockerfile: what the image holds --------------------------------------------------------

@cache
def dockerfile() -> tuple[tuple[str, str], ...]:
    """(INSTRUCTION, its arguments) for each instruction, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    lines = (line.strip() for line in text.splitlines())
    instructions = (line.split(None, 1) for line in lines if line and not line.startswith("#"))
    return tuple((instruction.upper(), arguments) for instruction, arguments in instructions)


@cache
def image_layout() -> tuple[PurePosixPath, tuple[tuple[str, PurePosixPath, bool], ...]]:
    """The image's final WORKDIR, and each COPY from the build context (the repository root) as
    (source, absolute destination, destination is a directory)."""
    workdir, copies = PurePosixPath("/"), []
    for instruction, arguments in dockerfile():
        if instruction == "WORKDIR":
            workdir = workdir / arguments
        elif instruction == "COPY":
            args = json.loads(arguments) if arguments.startswith("[") else shlex.split(arguments)
            if any(arg.startswith("--from") for arg in args):
                continue
            *sources, dest = [arg for arg in args if not arg.startswith("--")]
            copies += [(source, workdir / dest, dest.endswith("/") or len(sources) > 1) for source in sources]
    return workdir, tuple(copies)


def repo_file_in_image(path: str) -> Path | None:
    """The repository file the image has at `path` (relative to its WORKDIR), or None."""
    workdir, copies = image_layout()
    wanted = workdir / path
    for source, dest, into_dir in reversed(copies):  # a later COPY wins
        source_path = REPO / source
        if source_path.is_dir() and wanted.is_relative_to(dest):
            return source_path / wanted.relative_to(dest)
        if source_path.is_file() and wanted == (dest / source_path.name if into_dir else dest):
            return source_path
    return None


# --- the compose file and the manifests ----------------------------------------------------------

@cache
def compose() -> dict:
    return yaml.safe_load(COMPOSE_FILE.read_text())


def compose_argv(service: str) -> list[str]:
    command = compose()["services"][service]["command"]
    return shlex.split(command) if isinstance(command, str) else [str(arg) for arg in command]


@cache
def k8s_objects() -> tuple[dict, ...]:
    paths = sorted(K8S_DIR.glob("*.yaml"))
    return tuple(doc for path in paths for doc in yaml.safe_load_all(path.read_text()) if doc)


def k8s_object(kind: str, name: str) -> dict:
    found = [obj for obj in k8s_objects() if obj["kind"] == kind and obj["metadata"]["name"] == name]
    assert len(found) == 1, f"{len(found)} {kind} named {name} in {K8S_DIR.relative_to(REPO)}"
    return found[0]


def k8s_container(workload: dict) -> dict:
    containers = workload["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1, f"{workload['kind']}/{workload['metadata']['name']}: one container expected"
    return containers[0]


def k8s_argv(container: dict) -> list[str]:
    return [str(arg) for arg in (*container.get("command", []), *container.get("args", []))]


def k8s_workloads() -> list[dict]:
    return [obj for obj in k8s_objects() if obj["kind"] in ("Deployment", "Job")]


def selected_workload(service: dict) -> dict:
    """The one workload whose pods the Service selects."""
    selector = service["spec"]["selector"].items()
    found = [w for w in k8s_workloads() if selector <= w["spec"]["template"]["metadata"]["labels"].items()]
    assert len(found) == 1, f"Service {service['metadata']['name']} selects {len(found)} workloads"
    return found[0]


def container_port(container: dict, port: int | str) -> int:
    """A port of the container, by number or by name."""
    ports = {p.get("name"): p["containerPort"] for p in container.get("ports", [])}
    if isinstance(port, int):
        assert port in ports.values(), f"container {container['name']} declares no port {port}"
        return port
    assert port in ports, f"container {container['name']} has no port named {port!r}"
    return ports[port]


def service_target_port(name: str) -> tuple[int, int]:
    """(port, the container port it sends to) of the Service `name`'s only port."""
    service = k8s_object("Service", name)
    (port,) = service["spec"]["ports"]
    container = k8s_container(selected_workload(service))
    return port["port"], container_port(container, port.get("targetPort", port["port"]))


# --- the operator's LocustTest and the README ----------------------------------------------------

@cache
def operator_locusttest() -> dict:
    """The LocustTest in OPERATOR_FILE's comment: the block from `#   apiVersion: locust.cloud/...`
    on, while lines start with `#   ` (the prose around it with `# `)."""
    lines = OPERATOR_FILE.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("#   apiVersion: locust.cloud/"))
    block = []
    for line in lines[start:]:
        if not line.startswith("#   "):
            break
        block.append(line[4:])
    return yaml.safe_load("\n".join(block))


@cache
def readme_commands() -> tuple[tuple[int, list[str]], ...]:
    """(line number, argv) of each command in the README's fenced code blocks, as a shell reads them:
    backslash continuations and quotes spanning lines joined, `# ...` comments dropped. A
    `$(latscope ...)` substitution counts as a command of its own."""
    commands, fenced, pending, start = [], False, "", 0
    for number, line in enumerate(README.read_text().splitlines(), 1):
        if line.startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            continue
        if not pending:
            start = number
        pending += line.removesuffix("\\") + "\n"
        if line.endswith("\\"):
            continue
        try:
            argv = shlex.split(pending, comments=True)
        except ValueError:  # an open quote: the command goes on
            continue
        if argv:
            commands.append((start, argv))
        commands += [(start, shlex.split(sub)) for sub in re.findall(r"\$\((latscope [^)]*)\)", pending)]
        pending = ""
    assert not pending, f"{README.name}:{start}: unterminated command"
    return tuple(commands)


# --- every command, by what runs it --------------------------------------------------------------

def latscope_commands() -> list:
    """pytest params (argv, in the image?) of every `latscope` command: compose, manifests, README."""
    found = [pytest.param(compose_argv(s), True, id=f"compose:{s}") for s in compose()["services"]
             if compose_argv(s)[0] == "latscope"]
    found += [pytest.param(k8s_argv(k8s_container(w)), True, id=f"k8s:{w['kind']}/{w['metadata']['name']}")
              for w in k8s_workloads() if k8s_argv(k8s_container(w))[:1] == ["latscope"]]
    found += [pytest.param(argv, False, id=f"README:{number}")
              for number, argv in readme_commands() if argv[0] == "latscope"]
    return found


def run_commands() -> list:
    return [param for param in latscope_commands() if param.values[0][1] == "run"]


def reference_server_params(argv: list[str]) -> dict:
    """`python -m reference_server serve ...`'s parameters, as its CLI parses them."""
    return parse(reference_server_main, shlex.join(REFERENCE_SERVER), argv[len(REFERENCE_SERVER):]).params


def target_commands() -> dict[str, list[str]]:
    return {"compose": compose_argv("target"), "k8s": k8s_argv(k8s_container(k8s_object("Deployment", "target")))}


def scenario_of(argv: list[str], in_image: bool) -> Path:
    """The scenario file `latscope run SCENARIO ...` runs, in the repository. The examples name it first."""
    path = argv[2]
    found = repo_file_in_image(path) if in_image else REPO / path
    assert found is not None, f"{path}: not in the image (no COPY of it in {DOCKERFILE.relative_to(REPO)})"
    return found


def target_url(argv: list[str]) -> SplitResult:
    """Where a container's `latscope run ...` sends its load: the scenario's target.url, with its --set."""
    return urlsplit(load_scenario(scenario_of(argv, True), tuple(option_values(argv, "--set"))).target.url)


# --- the tests -----------------------------------------------------------------------------------

def test_every_example_is_covered() -> None:
    """The parametrized tests below see the services and manifests they should (not silently none)."""
    assert {"target", "master", "worker"} <= set(compose()["services"])
    ids = {param.id for param in latscope_commands()}
    assert {"compose:master", "compose:worker", "k8s:Job/master", "k8s:Job/worker"} <= ids
    assert any(i.startswith("README:") for i in ids)


@pytest.mark.parametrize(("argv", "in_image"), latscope_commands())
def test_latscope_command_parses(argv: list[str], in_image: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """`latscope SUBCOMMAND --options...`: the subcommand exists and takes every option given, with
    values of the right type (as the image, the commands run from the repository root)."""
    monkeypatch.chdir(REPO)
    parse(latscope_main, "latscope", argv[1:])


@pytest.mark.parametrize(("argv", "in_image"), run_commands())
def test_scenario_validates(argv: list[str], in_image: bool) -> None:
    """The scenario a distributed run names exists (in the image, for the containers' commands) and
    validates with the command's --set; its launch hook is removed, or the master would start a
    reference server of its own on 127.0.0.1 instead of loading the target service."""
    assert "--distributed" in argv, shlex.join(argv)
    scenario = load_scenario(scenario_of(argv, in_image), tuple(option_values(argv, "--set")))
    assert scenario.target.launch is None, "add --set target.launch=null"


@pytest.mark.parametrize("where", ["compose", "k8s"])
def test_reference_server_command(where: str) -> None:
    """The target runs `python -m reference_server serve` with flags its CLI accepts, listening on
    all interfaces (its default, 127.0.0.1, is unreachable from the other containers)."""
    argv = target_commands()[where]
    assert argv[:3] == REFERENCE_SERVER, shlex.join(argv)
    assert importlib.util.find_spec("reference_server") is not None
    params = reference_server_params(argv)
    ServerConfig(**params)
    assert params["host"] == "0.0.0.0"


def test_compose_workers_reach_the_master() -> None:
    """The workers connect to the master's service on the port it binds, on an address other
    containers can reach, and are as many as it expects; none is restarted (refused as a late joiner)."""
    services = compose()["services"]
    master, worker = compose_argv("master"), compose_argv("worker")
    bind_host, bind_port = host_port(option_value(master, "--bind", DEFAULT_BIND))
    assert bind_host not in ("127.0.0.1", "localhost"), "the workers, in other containers, could not connect"
    assert option_value(worker, "--master-host") in services
    assert option_value(worker, "--master-port", DEFAULT_MASTER_PORT) == bind_port
    assert services["worker"]["deploy"]["replicas"] == int(option_value(master, "--expect-workers"))
    assert services["worker"].get("restart", "no") == "no", "a restarted worker is refused as a late joiner"


def test_compose_load_goes_to_the_target() -> None:
    """The scenario's URL is the target service's port, on a network of this file's own, which has no
    route out: the load can reach nothing else. The master waits for the target to be healthy (the
    run's launch hook, which would wait, is removed), on the port the server listens on."""
    compose_file = compose()
    url = target_url(compose_argv("master"))
    http_port = reference_server_params(compose_argv("target"))["http_port"]
    assert (url.hostname, url.port) == ("target", http_port)

    healthcheck = " ".join(compose_file["services"]["target"]["healthcheck"]["test"])
    assert urlsplit(re.search(r"http://[^'\" ]+", healthcheck).group()).port == http_port
    assert compose_file["services"]["master"]["depends_on"]["target"]["condition"] == "service_healthy"

    for name, service in compose_file["services"].items():
        assert service.get("networks"), f"{name}: on the default network, which has a route out"
        assert all(compose_file["networks"][net].get("internal") for net in service["networks"]), name


def test_compose_results_on_the_host() -> None:
    out = PurePosixPath(option_value(compose_argv("master"), "--out"))
    mounts = [PurePosixPath(volume.split(":")[1]) for volume in compose()["services"]["master"]["volumes"]]
    assert any(out.is_relative_to(mount) for mount in mounts), f"--out {out}: on no volume, lost with the container"


def test_compose_builds_the_dockerfile_from_the_repo_root() -> None:
    for name, service in compose()["services"].items():
        build = service["build"]
        context = (COMPOSE_FILE.parent / build["context"]).resolve()
        assert context == REPO, name
        assert (context / build["dockerfile"]).resolve() == DOCKERFILE, name


def test_k8s_objects_share_one_namespace() -> None:
    (namespace,) = [obj["metadata"]["name"] for obj in k8s_objects() if obj["kind"] == "Namespace"]
    for obj in k8s_objects():
        if obj["kind"] != "Namespace":
            assert obj["metadata"].get("namespace") == namespace, f"{obj['kind']}/{obj['metadata']['name']}"


def test_k8s_deployments_select_their_pods() -> None:
    for workload in k8s_workloads():
        if workload["kind"] == "Deployment":
            labels = workload["spec"]["template"]["metadata"]["labels"].items()
            assert workload["spec"]["selector"]["matchLabels"].items() <= labels, workload["metadata"]["name"]


def test_k8s_workers_reach_the_master() -> None:
    """The workers connect to the master Service on its port, which sends to the port the master binds,
    and are as many as it expects; none is ever restarted or replaced (refused as late joiners)."""
    master = k8s_argv(k8s_container(k8s_object("Job", "master")))
    worker_job = k8s_object("Job", "worker")
    worker = k8s_argv(k8s_container(worker_job))
    bind_host, bind_port = host_port(option_value(master, "--bind", DEFAULT_BIND))
    assert bind_host not in ("127.0.0.1", "localhost"), "the workers, in other pods, could not connect"

    service_name = option_value(worker, "--master-host")
    port, pod_port = service_target_port(service_name)
    assert selected_workload(k8s_object("Service", service_name)) is k8s_object("Job", "master")
    assert str(port) == option_value(worker, "--master-port", DEFAULT_MASTER_PORT)
    assert str(pod_port) == bind_port

    expected = int(option_value(master, "--expect-workers"))
    assert worker_job["spec"]["parallelism"] == worker_job["spec"]["completions"] == expected
    assert worker_job["spec"]["template"]["spec"]["restartPolicy"] == "Never"
    assert worker_job["spec"]["backoffLimit"] == 0


def test_k8s_load_goes_to_the_target() -> None:
    url = target_url(k8s_argv(k8s_container(k8s_object("Job", "master"))))
    target = k8s_container(k8s_object("Deployment", "target"))
    http_port = reference_server_params(k8s_argv(target))["http_port"]
    assert url.hostname == "target"
    assert service_target_port("target") == (url.port, http_port)
    assert container_port(target, target["readinessProbe"]["httpGet"]["port"]) == http_port


def test_k8s_results_on_a_volume_claim() -> None:
    job = k8s_object("Job", "master")
    container = k8s_container(job)
    out = PurePosixPath(option_value(k8s_argv(container), "--out"))
    claims = {v["name"] for v in job["spec"]["template"]["spec"]["volumes"] if "persistentVolumeClaim" in v}
    mounts = [PurePosixPath(m["mountPath"]) for m in container["volumeMounts"] if m["name"] in claims]
    assert any(out.is_relative_to(mount) for mount in mounts), f"--out {out} is on no PersistentVolumeClaim"


def test_k8s_runs_the_image_compose_builds() -> None:
    image = compose()["services"]["master"]["image"]
    for workload in k8s_workloads():
        spec = workload["spec"]["template"]["spec"]
        for container in (*spec.get("initContainers", []), *spec["containers"]):
            assert container["image"] == image, f"{workload['metadata']['name']}/{container['name']}"


def test_dockerfile_copies_what_exists() -> None:
    instructions = dict(dockerfile())
    assert instructions["FROM"] == "python:3.11-slim"
    _, copies = image_layout()
    assert copies
    for source, _, _ in copies:
        assert (REPO / source).exists(), f"COPY {source}: not in the build context (the repository root)"


def test_dockerfile_installs_the_distributed_and_server_extras() -> None:
    """The extras the image installs are ones pyproject.toml defines (pip only warns on a misspelled one):
    Locust for the master and workers, ONNX Runtime for the reference server the `target` service runs."""
    installs = [args for instruction, args in dockerfile() if instruction == "RUN" and "pip install" in args]
    extras = {name for args in installs for group in re.findall(r"\.\[([\w,-]+)\]", args) for name in group.split(",")}
    assert extras == {"distributed", "server"}
    defined = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert "distributed" in defined, "pyproject.toml has no [project.optional-dependencies] distributed"
    assert any(re.match(r"locust\b", req) for req in defined["distributed"])
    assert any(re.match(r"onnxruntime\b", req) for req in defined["server"])


# Run in a subprocess: importing locust monkey-patches the standard library (gevent) for good.
LOCUST_PROBE = """
import contextlib, importlib, io, json, sys
from locust import LoadTestShape, User
from locust.argument_parser import get_parser

def locust_classes(namespace):
    return sorted(name for name, value in namespace.items() if isinstance(value, type)
                  and (issubclass(value, User) and value.abstract is False or issubclass(value, LoadTestShape)
                       and value is not LoadTestShape))

module = importlib.import_module("latscope.distributed.locustfile")
star = {}
exec(sys.argv[1], star)
parser = get_parser(default_config_files=[])
names = sorted(name for action in parser._actions for name in action.option_strings)  # argparse has no public list
errors = []
for argv in json.loads(sys.argv[2]):
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            parser.parse_args(argv)
        errors.append(None)
    except SystemExit:
        errors.append((stderr.getvalue().strip() or "exited").splitlines()[-1])
print(json.dumps({"file": module.__file__, "bundled": locust_classes(vars(module)),
                  "star_import": locust_classes(star), "options": names, "errors": errors}))
"""


def locust_commands() -> list:
    """pytest params of Locust's command lines (without `locust`): the operator's master and worker
    (it puts `--master` or `--worker --master-host ...` before the LocustTest's args), the README's."""
    args = shlex.split(operator_locusttest()["spec"]["args"])
    return [pytest.param(["--master", *args], id="operator-master"),
            pytest.param(["--worker", "--master-host", "smoke-master", *args], id="operator-worker"),
            *(pytest.param(argv[1:], id=f"README:{number}")
              for number, argv in readme_commands() if argv[0] == "locust")]


@cache
def locust_probe() -> dict:
    """Locust with latscope's locustfile loaded: the file, the User and shape classes it and the
    operator's one-line locustfile define, and the parse error of each of locust_commands()."""
    assert LOCUSTFILE.is_file(), f"{LOCUSTFILE.relative_to(REPO)}: missing"
    commands = [param.values[0] for param in locust_commands()]
    operator_locustfile = operator_locusttest()["spec"]["locustfile"]["content"]
    result = subprocess.run([sys.executable, "-c", LOCUST_PROBE, operator_locustfile, json.dumps(commands)],
                            capture_output=True, text=True, timeout=60, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.splitlines()[-1])


needs_locust = pytest.mark.skipif(importlib.util.find_spec("locust") is None, reason="locust is not installed")


@needs_locust
@pytest.mark.parametrize("argv", locust_commands())
def test_locust_command_parses(argv: list[str]) -> None:
    """Locust, with latscope's locustfile loaded, takes every option given (its own and the
    locustfile's --latscope-*), spelled in full (argparse would take a prefix), with valid values."""
    probe = locust_probe()
    unknown = [opt for opt in options(argv) if opt not in probe["options"]]
    assert not unknown, f"locust -f {LOCUSTFILE.name} has no option {', '.join(unknown)}"
    error = probe["errors"][[param.values[0] for param in locust_commands()].index(argv)]
    assert error is None, f"locust {shlex.join(argv)}: {error}"


@needs_locust
def test_operator_locustfile_is_latscopes() -> None:
    """The operator's locustfile, `from latscope.distributed.locustfile import *`, is the bundled one
    (`latscope locustfile`), and the star import brings every User and shape class Locust looks for
    (a class left out of __all__, or named with a leading underscore, would not be)."""
    probe = locust_probe()
    assert Path(probe["file"]) == LOCUSTFILE
    assert probe["bundled"], "the locustfile defines no User class"
    missing = sorted(set(probe["bundled"]) - set(probe["star_import"]))
    assert not missing, f"`{LOCUSTFILE_IMPORT}` leaves out {', '.join(missing)}: Locust would not find it"


def test_operator_locusttest() -> None:
    """The LocustTest: latscope's locustfile, as many workers as the master expects, a scenario the
    image has that validates with the --latscope-set overrides and loads the target Service."""
    test = operator_locusttest()
    namespace = k8s_object("Namespace", "latscope")["metadata"]["name"]
    assert (test["apiVersion"], test["kind"]) == ("locust.cloud/v1", "LocustTest")
    assert test["metadata"]["namespace"] == namespace
    spec = test["spec"]
    assert spec["locustfile"]["content"].strip() == LOCUSTFILE_IMPORT
    args = shlex.split(spec["args"])
    assert spec["workers"] == int(option_value(args, "--expect-workers"))

    path = option_value(args, "--latscope-scenario")
    assert path is not None, "no --latscope-scenario"
    scenario_file = repo_file_in_image(path)
    assert scenario_file is not None and scenario_file.is_file(), f"{path}: not in the image"
    scenario = load_scenario(scenario_file, tuple(option_values(args, "--latscope-set")))
    assert scenario.target.launch is None
    url = urlsplit(scenario.target.url)
    assert url.hostname == "target" and url.port == service_target_port("target")[0]
