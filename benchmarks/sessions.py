"""What holding many chat sessions costs one latscope worker: memory and CPU per held session, and
the client's per-turn cost of carrying a long history.

    python benchmarks/sessions.py            # ~4 min
    python benchmarks/sessions.py --quick    # < 1 min: two smaller sizes, shorter think time, fewer repeats
    python benchmarks/sessions.py --agents   # agent jobs (issue 33): held per worker, a 100k-token context's cost

1. **Sessions held at once.** One worker (`run_scenario(..., workers=1)`, the real worker process)
   against `python -m latscope.targets.stream --ttft-ms 5 --itl-ms 5 --tokens 8` on 127.0.0.1. One
   workload class of chat sessions (`api: chat`, streamed, `history: carry`): T turns (default 3) of a
   16-token question and an 8-token answer, think time fixed (default 10 s). Session starts are open
   loop at rate r = N / ((T − 1) · think), so after a ramp of (T − 1) · think seconds N sessions are in
   progress — nearly all of them thinking (an answer takes ~45 ms of each ~10 s turn) — and stay so for
   the measured window; then the starts stop and an `idle` phase lets every session finish its turns.
   The worker process's VmRSS, CPU time (utime + stime) and run-queue wait are read from /proc every 0.1 s:
   - memory per held session = (median RSS over the window − RSS in the first 0.3 s after t0) / N, and,
     across sizes, the slope of steady RSS against N (fixed costs cancel);
   - CPU = worker CPU time over the window / its length, per 1,000 held sessions, and per turn sent
     (the window's turn rate is r · T); the timer is `coarse` (event-loop timers), since `precise`
     spins up to 1 ms before each send and would read ~100 % at these rates whatever the sessions cost;
   - send_lag p99, loop_lag p99 and gc_pause p99 come from the run's summary.json (whole run), and the
     sessions' fate from summary.json `sessions.chat` (every session started must be completed, none
     cut or abandoned, no errors).
   A control run (full mode) sends the largest size's turn rate as plain requests (no sessions), and a
   "long turns" run holds sessions whose questions are 2,000 tokens, so that memory per session with a
   bigger history shows.
   Two in-process checks say why. (a) The engine's state: sessions (2 turns, 2,000-token questions, 4 s
   think) through latscope's Engine run in this process as protocols.py runs one, against the same
   target, with a look at what it holds for sessions at three moments — turns waiting in `_later` and
   how many are prepared already, `_later_unprepared` and how many of its entries were sent already or
   belong to ended sessions, the bytes those keep alive, the prepare-cost estimate — and the send loop's
   naps per request (plain requests at the same rate for comparison, full mode). (b) What one held
   session is made of (tracemalloc, same scenario, same code: chat.Conversations.begin → the client's
   prepare → `_remember` of an 8-token answer → Conversations.after → prepare of the next turn, kept in
   a heap as the engine keeps it): its history, its next turn's request prepared ahead, the Python objects.
2. **Per-turn client cost of a long carried history.** OpenAIClient.prepare (the `encode` metric) and
   `_remember` called directly on one Conversation whose history grows turn by turn (32-token
   questions, ~1,000-token answers with some newlines and quotes to escape), at history sizes ~1k, 4k,
   16k and 32k tokens; next to the naive way, re-serializing every message with json.dumps (and
   orjson.dumps) each turn, and a plain copy of the history (`bytes(history)`). Medians of repeated
   calls; the bodies are checked to parse to the same document as the naive one.

Writes benchmarks/out/sessions-<time>.json and the "Sessions per worker (issue 17)" section of
benchmarks/RESULTS.md (other sections are kept). Linux only (/proc). All traffic stays on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import heapq
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO))

from common import (  # noqa: E402
    cpus, fmt, free_port, machine_facts, machine_line, markdown_table, median_ns, server_process, update_results_md,
    write_report_json,
)
from agent_costs import TOOLS, context_cost, context_table  # noqa: E402
import orjson  # noqa: E402

import numpy as np  # noqa: E402
import uvloop  # noqa: E402

from latscope.chat import Conversations  # noqa: E402
from latscope.engine import Engine, settle_gc  # noqa: E402
from latscope.intervals import IntervalRecorder  # noqa: E402
from latscope.plan import build_plan  # noqa: E402
from latscope.protocols import make_client  # noqa: E402
from latscope.protocols.openai import OpenAIClient  # noqa: E402
from latscope.records import Conversation, Outcome, Request  # noqa: E402
from latscope.run import Progress, run_scenario  # noqa: E402
from latscope.scenario import scenario_from_dict  # noqa: E402
from latscope.workload import Payloads  # noqa: E402

SECTION_TITLE = "## Sessions per worker (issue 17)"
AGENTS_TITLE = "## Agents per worker (issue 33)"
PACKAGES = ("latscope", "httptools", "uvloop", "numpy", "orjson")
CLASS = "chat"
QUESTION_TOKENS = 16
ANSWER_TOKENS = 8  # the stream target sends " tok0" … " tok7"
LONG_QUESTION_TOKENS = 2000
SAMPLE_S = 0.1
WORKER_CPU: int | None = None  # set by main: the worker's core (the target and this process share the other)
BASELINE_S = 0.3  # RSS over the first 0.3 s after t0 is the baseline


# -- /proc -----------------------------------------------------------------------------------------

TICK_S = 1 / os.sysconf("SC_CLK_TCK")


def rss_bytes(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def cpu_seconds(pid: int) -> float | None:
    """utime + stime of `pid`, in seconds."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) * TICK_S


def runqueue_wait_s(pid: int) -> float | None:
    """Time `pid` spent runnable but waiting for a CPU (/proc/<pid>/schedstat, 2nd field), in seconds."""
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


def worker_pid() -> int | None:
    """The latscope worker: the child of this process that multiprocessing spawned."""
    me = str(os.getpid())
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "stat").read_text().rsplit(")", 1)[1].split()[1] != me:
                continue
            if b"spawn_main" in (entry / "cmdline").read_bytes():
                return int(entry.name)
        except (OSError, IndexError):
            continue
    return None


class Sampler(threading.Thread):
    """Samples the worker's RSS and CPU time every SAMPLE_S; `on_progress` ties the samples to the run's
    clock (progress.elapsed_s is measured from t0 on perf_counter)."""

    def __init__(self, worker_cpu: int | None) -> None:
        super().__init__(daemon=True)
        self.worker_cpu = worker_cpu
        self.samples: list[tuple[int, int, float, float]] = []  # (perf_counter_ns, rss bytes, cpu s, run-queue wait s)
        self.t0_ns: int | None = None
        self.pid: int | None = None
        self.done = threading.Event()

    def on_progress(self, progress: Progress) -> None:
        if self.t0_ns is None and progress.elapsed_s > 0:
            self.t0_ns = time.perf_counter_ns() - int(progress.elapsed_s * 1e9)

    def run(self) -> None:
        while not self.done.wait(SAMPLE_S):
            if self.pid is None:
                self.pid = worker_pid()
                if self.pid is None:
                    continue
                if self.worker_cpu is not None:  # the worker gets a core of its own (it is found before it is ready)
                    os.sched_setaffinity(self.pid, {self.worker_cpu})
            rss, cpu, wait = rss_bytes(self.pid), cpu_seconds(self.pid), runqueue_wait_s(self.pid)
            if rss is None or cpu is None:
                self.pid = None  # gone (the run is over, or the next run's worker is not up yet)
                continue
            self.samples.append((time.perf_counter_ns(), rss, cpu, wait or 0.0))

    def between(self, start_s: float, end_s: float) -> list[tuple[float, int, float, float]]:
        """Samples at elapsed ∈ [start_s, end_s], as (elapsed s, rss, cpu, run-queue wait)."""
        assert self.t0_ns is not None, "no progress callback: the run's t0 is unknown"
        return [((t - self.t0_ns) / 1e9, *rest) for t, *rest in self.samples if start_s <= (t - self.t0_ns) / 1e9 <= end_s]


# -- 1. sessions held at once ------------------------------------------------------------------------


def hold_scenario(url: str, n: int, think_s: float, turns: int, window_s: float, out: Path, timer: str,
                  question_tokens: int = QUESTION_TOKENS, sessions: bool = True, agents: bool = False) -> dict:
    """N sessions in progress after a ramp of (turns − 1) · think_s, held for window_s, then drained.
    Without `sessions`: plain requests at the same turn rate (the control). With `agents`: agent jobs
    instead (rounds = turns, tool waits = think_s, tool results of question_tokens, agent_costs.TOOLS)."""
    ramp = (turns - 1) * think_s
    rate = n / ramp
    cls: dict = {"name": CLASS, "prompt_tokens": question_tokens, "output_tokens": ANSWER_TOKENS}
    if agents:
        cls["agent"] = {"rounds": turns, "tool_latency": think_s, "tools": TOOLS, "tool_result_tokens": question_tokens}
    elif sessions:
        cls["session"] = {"turns": turns, "think_time": think_s, "history": "carry"}
    if sessions:
        phases = [{"name": "hold", "duration": ramp + window_s, "arrival": {"type": "constant", "rate": rate}},
                  {"name": "finish", "duration": ramp + 1.0, "arrival": {"type": "idle"}}]
    else:
        phases = [{"name": "hold", "duration": window_s + 1.0, "arrival": {"type": "constant", "rate": rate * turns}}]
    return {
        "name": f"sessions-{n}" if sessions else f"plain-{n}",
        "seed": 17,
        "target": {"url": url, "protocol": "openai", "model": "bench", "timeout": 30,
                   "openai": {"api": "chat", "stream": True, "include_usage": True}},
        "workload": {"classes": [cls]},
        "phases": phases,
        "limits": {"max_in_flight": max(1024, n), "timer": timer},
        "output": {"dir": str(out), "report": False},
    }


def hold(url: str, n: int, think_s: float, turns: int, window_s: float, work: Path, timer: str,
         question_tokens: int = QUESTION_TOKENS, sessions: bool = True, agents: bool = False) -> dict:
    ramp = (turns - 1) * think_s if sessions else 1.0
    rate = n / ((turns - 1) * think_s)
    scenario = scenario_from_dict(hold_scenario(url, n, think_s, turns, window_s, work, timer, question_tokens, sessions,
                                                agents))
    sampler = Sampler(WORKER_CPU)
    sampler.start()
    started = time.monotonic()
    try:
        result = run_scenario(scenario, workers=1, on_progress=sampler.on_progress)
    finally:
        sampler.done.set()
        sampler.join()
    wall = time.monotonic() - started
    summary = result.summary
    base = [sample[1] for sample in sampler.between(0.0, BASELINE_S)]
    window = sampler.between(ramp + 1.0, ramp + window_s)  # the first second after the ramp left out
    after = sampler.between(ramp + window_s + ramp + 0.5, 1e9)  # once every session has finished
    steady_rss = statistics.median(sample[1] for sample in window)
    first = [sample[1] for sample in window if sample[0] <= window[0][0] + 1.0]
    last = [sample[1] for sample in window if sample[0] >= window[-1][0] - 1.0]
    growth = statistics.median(last) - statistics.median(first)  # with N held throughout: should be ~0
    (t_a, _, cpu_a, wait_a), (t_b, _, cpu_b, wait_b) = window[0], window[-1]
    cpu = (cpu_b - cpu_a) / (t_b - t_a)
    waited = (wait_b - wait_a) / (t_b - t_a)  # > a few %: something else took the worker's CPU
    turn_rate = rate * turns  # turns sent per second in the window (every session started sends its T turns)
    metric = summary["metrics"]
    p99 = lambda name, cls="all": metric.get(name, {}).get(cls, {}).get("p99_ms")  # noqa: E731
    fate = {k: v for k, v in summary.get("sessions", {}).get(CLASS, {}).items() if k not in ("by_turn", "duration", "prefix_cache")}
    if agents:
        fate = summary["agents"][CLASS]["jobs"]
    planned = int(round(rate * (ramp + window_s))) if sessions else 0
    row = {
        "kind": "agents" if agents else "sessions" if sessions else "plain requests (control)",
        "sessions_held": n if sessions else 0, "think_s": think_s, "turns": turns, "question_tokens": question_tokens,
        "start_rate": rate if sessions else 0.0, "turn_rate": turn_rate, "window_s": t_b - t_a,
        "rss_baseline_mb": statistics.median(base) / 2**20 if base else None, "rss_steady_mb": steady_rss / 2**20,
        "rss_window_growth_mb": growth / 2**20, "rss_after_mb": statistics.median(sample[1] for sample in after) / 2**20 if after else None,
        "bytes_per_session": (steady_rss - statistics.median(base)) / n if sessions and base else None,
        "cpu": cpu, "runqueue_wait": waited, "cpu_per_1000": cpu / (n / 1000) if sessions else None, "cpu_us_per_turn": cpu / turn_rate * 1e6,
        "send_lag_p99_ms": p99("send_lag"), "loop_lag_p99_ms": p99("loop_lag"), "gc_pause_p99_ms": p99("gc_pause"),
        "encode_p50_ms": metric.get("encode", {}).get("all", {}).get("p50_ms"),
        "requests": summary["requests"], "sessions": fate, "sessions_planned": planned,
        "all_completed": (fate.get("completed") == fate.get("started") == planned and not fate.get("cut")
                          and not fate.get("abandoned")) if sessions else None,
        "errors": summary["requests"]["errors"], "unaccounted": summary["requests"]["unaccounted"],
        "validity": summary["validity"], "validity_reasons": summary["validity_reasons"],
        "run_s": wall, "run_dir": str(result.run_dir),
    }
    return row


def anatomy(n: int, think_s: float, turns: int, question_tokens: int) -> dict:
    """What one held session is made of: N sessions built in this process as a worker holds them after
    their first answer, measured with tracemalloc (bytes allocated and still held, per session)."""
    spec = hold_scenario("http://127.0.0.1:9", n, think_s, turns, 0.0, Path(tempfile.gettempdir()), "coarse", question_tokens)
    scenario = scenario_from_dict(spec)
    plan = build_plan(scenario)
    client = OpenAIClient(scenario, [0], Payloads(scenario))
    cls_request = client._classes[0]
    answer = "".join(f" tok{i}" for i in range(ANSWER_TOKENS))  # what the stream target answers
    rows = int((plan.phase == 0).sum())  # the sessions started in the hold phase
    columns = [a[:rows].tolist() for a in ((plan.offsets_s * 1e9).astype("int64"), plan.cls, plan.warmup,
                                           plan.prompt_tokens, plan.output_tokens, plan.item)]
    gc.collect()
    objects_before = len(gc.get_objects())
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    t0 = time.perf_counter_ns()
    chat = Conversations(scenario, plan, t0, IntervalRecorder(plan.class_names))
    later: list = []  # the engine's `_later` heap
    for seq, (offset, c, warm, prompt, output, item) in enumerate(zip(*columns)):
        request = chat.begin(Request(seq, t0 + offset, c, warm, prompt, output, item))
        client.prepare(request)  # turn 1 goes out …
        OpenAIClient._remember(cls_request, request, answer)  # … and its answer joins the history
        follow = chat.after(request, Outcome(t0 + offset, t0 + offset + 45_000_000))
        client.prepare(follow)  # the engine prepares the next turn as soon as it has it
        heapq.heappush(later, (follow.intended_ns, follow.seq, follow))
        del request
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    objects = len(gc.get_objects()) - objects_before
    history = sum(len(state.conv.history) for state in chat._live.values())
    wire = sum(len(entry[2].wire) for entry in later)
    return {"sessions": rows, "question_tokens": question_tokens, "bytes_per_session": held / rows,
            "history_bytes": history / rows, "next_turn_wire_bytes": wire / rows,
            "other_bytes": (held - history - wire) / rows, "gc_objects_per_session": objects / rows}


class _CountingEngine(Engine):
    """latscope's Engine, counting its naps (the send loop's waits for the next intended time)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.naps = 0
        self.short_naps = 0  # asked for less than 0.5 ms: the event loop's timer fires them at its next turn

    async def _nap(self, seconds: float) -> None:
        self.naps += 1
        self.short_naps += seconds < 0.0005
        await super()._nap(seconds)


def _engine_state(engine: Engine, at_s: float) -> dict:
    """What the engine holds for sessions now: turns waiting in `_later` (and how many of them are already
    prepared, due how far ahead), `_later_unprepared` (and how many of its entries were sent already, or
    belong to sessions that have ended), the bytes those stale entries keep alive, the prepare-cost estimate."""
    now = time.perf_counter_ns()
    waiting = [entry[2] for entry in engine._later]
    waiting_ids = {id(r) for r in waiting}
    queue = list(engine._later_unprepared)
    live = engine.chat._live
    stale = [r for r in queue if id(r) not in waiting_ids]  # sent (or dropped) turns the deque still holds
    ended = {id(r.session): r.session for r in queue if r.session.id not in live}
    prepared_due = [(r.intended_ns - now) / 1e9 for r in waiting if r.wire is not None]
    return {"at_s": at_s, "waiting": len(waiting), "prepared": len(prepared_due),
            "prepared_due_in_s_median": statistics.median(prepared_due) if prepared_due else None,
            "unprepared_deque": len(queue), "deque_sent_already": len(stale), "deque_sessions_ended": len(ended),
            "stale_bytes": sum(len(r.wire or b"") for r in stale) + sum(len(c.history or b"") for c in ended.values()),
            "prepare_cost_us": engine._prepare_cost_ns / 1e3}


async def _engine_run(scenario, snapshots_s: list[float]) -> tuple[list[dict], dict]:
    """The scenario's plan through one Engine in this process, as a worker runs it (protocols.py does the
    same); engine state at `snapshots_s` after t0, and naps per request sent."""
    plan = build_plan(scenario)
    client = make_client(scenario)
    encode_ns: list[int] = []
    prepare = client.prepare

    def timed_prepare(request: Request) -> None:  # every prepare, ahead or at the send: what it took
        prepare(request)
        encode_ns.append(request.encode_ns)

    client.prepare = timed_prepare
    await client.open()
    t0 = time.perf_counter_ns() + 300_000_000
    engine = _CountingEngine(
        client, t0 + (plan.offsets_s * 1e9).astype(np.int64), np.arange(len(plan)), plan.cls, plan.warmup,
        (plan.prompt_tokens, plan.output_tokens, plan.item), plan.class_names, [], t0_ns=t0, interval_s=1.0,
        max_in_flight=scenario.limits.max_in_flight, overflow="queue", drain_timeout_s=10.0, report=lambda message: None,
        should_stop=lambda: False, precise_timer=scenario.limits.timer == "precise",
        sessions=(scenario, plan) if plan.turns is not None else None)
    states: list[dict] = []

    async def snapshots() -> None:
        for at_s in snapshots_s:
            await asyncio.sleep(max(0.0, (t0 + int(at_s * 1e9) - time.perf_counter_ns()) / 1e9))
            states.append(_engine_state(engine, at_s))

    settle_gc()  # as in a worker
    watcher = asyncio.create_task(snapshots()) if engine.chat is not None else None
    try:
        await engine.run()
    finally:
        await client.close()
        if watcher is not None:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
    return states, {"sent": engine.sent, "naps_per_request": engine.naps / max(1, engine.sent),
                    "short_naps_per_request": engine.short_naps / max(1, engine.sent),
                    "prepare_cost_us_at_end": engine._prepare_cost_ns / 1e3,
                    "encode_p50_us": statistics.median(encode_ns) / 1e3 if encode_ns else 0.0,
                    "encode_max_us": max(encode_ns, default=0) / 1e3}


def engine_check(url: str, n: int, think_s: float, window_s: float, question_tokens: int, work: Path,
                 control: bool) -> dict:
    """Sessions (2 turns) through an in-process Engine, its state looked at during the run; with `control`,
    the same request rate as plain requests too (naps per request only)."""
    snapshots = [think_s / 2, think_s + window_s / 2, think_s + window_s - 0.5]
    spec = hold_scenario(url, n, think_s, 2, window_s, work, "coarse", question_tokens)
    states, totals = uvloop.run(_engine_run(scenario_from_dict(spec), snapshots))
    result = {"sessions_held": n, "think_s": think_s, "question_tokens": question_tokens, "states": states, **totals}
    if control:
        spec = hold_scenario(url, n, think_s, 2, window_s, work, "coarse", question_tokens, sessions=False)
        result["plain"] = uvloop.run(_engine_run(scenario_from_dict(spec), []))[1]
    return result


def sessions_held(args: argparse.Namespace, work: Path, server_cpu: int | None) -> tuple[list[dict], list[dict], dict]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    rows: list[dict] = []
    command = [sys.executable, "-m", "latscope.targets.stream", "--port", str(port), "--ttft-ms", "5", "--itl-ms", "5",
               "--tokens", str(ANSWER_TOKENS)]
    with server_process(command, f"{url}/health", work / "stream_target.log", server_cpu):
        for n in args.sizes:
            row = hold(url, n, args.think, args.turns, args.window, work, args.timer)
            rows.append(row)
            print_hold(row)
        if not args.quick:
            row = hold(url, max(args.sizes), args.think, args.turns, args.window, work, args.timer, sessions=False)
            rows.append(row)
            print_hold(row)
            row = hold(url, args.long_sessions, args.think, args.turns, args.window, work, args.timer,
                       question_tokens=LONG_QUESTION_TOKENS)
            rows.append(row)
            print_hold(row)
        print("the engine's state, in this process …", flush=True)
        check = engine_check(url, 1000 if args.quick else 2000, 4.0, 4.0 if args.quick else 6.0, LONG_QUESTION_TOKENS,
                             work, control=not args.quick)
        print(engine_table(check), flush=True)
    parts = [anatomy(max(args.sizes), args.think, args.turns, QUESTION_TOKENS)]
    if not args.quick:
        parts.append(anatomy(args.long_sessions, args.think, args.turns, LONG_QUESTION_TOKENS))
    return rows, parts, check


def print_hold(row: dict) -> None:
    fate = row["sessions"]
    print(f"  {row['kind']}: {row['sessions_held']:,} held ({row['question_tokens']}-token questions), "
          f"{row['turn_rate']:.0f} turns/s: RSS {fmt(row['rss_baseline_mb'], 1)} -> {row['rss_steady_mb']:.1f} MB "
          f"({fmt(row['bytes_per_session'] and row['bytes_per_session'] / 1024, 2)} KiB/session), CPU {row['cpu']:.0%} "
          f"({row['cpu_us_per_turn']:.0f} µs/turn, waited for a CPU {row['runqueue_wait']:.0%}), send lag p99 {fmt(row['send_lag_p99_ms'], 3)} ms, loop lag p99 "
          f"{fmt(row['loop_lag_p99_ms'], 3)} ms; sessions {fate}; errors {row['errors']}; {row['run_s']:.0f} s", flush=True)


# -- 2. per-turn cost of a long carried history ---------------------------------------------------


HISTORY_TARGETS = (1_000, 4_000, 16_000, 32_000)
TURN_QUESTION_TOKENS = 32
TURN_ANSWER_TOKENS = 1_000


def _answer(payloads: Payloads, k: int) -> str:
    """~1,000 tokens of answer text, with a line break every 40 words and a quoted word now and then
    (JSON has to escape them, as it would a real answer)."""
    words = payloads.synthetic_prompt(TURN_ANSWER_TOKENS, 7919 * k).split(" ")
    for i in range(0, len(words), 40):
        words[i] = words[i] + "\n"
    for i in range(17, len(words), 97):
        words[i] = f'"{words[i]}"'
    return " ".join(words)


def history_cost(reps: int) -> list[dict]:
    spec = {"name": "history", "seed": 17,
            "target": {"url": "http://127.0.0.1:9", "protocol": "openai", "model": "bench",
                       "openai": {"api": "chat", "stream": True, "include_usage": True}},
            "workload": {"classes": [{"name": CLASS, "prompt_tokens": TURN_QUESTION_TOKENS,
                                      "output_tokens": TURN_ANSWER_TOKENS,
                                      "session": {"turns": 64, "think_time": 1, "history": "carry"}}]},
            "phases": [{"name": "p", "duration": 1, "arrival": {"type": "constant", "rate": 1}}]}
    scenario = scenario_from_dict(spec)
    payloads = Payloads(scenario)
    client = OpenAIClient(scenario, [0], payloads)
    cls_request = client._classes[0]
    conv = Conversation(0, 0, True, -1, 64, 0)
    messages: list[dict] = []  # the naive way: every message kept as a dict, the whole body dumped each turn
    rest = {"max_tokens": TURN_ANSWER_TOKENS, "stream": True, "stream_options": {"include_usage": True}}
    history_tokens = 0
    targets = list(HISTORY_TARGETS)
    rows = []
    k = 0
    while targets:
        k += 1
        request = Request(k, 0, 0, False, TURN_QUESTION_TOKENS, TURN_ANSWER_TOKENS, 104729 * k, turn=k, session=conv)
        if history_tokens >= targets[0]:
            targets.pop(0)
            prepare_ns: list[int] = []
            mark = None if conv.history is None else len(conv.history)
            for _ in range(reps):  # a prepare adds the turn to the history: taken back after each of these
                client.prepare(request)
                prepare_ns.append(request.encode_ns)  # the `encode` metric, as the client records it
                if mark is None:
                    conv.history = None
                else:
                    del conv.history[mark:]
            client.prepare(request)
            question = payloads.get(request).prompt
            doc = {"model": "bench", "messages": [*messages, {"role": "user", "content": question}], **rest}
            dumps = lambda: json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()  # noqa: E731
            body = request.wire[request.wire.index(b"\r\n\r\n") + 4:]
            assert json.loads(body) == json.loads(dumps()), "the incremental body is not the naive one"
            history = conv.history
            rows.append({
                "turn": k, "history_tokens": history_tokens, "history_kib": len(history) / 1024,
                "body_kib": len(body) / 1024,
                "prepare_us": statistics.median(prepare_ns) / 1e3,
                "json_dumps_us": median_ns(dumps, reps) / 1e3,
                "orjson_dumps_us": median_ns(lambda: orjson.dumps(doc), reps) / 1e3,
                "copy_us": median_ns(lambda: bytes(history), reps) / 1e3,
            })
        if not (rows and rows[-1]["turn"] == k):  # (a measured turn was prepared above)
            client.prepare(request)
        question = payloads.get(request).prompt
        answer = _answer(payloads, k)
        started = time.perf_counter_ns()
        OpenAIClient._remember(cls_request, request, answer)
        remember_us = (time.perf_counter_ns() - started) / 1e3
        if rows and rows[-1]["turn"] == k:
            rows[-1]["remember_us"] = remember_us
        messages += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
        history_tokens += TURN_QUESTION_TOKENS + TURN_ANSWER_TOKENS
    return rows


# -- the report -------------------------------------------------------------------------------------


def hold_table(rows: list[dict]) -> str:
    return markdown_table(
        ["run", "sessions (jobs) held", "turns (rounds)/s", "worker RSS at t0 → held, MB", "KiB per held session",
         "RSS growth over the window, MB", "worker CPU",
         "CPU per 1,000 held", "CPU µs per turn", "worker waited for a CPU", "send lag p99 ms", "loop lag p99 ms", "gc pause p99 ms",
         "sessions started / completed (cut, abandoned)", "errors"],
        [[(r["kind"] if r["kind"] in ("sessions", "agents") else "plain requests, no sessions")
          + (f", {r['question_tokens']:,}-token questions" if r["question_tokens"] != QUESTION_TOKENS else ""),
          f"{r['sessions_held']:,}" if r["sessions_held"] else "–", f"{r['turn_rate']:,.0f}",
          f"{fmt(r['rss_baseline_mb'], 1)} → {r['rss_steady_mb']:.1f}",
          fmt(r["bytes_per_session"] / 1024 if r["bytes_per_session"] is not None else None, 2),
          f"{r['rss_window_growth_mb']:+.1f}",
          f"{r['cpu']:.0%}", f"{r['cpu_per_1000']:.1%}" if r["cpu_per_1000"] is not None else "–",
          f"{r['cpu_us_per_turn']:.0f}", f"{r['runqueue_wait']:.1%}", fmt(r["send_lag_p99_ms"], 3), fmt(r["loop_lag_p99_ms"], 3),
          fmt(r["gc_pause_p99_ms"], 3),
          (f"{r['sessions'].get('started', 0):,} / {r['sessions'].get('completed', 0):,} "
           f"({r['sessions'].get('cut', 0)}, {r['sessions'].get('abandoned', 0)})"
           + (" ✓" if r["all_completed"] else " ✗")) if r["kind"] in ("sessions", "agents") else "–",
          str(r["errors"])] for r in rows])


def engine_table(check: dict) -> str:
    table = markdown_table(
        ["s after t0", "turns waiting (`_later`)", "of them prepared", "median s until due", "`_later_unprepared` entries",
         "of them sent already", "sessions ended they keep", "MB they keep alive", "prepare-cost estimate µs"],
        [[f"{st['at_s']:g}", f"{st['waiting']:,}", f"{st['prepared']:,}", fmt(st["prepared_due_in_s_median"], 2),
          f"{st['unprepared_deque']:,}", f"{st['deque_sent_already']:,}", f"{st['deque_sessions_ended']:,}",
          f"{st['stale_bytes'] / 2**20:.1f}", f"{st['prepare_cost_us']:,.0f}"] for st in check["states"]])
    naps = (f"Prepares (ahead or at the send) took p50 {check['encode_p50_us']:.0f} µs, max {check['encode_max_us']:,.0f} µs. "
            f"Naps of the send loop per request sent: {check['naps_per_request']:.1f}, of which "
            f"{check['short_naps_per_request']:.1f} asked for < 0.5 ms")
    if "plain" in check:
        naps += (f"; plain requests at the same rate: {check['plain']['naps_per_request']:.1f}, of which "
                 f"{check['plain']['short_naps_per_request']:.1f} < 0.5 ms")
    return table + "\n\n" + naps + "."


def anatomy_table(parts: list[dict]) -> str:
    return markdown_table(
        ["sessions built", "question tokens", "bytes per session", "of which history", "next turn prepared (wire)",
         "Python objects and the rest", "gc-tracked objects per session"],
        [[f"{p['sessions']:,}", f"{p['question_tokens']:,}", f"{p['bytes_per_session']:,.0f}", f"{p['history_bytes']:,.0f}",
          f"{p['next_turn_wire_bytes']:,.0f}", f"{p['other_bytes']:,.0f}", f"{p['gc_objects_per_session']:.1f}"]
         for p in parts])


def history_table(rows: list[dict]) -> str:
    return markdown_table(
        ["turn", "history tokens", "history KiB", "body KiB", "prepare (`encode`) µs", "`_remember` µs",
         "copy of the history µs", "naive json.dumps µs", "naive orjson.dumps µs", "json.dumps / prepare"],
        [[str(r["turn"]), f"{r['history_tokens']:,}", f"{r['history_kib']:.0f}", f"{r['body_kib']:.0f}",
          f"{r['prepare_us']:.1f}", f"{r.get('remember_us', 0):.1f}", f"{r['copy_us']:.1f}", f"{r['json_dumps_us']:.0f}",
          f"{r['orjson_dumps_us']:.0f}", f"{r['json_dumps_us'] / r['prepare_us']:.0f}×"] for r in rows])


def slope(rows: list[dict]) -> float | None:
    """Bytes of steady RSS per extra held session, between the smallest and the largest size."""
    held = sorted((r for r in rows if r["kind"] == "sessions" and r["question_tokens"] == QUESTION_TOKENS),
                  key=lambda r: r["sessions_held"])
    if len(held) < 2:
        return None
    a, b = held[0], held[-1]
    return (b["rss_steady_mb"] - a["rss_steady_mb"]) * 2**20 / (b["sessions_held"] - a["sessions_held"])


def cpu_fit(rows: list[dict]) -> tuple[float, float]:
    """Worker CPU = fixed + µs per turn × turns/s, least squares over `rows` (fixed in cores, µs)."""
    if len(rows) < 2:
        return 0.0, rows[0]["cpu_us_per_turn"]
    slope_, fixed = np.polyfit([r["turn_rate"] for r in rows], [r["cpu"] for r in rows], 1)
    return float(fixed), float(slope_) * 1e6


def report_md(report: dict) -> str:
    a = report["args"]
    s = slope(report["hold"])
    short = [r for r in report["hold"] if r["kind"] == "sessions" and r["question_tokens"] == QUESTION_TOKENS]
    biggest = max(short, key=lambda r: r["sessions_held"])
    last = report["history"][-1]
    placement = ("The worker pinned to one core, the stream target and the run's parent process to the other."
                 if a["pin"] else "Processes placed by the kernel (the worker, the run's parent process, the stream target).")
    small = report["anatomy"][0]
    check = report["engine"]
    max_stale = max(check["states"], key=lambda st: st["stale_bytes"])
    fixed, per_turn_fit = cpu_fit(short)
    plain = next((r for r in report["hold"] if r["kind"] != "sessions"), None)
    plain_text = (f"Plain requests at {plain['turn_rate']:,.0f}/s (no sessions) took {plain['cpu']:.0%} "
                  f"({plain['cpu_us_per_turn']:.0f} µs each), sessions' turns at that rate {biggest['cpu']:.0%} "
                  f"({biggest['cpu_us_per_turn']:.0f} µs). " if plain else "")
    plain_naps = (f"; plain requests at the same rate {check['plain']['naps_per_request']:.1f}, "
                  f"{check['plain']['short_naps_per_request']:.1f} of them short" if "plain" in check else "")
    return f"""{SECTION_TITLE}

Run {report['date']} with `{report['command']}` on {machine_line(report['machine'])}; no GPU. {placement}
{report['run_s']:.0f} s in all; the machine is shared, so the worker's run-queue wait (time it was ready to run
but had no CPU, /proc/<pid>/schedstat) is shown: above a few % the lags say more about the machine than latscope.

**Sessions held at once by one worker** (`run_scenario(workers=1)` against `latscope.targets.stream --ttft-ms 5
--itl-ms 5 --tokens 8`; chat sessions of {a['turns']} turns, 16-token questions, 8-token answers, think time
{a['think']:g} s fixed, history carried; open-loop session starts at N / ({a['turns'] - 1} × {a['think']:g} s) per
second, so N sessions are in progress, nearly all thinking, for a {a['window']:g} s window after the ramp; timer
`{a['timer']}`). Memory = worker VmRSS, median over the window minus the first {BASELINE_S} s after t0, ÷ N; CPU =
worker utime + stime over the window (% of one core); lags from summary.json (whole run); sessions from
summary.json `sessions.chat`. Slope of held RSS against N between the smallest and the largest size:
**{fmt(s and s / 1024, 2)} KiB per session**.

{hold_table(report['hold'])}

**The engine's state, in this process** (one Engine run by this script as protocols.py does, against the same
target: {check['sessions_held']:,} sessions of 2 turns, {check['question_tokens']:,}-token questions, think {check['think_s']:g} s;
what it holds for sessions at three moments):

{engine_table(check)}

What one held session is made of (the same code in this process, tracemalloc, after turn 1's answer, the next
turn prepared and waiting in the heap as the engine keeps it):

{anatomy_table(report['anatomy'])}

**Per-turn client cost of a carried history** (one Conversation, 32-token questions, ~1,000-token answers; medians
of {a['reps']} calls; prepare = `OpenAIClient.prepare`, the `encode` metric; naive = `json.dumps` of every message as
a dict each turn):

{history_table(report['history'])}

What limits it, and what was found:

- **CPU: holding is free, the turns are not.** Waiting turns sit in one heap (`_later`) under one timer, so an idle
  session costs no CPU; the worker's CPU fits {fixed:.0%} of a core + {per_turn_fit:.0f} µs per turn sent (least squares
  over the sizes), i.e. N held sessions cost the turns they send, N / think × T / (T − 1) per second:
  {biggest['cpu']:.0%} of a core at {biggest['sessions_held']:,} held. {plain_text}At ~{per_turn_fit:.0f} µs per streamed
  8-token turn one worker saturates its core near {1e6 / per_turn_fit:,.0f} turns/s, i.e. ~{1e6 / per_turn_fit * a['think'] * (a['turns'] - 1) / a['turns']:,.0f}
  sessions of {a['turns']} turns at {a['think']:g} s think time: with short histories that, not timers or memory, bounds
  sessions per worker here.
- **Memory: ~{small['bytes_per_session'] / 1024:.1f} KiB per short session** (tracemalloc: Conversation, _Live, the
  waiting Request, its heap entry, the history and the next turn once prepared); RSS says {fmt(s and s / 1024, 1)} KiB
  (slope), the rest being allocator slack and turns in flight. A long history is held once (the conversation's
  serialized history, which the next turn's body copies when it is prepared, within LOOKAHEAD_NS of its send):
  ~{last['body_kib']:.0f} KiB per session at {last['history_tokens']:,} tokens.
- **The look-ahead prepares session turns in their think time** (engine check above, {check['question_tokens']:,}-token
  questions, prepares ~{check['encode_p50_us']:.0f} µs at p50): the prepare-cost estimate was
  {' / '.join(f"{st['prepare_cost_us']:,.0f}" for st in check['states'])} µs at the three looks, the waiting turns
  prepared {' / '.join(f"{st['prepared']:,}" for st in check['states'])}, the `_later_unprepared` deque held
  {' / '.join(f"{st['deque_sent_already']:,}" for st in check['states'])} turns already sent and kept
  {max_stale['stale_bytes'] / 2**20:.1f} MB alive at most. The "RSS growth over the window" column (N held
  throughout) should be ~0.
- **The coarse timer polls the last half millisecond.** uvloop timers count whole milliseconds: one under 0.5 ms
  fires at the loop's next turn (asyncio.sleep(0.0003) returns after ~3 µs), so `_sleep_until` naps
  {check['naps_per_request']:.1f} times per request, {check['short_naps_per_request']:.1f} of them < 0.5 ms{plain_naps}.
- **Encode of a long history is a copy, not the bottleneck**: {last['prepare_us']:.0f} µs at {last['history_tokens']:,} tokens
  ({last['body_kib']:.0f} KiB body) against {last['json_dumps_us']:.0f} µs for json.dumps of the whole history each turn
  ({last['orjson_dumps_us']:.0f} µs with orjson); `_remember` costs ~{last.get('remember_us', 0):.0f} µs a turn whatever the
  history (the answer's JSON escaping).

JSON: `{report.get('json_file', '?')}`.
"""


def agents_main(args: argparse.Namespace, report: dict, server_cpu: int | None, started: float) -> None:
    """`--agents`: the per-round cost of a long context, then agent jobs held by one worker (as part 1,
    with agent jobs: rounds = --turns, tool waits = --think, 16-token tool results, 8 tools of 2,000
    schema tokens), and the RESULTS.md section."""
    print("per-round cost of an agent's context …", flush=True)
    report["context"] = context_cost(args.reps)
    print(context_table(report["context"]), flush=True)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "latscope.targets.stream", "--port", str(port), "--ttft-ms", "5", "--itl-ms", "5",
               "--tokens", str(ANSWER_TOKENS)]
    report["hold"] = []
    with tempfile.TemporaryDirectory(prefix="latscope-agents-") as tmp, \
            server_process(command, f"{url}/health", Path(tmp) / "stream_target.log", server_cpu):
        for n in args.sizes:
            for agents in (False, True):
                row = hold(url, n, args.think, args.turns, args.window, Path(tmp), args.timer, agents=agents)
                report["hold"].append(row)
                print_hold(row)
    report["run_s"] = time.monotonic() - started
    write_report_json(report, args.out, "agents")
    a, rows = report["args"], report["hold"]
    first, last = report["context"][0], report["context"][-1]
    by = {(r["kind"], r["sessions_held"]): r for r in rows}
    biggest = max(args.sizes)
    agent, chat = by[("agents", biggest)], by[("sessions", biggest)]
    text = f"""{AGENTS_TITLE}

Run {report['date']} with `{report['command']}` on {machine_line(report['machine'])}; no GPU.

**Agent jobs held at once by one worker**, beside chat sessions of the same shape (`run_scenario(workers=1)`
against `latscope.targets.stream --ttft-ms 5 --itl-ms 5 --tokens 8`, which answers text, so each round carries
the answer and a 16-token tool result as a user message; {a['turns']} rounds, tool waits {a['think']:g} s fixed;
the agents also send 8 tools of 2,000 schema tokens every round, ~14 KiB a request; timer `{a['timer']}`).
Measured as part 1 of the sessions benchmark (memory = worker VmRSS over the window minus its first
{BASELINE_S} s, ÷ N; CPU = worker utime + stime over the window):

{hold_table(rows)}

**Per-round client cost of an agent's context** (one job: a 64-token task, each round the model's answer of
20 words and a tool call with 200 words of arguments, and a 2,000-token tool result; 8 tools of 2,000 schema
tokens in every body; medians of {a['reps']} calls; prepare = `OpenAIClient.prepare`, the `encode` metric;
naive = `json.dumps` of every message as a dict each round):

{context_table(report['context'])}

- A {last['context_tokens']:,}-token context ({last['body_kib']:,.0f} KiB body) costs {last['prepare_us']:,.0f} µs a
  round to prepare against {first['prepare_us']:,.0f} µs at {first['context_tokens']:,} tokens: the round's own work (drawing
  and escaping its 2,000-token tool result, ~35 µs) plus copies of the kept context, never an encode of it.
  json.dumps of the whole history costs {last['json_dumps_us']:,.0f} µs; orjson.dumps {last['orjson_dumps_us']:,.0f} µs, of a
  document already built (building the dicts is not counted). `_remember` of the answer and its call costs
  ~{last.get('remember_us', 0):.0f} µs whatever the context.
- Held jobs at {biggest:,}: {agent['bytes_per_session'] / 1024 if agent['bytes_per_session'] else float('nan'):.1f} KiB each
  against {chat['bytes_per_session'] / 1024 if chat['bytes_per_session'] else float('nan'):.1f} KiB per chat session;
  worker CPU {agent['cpu_us_per_turn']:.0f} µs per round against {chat['cpu_us_per_turn']:.0f} µs per turn (the tools' ~14 KiB
  a body is built once per class and copied into each request).

JSON: `{report.get('json_file', '?')}`.
"""
    print(text)
    if not args.no_results_md:
        update_results_md(text, AGENTS_TITLE)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("--quick", action="store_true", help="two smaller sizes, 4 s think time, 2 turns (< 1 min)")
    parser.add_argument("--sizes", type=int, nargs="+", help="sessions held at once (default 1000 5000 10000; quick: 1000 2000)")
    parser.add_argument("--think", type=float, help="think time, s (default 10; quick: 4)")
    parser.add_argument("--turns", type=int, help="turns per session, >= 2 (default 3; quick: 2)")
    parser.add_argument("--window", type=float, help="measured window, s (default 10; quick: 4)")
    parser.add_argument("--long-sessions", type=int, default=1000, help="sessions held in the long-question run (default 1000)")
    parser.add_argument("--pin", action="store_true",
                        help="pin the worker to one core, the target and this process to the other (default: the kernel places them)")
    parser.add_argument("--timer", choices=("coarse", "precise"), default="coarse")
    parser.add_argument("--reps", type=int, help="repeats per measurement in part 2 (default 200; quick: 30)")
    parser.add_argument("--skip-hold", action="store_true", help="only part 2 (no server, no runs)")
    parser.add_argument("--agents", action="store_true",
                        help="agent jobs instead of chat sessions: held per worker, and the per-round cost of a context "
                             "up to 100k tokens (benchmarks/agent_costs.py); its own section of RESULTS.md")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "out")
    parser.add_argument("--no-results-md", action="store_true")
    args = parser.parse_args()
    defaults = ((1000, 2000), 4.0, 2, 4.0, 30) if args.quick else ((1000, 5000, 10000), 10.0, 3, 10.0, 200)
    args.sizes = args.sizes or list(defaults[0])
    args.think = args.think or defaults[1]
    args.turns = args.turns or defaults[2]
    args.window = args.window or defaults[3]
    args.reps = args.reps or defaults[4]
    if args.turns < 2:
        parser.error("--turns must be at least 2 (a session with one turn never thinks)")
    started = time.monotonic()
    report: dict = {"machine": machine_facts(PACKAGES), "quick": args.quick,
                    "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                    "command": " ".join(["python benchmarks/sessions.py", *sys.argv[1:]]),
                    "args": {k: v for k, v in vars(args).items() if k not in ("out",)}}
    global WORKER_CPU
    server_cpu = None
    if args.pin:
        WORKER_CPU, server_cpu = cpus()
        if server_cpu is not None:  # this process (the run's parent, the collector) beside the target; the worker alone
            os.sched_setaffinity(0, {server_cpu})
    if args.agents:
        return agents_main(args, report, server_cpu, started)
    print("per-turn cost of a carried history …", flush=True)
    report["history"] = history_cost(args.reps)
    print(history_table(report["history"]), flush=True)
    if args.skip_hold:
        return
    print("sessions held at once …", flush=True)
    with tempfile.TemporaryDirectory(prefix="latscope-sessions-") as tmp:
        report["hold"], report["anatomy"], report["engine"] = sessions_held(args, Path(tmp), server_cpu)
    report["run_s"] = time.monotonic() - started
    write_report_json(report, args.out, "sessions")
    text = report_md(report)
    print(text)
    if not args.no_results_md:
        update_results_md(text, SECTION_TITLE)


if __name__ == "__main__":
    main()
