"""Request ids (latscope/request_ids.py): a UUID that servers which validate the header accept, and
that still says the request's schedule row; a 4xx with an empty body names what the run sends."""

from __future__ import annotations

import uuid

import pandas as pd
from aiohttp import web

from chat_server import make_chat_app
from conftest import serve
from latscope.request_ids import MAX_ROW, request_id, request_row, request_run, run_tag
from latscope.run import run_scenario
from latscope.scenario import scenario_from_dict


def test_an_id_is_a_version_4_uuid_whose_last_48_bits_are_the_row():
    tag = run_tag(12345)
    for seq in (0, 1, 4095, 10**7, MAX_ROW):
        value = request_id(tag, seq)
        parsed = uuid.UUID(value)
        assert str(parsed) == value and parsed.version == 4 and parsed.variant == uuid.RFC_4122
        assert parsed.int & MAX_ROW == seq and request_row(value) == seq and request_row(value.upper()) == seq
        assert request_run(value) == value[:-12]
    assert run_tag(1) != run_tag(2) and request_run(request_id(run_tag(1), 5)) != request_run(request_id(run_tag(2), 5))
    assert request_row("17") is None and request_row(str(uuid.uuid1())) is None and request_row(None) is None


def _uuid_only(app: web.Application, refuse: str | None = None) -> web.Application:
    """Like llama.cpp's server: HTTP 400 with an empty body when X-Request-Id is not a UUID (or when the
    request carries the header `refuse`)."""

    @web.middleware
    async def check(request: web.Request, handler):
        value = request.headers.get("X-Request-Id")
        try:
            uuid.UUID(value) if value is not None else None
        except ValueError:
            return web.Response(status=400)
        if refuse and refuse in request.headers:
            return web.Response(status=400)
        return await handler(request)

    app.middlewares.append(check)
    return app


def _scenario(url: str, tmp_path, **target) -> dict:
    return {"name": "ids", "seed": 5,
            "target": {"protocol": "openai", "url": url, "model": "m", "timeout": 5, "request_id_header": "X-Request-Id",
                       **target},
            "workload": {"classes": [{"name": "c", "prompt_tokens": 8, "output_tokens": 2}]},
            "phases": [{"name": "p", "duration": 0.5, "arrival": {"type": "constant", "rate": 20}}],
            "output": {"dir": str(tmp_path), "report": False}}


def test_a_server_that_takes_only_uuids_accepts_every_request_and_its_log_names_the_rows(tmp_path):
    """73 of 73 requests were refused by llama.cpp's server when the id was the bare row number."""
    log: list[dict] = []
    with serve(_uuid_only(make_chat_app(log, ttft_ms=1, itl_ms=0))) as url:
        runs = [run_scenario(scenario_from_dict(_scenario(url, tmp_path)), workers=1) for _ in range(2)]
    for result in runs:
        assert result.summary["requests"]["completed"] == result.summary["requests"]["sent"] == 10
    ids = [e["request_id"] for e in log]
    schedule = pd.read_parquet(runs[0].run_dir / "schedule.parquet")
    assert sorted(request_row(i) for i in ids[:10]) == list(range(len(schedule))) == list(range(10))
    # each run has its own prefix (its salt), shared by all its requests
    assert len({request_run(i) for i in ids[:10]}) == len({request_run(i) for i in ids[10:]}) == 1
    assert request_run(ids[0]) != request_run(ids[10])


def test_a_4xx_with_an_empty_body_names_the_headers_and_fields_the_run_sends(tmp_path):
    with serve(_uuid_only(make_chat_app([]), refuse="X-Tenant")) as url:
        data = _scenario(url, tmp_path, headers={"X-Tenant": "a", "Authorization": "Bearer k"},
                         openai={"extra_body": {"top_k": 3}})
        s = run_scenario(scenario_from_dict(data), workers=1).summary
    assert s["errors"]["http_4xx"] == s["requests"]["sent"] == 10
    assert s["error_examples"]["http_4xx"] == [
        "HTTP 400 Bad Request with an empty body; this run sends X-Request-Id (a UUID, target.request_id_header), the "
        "header X-Tenant, the body field top_k (openai.extra_body): the server may refuse one of them"]
