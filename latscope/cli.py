"""The `latscope` command. Turns flags into calls; errors are caught here, once, and mapped to
exit codes: 0 ok, 1 the run failed, was cut short or had no request succeed, 2 bad input (scenario, flags)."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click
import numpy as np
from rich.console import Console
from rich.markup import escape

from latscope import __version__
from latscope.errors import LatscopeError, ResultsError, RunError, ScenarioError

if TYPE_CHECKING:
    from latscope.scenario import Scenario

EXIT_OK, EXIT_RUN_ERROR, EXIT_BAD_INPUT = 0, 1, 2
# `latscope gate` (and `run --gate`): 0 pass, 1 SLO breach, 2 usage error, 3 regression against the
# baseline, 4 inconclusive (too few samples, too noisy) or invalid measurement (generator fell behind).
EXIT_SLO_BREACH, EXIT_REGRESSION, EXIT_INCONCLUSIVE = 1, 3, 4
GATE_EXIT = {"pass": EXIT_OK, "slo_breach": EXIT_SLO_BREACH, "regression": EXIT_REGRESSION,
             "inconclusive": EXIT_INCONCLUSIVE, "invalid": EXIT_INCONCLUSIVE}


def _fail(message: str, code: int, scenario: Scenario | None = None) -> None:
    """Print the error and exit. The message may quote a target (its log's last lines): printed as
    text, not markup, and without the scenario's secrets."""
    if scenario is not None:
        from latscope.scenario import scrub, secret_values

        message = scrub(message, secret_values(scenario))
    Console(stderr=True).print(f"[bold red]error:[/] {escape(message)}", highlight=False, markup=True, soft_wrap=True)
    sys.exit(code)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="latscope")
def main() -> None:
    """Open-loop load testing and latency observability for inference endpoints."""


_set_option = click.option(
    "--set", "overrides", multiple=True, metavar="KEY=VALUE",
    help="Override a scenario field, e.g. --set phases.0.arrival.rate=50 (repeatable).",
)


def _gate_options(f):
    """--baseline, --slo, --junit, --markdown: shared by `gate` and `run --gate`."""
    for option in reversed((
        click.option("--baseline", type=click.Path(exists=True, file_okay=False, path_type=Path),
                     help="Results (or saved baseline) directory to compare against."),
        click.option("--slo", "slo_file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
                     help="Gate file: SLOs (replacing the scenario's) and the regression policy."),
        click.option("--junit", type=click.Path(dir_okay=False, path_type=Path), help="Write JUnit XML, one testcase per check."),
        click.option("--markdown", type=click.Path(dir_okay=False, path_type=Path), help="Write a Markdown summary (e.g. for $GITHUB_STEP_SUMMARY)."),
    )):
        f = option(f)
    return f


def _run_gate(results_dir: Path, baseline: Path | None, slo_file: Path | None, junit: Path | None, markdown: Path | None) -> int:
    """Evaluate the gate, print why, write the requested reports; the exit code."""
    import os

    from latscope.api import open_results
    from latscope.scenario.gate_file import load_gate_file
    from latscope.report.gate_output import github_annotations, junit_xml, markdown as gate_markdown, text_table

    try:
        gate_file = load_gate_file(slo_file)  # first: a bad gate file is reported before a bad directory
        result = open_results(results_dir).gate(baseline, gate_file)  # a capacity directory is gated on its answer
    except (ScenarioError, ResultsError) as exc:
        _fail(str(exc), EXIT_BAD_INPUT)
    click.echo(text_table(result))
    if junit:
        junit.write_text(junit_xml(result))
    if markdown:
        markdown.write_text(gate_markdown(result))
    if os.environ.get("GITHUB_ACTIONS") == "true":
        for line in github_annotations(result):
            click.echo(line)
    return GATE_EXIT[result.outcome]


@main.command()
@click.argument("results_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@_gate_options
def gate(results_dir: Path, baseline: Path | None, slo_file: Path | None, junit: Path | None, markdown: Path | None) -> None:
    """Pass or fail RESULTS_DIR: validity, SLOs, and p50/p99 regressions against --baseline.

    A capacity directory (`latscope capacity`) is gated on its answer: min_capacity_rps in the --slo
    file, and a regression only when its bracket is wholly below a --baseline capacity directory's.

    Exit codes: 0 pass, 1 SLO breach, 2 usage error, 3 regression, 4 inconclusive or invalid measurement."""
    sys.exit(_run_gate(results_dir, baseline, slo_file, junit, markdown))


@main.group()
def baseline() -> None:
    """Keep a small copy of a run to gate later runs against."""


@baseline.command("save")
@click.argument("results_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("path", type=click.Path(file_okay=False, path_type=Path))
@click.option("--metric", "metrics", multiple=True, help="Keep only these metrics' histograms (repeatable; default: all).")
def baseline_save(results_dir: Path, path: Path, metrics: tuple[str, ...]) -> None:
    """Copy RESULTS_DIR's summary.json, scenario.yaml and histograms.hlog to PATH (small enough for a repo)."""
    from latscope.results import save_baseline

    try:
        size = save_baseline(results_dir, path, metrics or None)
    except FileNotFoundError as exc:
        _fail(f"{exc.filename}: not found — is {results_dir} a latscope results directory?", EXIT_BAD_INPUT)
    click.echo(f"baseline saved to {path} ({size / 1024:.0f} KiB)")


@main.command()
@click.argument("scenario_file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), help="Results directory (default: output.dir/<scenario>-<UTC time>).")
@_set_option
@click.option("--workers", type=click.IntRange(min=1), help="Worker processes (default: one per CPU core, less those target.launch.cpus keeps for the target).")
@click.option("--quiet", is_flag=True, help="No live progress.")
@click.option("--gate", "run_gate", is_flag=True, help="Gate the run at the end (exit codes as `latscope gate`).")
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=None,
              help="Serve live Prometheus metrics on this port during the run (0: a free one; the URL is printed).")
@click.option("--metrics-host", default="127.0.0.1", show_default=True,
              help="Address of the live metrics endpoint. Binding anything but loopback exposes the run's "
                   "data (rates, latencies, scenario name) to the network, without authentication.")
@_gate_options
@click.option("--distributed", is_flag=True,
              help="Drive the run from Locust workers on other machines (`latscope worker`); this machine is the master.")
@click.option("--expect-workers", type=click.IntRange(min=1), default=1, show_default=True,
              help="--distributed: start once this many workers have joined (later ones are refused).")
@click.option("--bind", default="127.0.0.1:5557", show_default=True,
              help="--distributed: the Locust master's HOST:PORT (0.0.0.0 to accept workers from other machines; port 0: any).")
@click.option("--workers-wait", type=click.FloatRange(min=1), default=120.0, show_default=True,
              help="--distributed: seconds to wait for the workers before giving up (exit 1).")
@click.option("--on-node-loss", type=click.Choice(["abort", "continue"]), default="abort", show_default=True,
              help="--distributed: a lost worker ends the run (partial results), or the run goes on without it (stamped invalid).")
@click.option("--master-timeout", type=click.FloatRange(min=1), default=5.0, show_default=True,
              help="--distributed: a worker that hears nothing from the master this long stops sending.")
@click.option("--relay-fd", type=int, hidden=True)  # the coordinator, started by the Locust master's relay
def run(scenario_file: Path, out: Path | None, overrides: tuple[str, ...], workers: int | None, quiet: bool,
        run_gate: bool, metrics_port: int | None, metrics_host: str, baseline: Path | None, slo_file: Path | None,
        junit: Path | None, markdown: Path | None, distributed: bool, expect_workers: int, bind: str,
        workers_wait: float, on_node_loss: str, master_timeout: float, relay_fd: int | None) -> None:
    """Run SCENARIO_FILE and write a results directory."""
    from latscope.interrupt import BEFORE_START, Interrupted, guarded

    console = Console() if sys.stdout.isatty() else Console(width=120)  # logs: no 80-column wrapping
    scenario = None
    make_pool = None
    try:
        with guarded() as stop:  # the whole command, the imports too (latscope.interrupt)
            from latscope.api import load_scenario, run_scenario
            from latscope.console import ProgressDisplay, print_summary

            scenario = load_scenario(scenario_file, overrides)
            if distributed and relay_fd is None:
                _exec_master(scenario_file, out, overrides, workers, expect_workers, bind, workers_wait, on_node_loss,
                             master_timeout)
            if relay_fd is not None:
                from latscope.distributed.launch import remote_pool

                make_pool = remote_pool(relay_fd, scenario_file, overrides, expect=expect_workers,
                                        on_node_loss=on_node_loss, master_timeout_s=master_timeout)
            with ProgressDisplay(console, enabled=not quiet) as display:
                result = run_scenario(scenario, out=out, workers=workers, on_progress=display,
                                      metrics_port=metrics_port, metrics_host=metrics_host, stop=stop,
                                      make_pool=make_pool)
    except Interrupted:  # a signal before the results directory: there is nothing to keep
        _fail(BEFORE_START, EXIT_RUN_ERROR)
    except ScenarioError as exc:
        _fail(str(exc), EXIT_BAD_INPUT)
    except (RunError, LatscopeError) as exc:
        _fail(str(exc), EXIT_RUN_ERROR, scenario)
    print_summary(console, result.summary, result.path)
    _print_run_explanation(console, result.path)
    if (result.path / "report.html").exists():
        console.print(f"report: {result.path / 'report.html'}", highlight=False, soft_wrap=True)
    if run_gate:
        sys.exit(_run_gate(result.path, baseline, slo_file, junit, markdown))  # a partial run gates as invalid (4)
    from latscope.analysis.verdicts import measured_nothing

    # a run that measured no successful request measured no latency: a failed run (its reasons printed above)
    sys.exit(EXIT_RUN_ERROR if result.partial or measured_nothing(result.summary["requests"]) else EXIT_OK)


# `latscope run` options the Locust master's coordinator gets as they were given (--latscope-run-args)
_COORDINATOR_PARAMS = ("quiet", "run_gate", "metrics_port", "metrics_host", "baseline", "slo_file", "junit", "markdown")


def _exec_master(scenario_file: Path, out: Path | None, overrides: tuple[str, ...], workers: int | None, expect: int,
                 bind: str, workers_wait: float, on_node_loss: str, master_timeout: float) -> None:
    """`run --distributed`: become the Locust master (distributed/launch.py); the scenario was checked."""
    from latscope.distributed.launch import exec_locust, master_argv

    if workers is not None:
        raise click.UsageError("--workers is for a run on this machine; with --distributed each worker's "
                               "engines are `latscope worker --engines N`")
    ctx = click.get_current_context()
    passed = []
    for param in ctx.command.params:
        if param.name in _COORDINATOR_PARAMS and (value := ctx.params[param.name]) is not None and value is not False:
            passed += [param.opts[0]] if param.is_flag else [param.opts[0], str(value)]
    try:
        exec_locust(master_argv(scenario_file.absolute(), expect=expect, bind=bind, on_node_loss=on_node_loss,
                                workers_wait_s=workers_wait, master_timeout_s=master_timeout, overrides=overrides,
                                out=out.absolute() if out else None, run_args=passed))
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None


@main.command()
@click.option("--master-host", required=True, help="The machine running `latscope run … --distributed`.")
@click.option("--master-port", type=click.IntRange(1, 65535), default=5557, show_default=True)
@click.option("--engines", type=click.IntRange(min=1), help="Engine processes on this machine (default: one per CPU core).")
def worker(master_host: str, master_port: int, engines: int | None) -> None:
    """Lend this machine to a distributed run: a Locust worker whose engines send its share of the plan.

    Start it before or after the master; it waits for the master, takes part in one run and exits. It
    stops sending when it hears nothing from the master for the master's --master-timeout."""
    from latscope.distributed.launch import exec_locust, worker_argv

    try:
        exec_locust(worker_argv(master_host, master_port, engines))
    except RunError as exc:
        _fail(str(exc), EXIT_RUN_ERROR)


@main.command()
def locustfile() -> None:
    """Print the path of latscope's locustfile, for plain `locust -f … --master/--worker`, compose or Kubernetes."""
    from latscope.distributed.launch import locustfile_path

    click.echo(str(locustfile_path()))


class _DurationType(click.ParamType):
    """A duration as a scenario writes one: 30s, 2m, 500ms or a number of seconds."""

    name = "duration"

    def convert(self, value, param, ctx):  # noqa: ANN001 - click's signature
        from pydantic import TypeAdapter, ValidationError

        from latscope.scenario import PositiveDuration

        try:
            return TypeAdapter(PositiveDuration).validate_python(value)
        except ValidationError as exc:
            self.fail(f"{value!r}: {exc.errors()[0]['msg']}", param, ctx)


@main.command()
@click.argument("scenario_file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--out", type=click.Path(file_okay=False, path_type=Path),
              help="Capacity directory (default: output.dir/<scenario>-capacity-<UTC time>).")
@click.option("--precision", type=click.FloatRange(0, 1, min_open=True, max_open=True), default=0.05, show_default=True,
              help="Stop when the bracket [highest confident pass, lowest confident fail] is this narrow, relative to its lower end.")
@click.option("--min-rate", type=click.FloatRange(0, min_open=True), help="First step's rate, req/s (default: the scenario's).")
@click.option("--max-rate", type=click.FloatRange(0, min_open=True), help="No step above this rate, req/s.")
@click.option("--max-steps", type=click.IntRange(min=1), default=12, show_default=True, help="Most steps to run.")
@click.option("--step-duration", type=_DurationType(), help="Measured phases' duration per step, e.g. 30s (default: as written).")
@click.option("--confidence", type=click.FloatRange(0.5, 1, max_open=True), default=0.95, show_default=True,
              help="Two-sided level of each SLO statistic's confidence interval.")
@click.option("--price-per-hour", type=click.FloatRange(0, min_open=True),
              help="The endpoint's price per hour (e.g. its GPU hours): cost per 1,000 requests and per 1M output tokens.")
@_set_option
@click.option("--workers", type=click.IntRange(min=1), help="Worker processes per step (default: one per CPU core, less those target.launch.cpus keeps for the target).")
@click.option("--quiet", is_flag=True, help="Only a line per step.")
def capacity(scenario_file: Path, out: Path | None, precision: float, min_rate: float | None, max_rate: float | None,
             max_steps: int, step_duration: float | None, confidence: float, price_per_hour: float | None,
             overrides: tuple[str, ...], workers: int | None, quiet: bool) -> None:
    """Find the highest rate at which every SLO of SCENARIO_FILE holds with confidence.

    Runs the scenario's traffic shape scaled up and down (double until a step fails, then bisect),
    each step an ordinary results directory under OUT/steps/ (an undecided step is extended, up to
    twice, and judged on its pooled looks), and writes OUT/capacity.json and OUT/capacity.html.
    Exit codes: 0 capacity found (or at least the confident lower end, the SLOs undecided above it),
    1 the SLOs fail even at the lowest rate, or the target stopped answering, 2 bad input, 4 stopped
    without an answer (generator limit, inconclusive, --max-steps, interrupted)."""
    from latscope.api import find_capacity, load_scenario
    from latscope.console import CapacityDisplay, print_capacity

    console = Console() if sys.stdout.isatty() else Console(width=120)
    options = dict(precision=precision, min_rate=min_rate, max_rate=max_rate, max_steps=max_steps,
                   step_duration_s=step_duration, confidence=confidence, price_per_hour=price_per_hour, workers=workers)
    scenario = None
    try:
        scenario = load_scenario(scenario_file, overrides)
        with CapacityDisplay(console, live=not quiet) as display:
            found = find_capacity(scenario, out=out, on_step=display.on_step, on_progress=display, **options)
    except ScenarioError as exc:
        _fail(str(exc), EXIT_BAD_INPUT)
    except LatscopeError as exc:
        _fail(str(exc), EXIT_RUN_ERROR, scenario)
    print_capacity(console, found.document, found.path)
    sys.exit(found.exit_code)


@main.command()
@click.argument("scenario_file", type=click.Path(dir_okay=False, path_type=Path))
@_set_option
def validate(scenario_file: Path, overrides: tuple[str, ...]) -> None:
    """Check SCENARIO_FILE and show what it would send."""
    from latscope.plan import action_times, build_plan
    from latscope.scenario import load_scenario, scrub, secret_values
    from latscope.scenario.redact import redact_url  # a URL's password and api_key=... stay off the screen
    from latscope.workload import Payloads

    try:
        scenario = load_scenario(scenario_file, overrides)
        plan = build_plan(scenario)
        Payloads(scenario)  # datasets and tensor files load
    except ScenarioError as exc:
        _fail(str(exc), EXIT_BAD_INPUT)
    click.echo(f"{scenario_file}: ok — scenario {scenario.name!r}, target {scenario.target.protocol} {redact_url(scenario.target.url)}")
    for i, p in enumerate(plan.phases):
        n = int(((plan.offsets_s >= p.start_s) & (plan.offsets_s < p.start_s + p.duration_s)).sum())
        if scenario.phases[i].arrival.type == "users":
            click.echo(f"  phase {p.name:<16} {p.duration_s:8.1f} s  {n:>9,} users     closed loop: the server's speed decides "
                       "how many requests" + ("  (warm-up)" if p.warmup else ""))
            continue
        click.echo(f"  phase {p.name:<16} {p.duration_s:8.1f} s  {n:>9,} {'arrivals' if plan.turns is not None else 'requests'}"
                   f"  {n / p.duration_s if p.duration_s else 0:9.1f}/s" + ("  (warm-up)" if p.warmup else ""))
    click.echo(f"  total            {plan.duration_s:8.1f} s  {int(plan.planned_requests.sum()):>9,} requests planned")
    if plan.turns is not None and len(plan.turns):
        t = plan.turns
        later_think = np.delete(t.think_s, t.first)  # a first turn has none
        think = f", think time p50 {np.median(later_think):.2f} s" if len(later_think) else ""
        click.echo(f"  sessions         {len(t):>9,} open-loop sessions, {len(t.prompt_tokens):,} turns (mean "
                   f"{t.count.mean():.1f} a session){think}")
    for i, name in enumerate(plan.class_names):
        e, mine = scenario.endpoint(i), plan.cls == i
        click.echo(f"  class {name:<16} {mine.mean() if len(plan) else 0:8.1%}  {e.protocol} {e.method} {redact_url(e.url)}{e.path}"
                   + (f"  model {e.model}" if e.model else ""))
        for label, lengths in (("prompt tokens", plan.prompt_tokens[mine]), ("output tokens", plan.output_tokens[mine])):
            if lengths.any():
                p50, p99 = np.percentile(lengths, [50, 99])
                click.echo(f"        {label}: min {lengths.min()}, p50 {p50:.0f}, p99 {p99:.0f}, max {lengths.max()}")
    secrets = secret_values(scenario)
    for action, at in zip(scenario.actions, action_times(scenario, plan)):
        what = {"command": lambda a: f"command {a.command if isinstance(a.command, str) else shlex.join(a.command)}",
                "http": lambda a: f"http {a.http.method} {redact_url(a.http.url)}", "restart": lambda a: "restart the launched target"}
        line = scrub(what[action.kind](action), secrets)  # a token from ${ENV} in a command line stays off the screen
        click.echo(f"  action {action.name:<15} at {at:7.1f} s  {line}")


@main.command("agent-trace")
@click.argument("scenario_file", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("out_file", type=click.Path(dir_okay=False, path_type=Path))
@_set_option
def agent_trace(scenario_file: Path, out_file: Path, overrides: tuple[str, ...]) -> None:
    """Write the agent jobs SCENARIO_FILE would send to OUT_FILE, an agent trace (JSON lines) that
    `arrival: {type: trace, format: agents}` replays (docs/agents.md)."""
    from latscope.scenario import load_scenario
    from latscope.trace_writer import write_trace

    try:
        scenario = load_scenario(scenario_file, overrides)
        if not any(c.agent is not None for c in scenario.workload.effective_classes()):
            raise ScenarioError(f"{scenario_file}: no workload class has an `agent:`: there are no jobs to write")
        jobs = write_trace(scenario, out_file)
    except ScenarioError as exc:
        _fail(str(exc), EXIT_BAD_INPUT)
    except OSError as exc:
        _fail(f"cannot write {out_file}: {exc}", EXIT_BAD_INPUT)
    click.echo(f"{out_file}: {jobs:,} agent jobs")


@main.command("weka-trace")
@click.argument("source", type=click.Path(exists=True, path_type=Path))
@click.argument("out_file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--rate", type=click.FloatRange(min=0, min_open=True), default=1.0, show_default=True,
              help="job starts a second (Poisson): the format records none")
@click.option("--seed", type=int, default=0, show_default=True, help="of the job starts")
def weka_trace(source: Path, out_file: Path, rate: float, seed: int) -> None:
    """Turn recorded agent sessions in the WEKA KV-cache-tester format (SOURCE: a .json file, a directory
    of them, or JSON lines) into an agent trace at OUT_FILE that `arrival: {type: trace, format: agents}`
    replays (docs/agents.md)."""
    from latscope.weka_trace import convert

    try:
        lines, dropped = convert(source, rate, seed)
        out_file.write_text("".join(line + "\n" for line in lines))
    except ScenarioError as exc:
        _fail(str(exc), EXIT_BAD_INPUT)
    except OSError as exc:
        _fail(f"cannot write {out_file}: {exc}", EXIT_BAD_INPUT)
    click.echo(f"{out_file}: {len(lines):,} agent jobs")
    for why, n in dropped.counts.items():
        click.echo(f"  left out: {n:,} {why}")


@main.command()
@click.argument("url", required=False)
@click.option("-o", "--out", "out_file", type=click.Path(dir_okay=False, path_type=Path), default="latscope.yaml",
              show_default=True, help="The scenario file to write.")
@click.option("--use-case", metavar="NAME", help="Start from a use-case preset (fraud_scoring, streaming_chat, ...), "
              "pointed at URL.")
@click.option("--protocol", type=click.Choice(["openai", "openai-responses", "anthropic-messages", "openai-embeddings",
                                              "rerank", "kserve-v2", "kserve-v2-grpc", "http"]),
              help="The protocol to write, when the endpoint speaks several (the reference server: openai and "
              "kserve-v2) or was not to be probed; openai-responses, anthropic-messages, openai-embeddings and rerank "
              "are written for a server that answers as OpenAI-compatible. Without a URL: what the reference server "
              "is sent (default openai).")
@click.option("--model", help="The model to send requests to (default: the first the server lists).")
@click.option("--force", is_flag=True, help="Overwrite the file if it exists.")
def init(url: str | None, out_file: Path, use_case: str | None, protocol: str | None, model: str | None,
         force: bool) -> None:
    """Write a commented starter scenario for the endpoint at URL.

    URL is probed with short requests (2 s each, to that host and port only): OpenAI's GET
    /v1/models, KServe v2's GET /v2/health/ready, /v2, /v2/models and the model's metadata (its inputs); a
    grpc:// URL (or a port answering HTTP/2) is asked KServe v2 gRPC ServerMetadata and
    ModelMetadata; anything else that answers HTTP gets a plain-HTTP starter. The starter has a
    3 s warm-up, 30 s of Poisson traffic at a modest rate and placeholder SLOs; its first lines say
    what to change first. Without URL, the starter launches latscope's reference server.

    A dead port, a timeout or a port speaking something else is a warning, not an error: a
    plain-HTTP starter to URL is still written (exit 0). A user and password in URL are used for the
    probe only: the file reads them from $TARGET_USER and $TARGET_PASSWORD.

    Exit codes: 0 written (with or without a warning); 2 bad input (an unknown --use-case, a URL that
    is not http(s):// or grpc(s)://, the file exists without --force).
    """
    from latscope.init import check_options, check_out_file, make_starter, write_starter

    try:
        check_options(url, use_case, protocol, model)
        check_out_file(out_file, force)  # before probing: say it at once
        starter = make_starter(url, use_case=use_case, protocol=protocol, model=model, file_name=str(out_file))
        write_starter(starter, out_file, force=force)
    except ScenarioError as exc:
        _fail(str(exc), EXIT_BAD_INPUT)
    console = Console(stderr=True)
    if starter.warning:
        console.print(f"[bold yellow]warning:[/] {escape(starter.warning)}", highlight=False, soft_wrap=True)
    for note in starter.notes:
        click.echo(f"  {note}")
    click.echo(f"wrote {out_file}: {starter.protocol} to {starter.url}" + (f", model {starter.model}" if starter.model else ""))
    click.echo(f"next: edit what its first lines say to change, then\n  latscope validate {shlex.quote(str(out_file))}\n"
               f"  latscope run {shlex.quote(str(out_file))}")


def _print_run_explanation(console: Console, run_dir: Path) -> None:
    """The paragraph of the explain.json the run wrote (nothing when it could not write one)."""
    from latscope.console import print_explanation
    from latscope.results.reading import read_json

    try:
        doc = read_json(run_dir / "explain.json")
    except ResultsError:
        return
    if isinstance(doc, dict) and isinstance(doc.get("summary"), str):
        print_explanation(console, doc, table=False)


@main.command()
@click.argument("results_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--metric", help="The metric whose tail to explain: latency, ttft, service_time, ... (default: ttft "
              "for streams, else latency).")
@click.option("--quantile", type=click.FloatRange(0.5, 1, min_open=True, max_open=True), default=0.99,
              show_default=True, help="The tail is the requests above this quantile of the metric.")
@click.option("--json", "as_json", is_flag=True, help="Print explain.json's document instead of the paragraph and table.")
def explain(results_dir: Path, metric: str | None, quantile: float, as_json: bool) -> None:
    """Why the tail of RESULTS_DIR is what it is: its slowest requests against the middle half,
    ranked causes with their effect and evidence; writes RESULTS_DIR/explain.json.

    Exit codes: 0 explained (a cause found or nothing standing out), 2 bad input (not a results
    directory, no or a damaged requests.parquet, an unknown metric)."""
    from latscope.analysis.explain import explain_run, write_explain

    try:
        doc = explain_run(_results_dir(results_dir), metric, quantile)
        write_explain(results_dir, doc)
    except LatscopeError as exc:
        _fail(str(exc), EXIT_BAD_INPUT)
    except OSError as exc:  # a results directory that cannot be written
        _fail(f"cannot write {exc.filename or 'explain.json'}: {exc.strerror or exc}", EXIT_BAD_INPUT)
    if as_json:
        click.echo(json.dumps(doc, indent=2))
        return
    from latscope.console import print_explanation

    print_explanation(Console() if sys.stdout.isatty() else Console(width=120), doc)


@main.command()
def schema() -> None:
    """Print the scenario JSON Schema (for editor completion)."""
    from latscope.scenario import scenario_json_schema

    click.echo(json.dumps(scenario_json_schema(), indent=2))


def _results_dir(path: Path) -> Path:
    """`path` when it holds a results directory's summary.json; exit 2 with a clear message otherwise."""
    if not (path / "summary.json").is_file():
        what = "does not exist" if not path.exists() else "is not a results directory (it has no summary.json)"
        _fail(f"{path} {what}; give a directory written by `latscope run`, e.g. results/<scenario>-<time>/", EXIT_BAD_INPUT)
    return path


_cdn_option = click.option("--cdn", is_flag=True, help="Load plotly.js from its CDN (small file, needs the internet to view) instead of embedding it.")


@main.command()
@click.argument("results_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("-o", "--out", type=click.Path(dir_okay=False, path_type=Path), help="HTML file (default: RESULTS_DIR/report.html; the Markdown summary goes next to it).")
@_cdn_option
def report(results_dir: Path, out: Path | None, cdn: bool) -> None:
    """Write the HTML report and summary.md of RESULTS_DIR (of a capacity directory: its capacity.html)."""
    from latscope.analysis.capacity_gate import is_capacity_dir
    from latscope.api import open_results

    if is_capacity_dir(results_dir):
        if out is not None:  # its links to steps/ are relative: the page lives beside them
            _fail(f"{results_dir} is a capacity directory: its page is written as {results_dir}/capacity.html, next to "
                  "the steps it links to (leave out -o)", EXIT_BAD_INPUT)
        try:
            click.echo(f"capacity page: {open_results(results_dir).report(cdn=cdn)}")
        except LatscopeError as exc:
            _fail(str(exc), EXIT_BAD_INPUT)
        return
    try:
        html_path, md_path = open_results(_results_dir(results_dir)).report(out, cdn=cdn)
    except LatscopeError as exc:
        _fail(str(exc), EXIT_BAD_INPUT)
    except OSError as exc:  # -o in a folder that cannot be written, a full disk
        _fail(f"cannot write {exc.filename or 'the report'}: {exc.strerror or exc}", EXIT_BAD_INPUT)
    click.echo(f"report: {html_path}\nsummary: {md_path}")


@main.command()
@click.argument("base_dir", type=click.Path(file_okay=False, path_type=Path))
@click.argument("new_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("-o", "--out", type=click.Path(dir_okay=False, path_type=Path), help="HTML file (default: NEW_DIR/compare.html; a Markdown delta table goes next to it).")
@_cdn_option
def compare(base_dir: Path, new_dir: Path, out: Path | None, cdn: bool) -> None:
    """Compare two results directories: overlaid panels and percentile deltas."""
    from latscope.report import write_compare

    try:
        html_path, md_path = write_compare(_results_dir(base_dir), _results_dir(new_dir), out, cdn=cdn)
    except LatscopeError as exc:
        _fail(str(exc), EXIT_BAD_INPUT)
    except OSError as exc:  # -o in a folder that cannot be written, a full disk
        _fail(f"cannot write {exc.filename or 'the report'}: {exc.strerror or exc}", EXIT_BAD_INPUT)
    click.echo(f"comparison: {html_path}\nsummary: {md_path}")


if __name__ == "__main__":
    main()
