"""merge_parts: the workers' part files into one requests.parquet (real files)."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq

from latscope.records import Outcome, Request
from latscope.request_log import NULL, RequestLog
from latscope.results.requests import merge_parts
from latscope.results.schema import REQUEST_COLUMNS

T0 = 1_000_000_000


def write_part(parts, engine: int, rows: range, timing: dict | None) -> None:
    log = RequestLog(parts, engine, T0, ["c"], np.zeros(1000, np.int64), ["p"], [0.0])
    for r in rows:
        log.add(Request(r, T0 + r * 1000, 0, False), Outcome(T0 + r * 1000, T0 + r * 1000 + 5000, status=200,
                                                              server_timing=timing),
                (5, 5, 0, NULL, NULL, NULL, NULL), (NULL, NULL, NULL))
    log.close()


def test_parts_merge_into_one_file_with_every_server_part_and_the_node(tmp_path):
    parts = tmp_path / ".requests"
    write_part(parts, 0, range(0, 10, 2), {"queue": 1.0})
    write_part(parts, 1, range(1, 10, 2), {"compute": 2.0})
    write_part(parts, 2, range(10, 13), None)
    (parts / ".w003-000000.parquet.tmp").write_bytes(b"PAR1 half a file")  # a worker killed mid-write
    (parts / "w009-000000.parquet").write_bytes(b"PAR1 not a parquet file")  # damaged: left out, with a warning
    out = tmp_path / "requests.parquet"
    rows = merge_parts(parts, out, {0: "a", 1: "b", 2: "a"})
    assert rows == 13 and not parts.exists()
    t = pq.read_table(out)
    assert t.schema.names == [*REQUEST_COLUMNS, "server.compute", "server.queue"]
    d = t.to_pydict()
    by_row = {r: i for i, r in enumerate(d["row"])}
    assert sorted(by_row) == list(range(13))
    assert [d["node"][by_row[r]] for r in (0, 1, 10)] == ["a", "b", "a"]
    assert [d["server.queue"][by_row[r]] for r in (0, 1, 10)] == [1.0, None, None]
    assert [d["server.compute"][by_row[r]] for r in (0, 1, 10)] == [None, 2.0, None]


def test_no_parts_is_an_empty_file_and_no_node_map_leaves_node_null(tmp_path):
    out = tmp_path / "requests.parquet"
    assert merge_parts(tmp_path / "missing", out) == 0
    assert pq.read_table(out).schema.names == list(REQUEST_COLUMNS)
    write_part(tmp_path / "p", 4, range(3), None)
    assert merge_parts(tmp_path / "p", out) == 3
    assert pq.read_table(out)["node"].null_count == 3
