"""An adapter mix against a loopback OpenAI-compatible server on which one model is slower: the
summary groups the classes by model (losslessly), the fairness line names the slow model with its
ratio, the console prints it and the report draws the Models panel; a run of one model has none."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from aiohttp import web
from rich.console import Console

from conftest import REPO, serve
from report_page import figure_array, page_figures, panel_section
from latscope.analysis.run_data import load_run
from latscope.console import print_summary
from latscope.report.compare import compare_html
from latscope.report.html import report_html
from latscope.report.models_panel import models_panel
from latscope.run import run_scenario
from latscope.scenario import scenario_from_dict

TTFT_MS = {"fast": 2.0, "slow": 60.0}  # the server waits this long before a model's first token
TOKENS = 3


def make_models_app(seen: list[str]) -> web.Application:
    """Chat completions, streamed: TTFT_MS[model] before the first of TOKENS words, 1 ms apart, then usage."""

    async def complete(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        seen.append(body["model"])
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await asyncio.sleep(TTFT_MS[body["model"]] / 1000)
        for i in range(TOKENS):
            await response.write(b"data: %s\n\n" % json.dumps({"choices": [{"delta": {"content": f" w{i}"}}]}).encode())
            await asyncio.sleep(0.001)
        usage = {"prompt_tokens": 8, "completion_tokens": TOKENS}
        await response.write(b"data: %s\n\ndata: [DONE]\n\n" % json.dumps({"choices": [], "usage": usage}).encode())
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", complete)
    return app


@pytest.fixture(scope="module")
def mix_run(tmp_path_factory) -> tuple[Path, list[str]]:
    # 540 requests, 8 in 9 to the fast adapter (its two classes): enough that the fast model's p99 has an
    # upper confidence bound (a model needs ≥ 368 requests for one at 95 %) and the slow one a lower bound
    # near its slowest (60 requests), so the fairness interval can clear 1.
    seen: list[str] = []
    tmp = tmp_path_factory.mktemp("models")
    with serve(make_models_app(seen)) as url:
        scenario = scenario_from_dict({
            "name": "mix", "seed": 5,
            "target": {"protocol": "openai", "url": url, "model": "fast", "timeout": 5,
                       "openai": {"api": "chat", "stream": True, "include_usage": True}},
            "workload": {"classes": [
                {"name": "a1", "weight": 4, "prompt_tokens": 8, "output_tokens": TOKENS},  # the target's model
                {"name": "a2", "weight": 4, "prompt_tokens": 8, "output_tokens": TOKENS, "model": "fast"},
                {"name": "b", "weight": 1, "prompt_tokens": 8, "output_tokens": TOKENS, "model": "slow"}]},
            "phases": [{"name": "main", "duration": 2, "arrival": {"type": "constant", "rate": 270}}],
            "output": {"dir": str(tmp)},
        })
        return run_scenario(scenario, workers=1).run_dir, seen


def test_the_summary_groups_classes_by_model_and_names_the_slow_one(mix_run):
    run_dir, seen = mix_run
    s = json.loads((run_dir / "summary.json").read_text())
    models, ttft = s["models"], s["metrics"]["ttft"]
    assert s["requests"]["errors"] == 0 and s["requests"]["completed"] == 540
    assert models["classes"] == {"a1": "fast", "a2": "fast", "b": "slow"}
    fast, slow = models["by_model"]["fast"], models["by_model"]["slow"]
    assert fast["classes"] == ["a1", "a2"] and slow["classes"] == ["b"]
    # every request went to the model its class named (the server saw them)
    assert seen.count("slow") == slow["requests"]["sent"] == ttft["b"]["count"]
    assert seen.count("fast") == fast["requests"]["completed"] == ttft["a1"]["count"] + ttft["a2"]["count"]
    assert slow["metrics"]["ttft"] == ttft["b"] and slow["metrics"]["latency"] == s["metrics"]["latency"]["b"]
    # a merged percentile lies between its classes' (a mixture's quantile is between its parts')
    for stat in ("p50_ms", "p99_ms", "max_ms"):
        parts = (ttft["a1"][stat], ttft["a2"][stat])
        assert min(parts) <= fast["metrics"]["ttft"][stat] <= max(parts), stat
    f = {e["metric"]: e for e in models["fairness"]}
    assert set(f) == {"ttft", "latency"}  # no reasoning: no ttfot entry
    t = f["ttft"]
    assert (t["worst"], t["best"]) == ("slow", "fast")
    assert (t["worst_ms"], t["best_ms"]) == (ttft["b"]["p99_ms"], fast["metrics"]["ttft"]["p99_ms"])
    assert t["worst_ms"] >= TTFT_MS["slow"]  # TTFT counts from the intended send time, the server waited 60 ms first
    assert t["ratio"] == round(t["worst_ms"] / t["best_ms"], 3) and t["difference_ms"] == round(t["worst_ms"] - t["best_ms"], 3)
    assert t["clear"] and t["ratio_low"] > 1


def test_the_console_prints_the_fairness_line(mix_run):
    run_dir, _ = mix_run
    s = json.loads((run_dir / "summary.json").read_text())
    console = Console(record=True, width=400)
    print_summary(console, s, run_dir)
    t = next(e for e in s["models"]["fairness"] if e["metric"] == "ttft")
    assert (f"model fairness, TTFT p99: slow {t['worst_ms']:,.2f} ms is {t['ratio']:.2f}× "
            f"(+{t['difference_ms']:,.2f} ms) fast's {t['best_ms']:,.2f} ms under the same load") in console.export_text()


def test_the_report_draws_each_models_percentiles_and_the_compare_page_both_runs(mix_run):
    run_dir, _ = mix_run
    page = (run_dir / "report.html").read_text()
    s = json.loads((run_dir / "summary.json").read_text())
    section = panel_section(page, "models")
    assert "model fairness, TTFT p99: slow" in section and "<td>a1, a2</td>" in section
    traces = page_figures(page)["plot-models"]["data"]
    p99 = [t for t in traces if t["name"] == "p99"]
    assert len(p99) == 2  # one row per fairness metric: TTFT, then latency
    assert list(p99[0]["x"]) == ["fast", "slow"]
    assert figure_array(p99[0]["y"]).tolist() == [s["models"]["by_model"][m]["metrics"]["ttft"]["p99_ms"] for m in ("fast", "slow")]
    run = load_run(run_dir)
    both, _ = compare_html(run, run)
    names = {t["name"] for t in page_figures(both)["plot-models"]["data"]}
    assert {"p99 (base)", "p99 (new)"} <= names


def test_a_run_of_one_model_has_no_models_panel_and_names_none():
    page = report_html(load_run(REPO / "tests" / "data" / "run_f16f211"))
    assert '<section id="models">' not in page and "model or adapter" not in page


def test_summary_md_has_the_fairness_lines(mix_run):
    run_dir, _ = mix_run
    text = (run_dir / "summary.md").read_text()
    assert "- model fairness, TTFT p99: slow " in text and "- model fairness, latency p99: slow " in text


def test_on_the_compare_page_a_mix_in_one_run_only_still_draws_its_bars(mix_run):
    run_dir, _ = mix_run
    models = json.loads((run_dir / "summary.json").read_text())["models"]
    panel = models_panel({}, models, compare=True)  # the base run had the mix, the new one not
    names = {t.name for t in panel.figure.data}
    assert names == {"p50 (base)", "p90 (base)", "p99 (base)"} and panel.html == "" and panel.lead == ""
    assert models_panel({}, {}, compare=True).figure is None  # neither: nothing, and the page leaves it out


def test_model_and_class_names_from_the_scenario_are_text_never_markup(mix_run):
    run_dir, _ = mix_run
    text = (run_dir / "summary.json").read_text().replace('"slow"', '"<img src=x onerror=alert(1)>"')
    panel = models_panel(json.loads(text)["models"])
    assert "<img" not in panel.lead + panel.html and "&lt;img src=x onerror=alert(1)&gt;" in panel.lead + panel.html
    assert all("<img" not in str(x) for t in panel.figure.data for x in t.x)
