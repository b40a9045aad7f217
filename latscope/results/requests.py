"""requests.parquet from the workers' part files: one merge, in constant memory, at the run's end.

Each worker writes its rows as complete part files (latscope/request_log.py) under
`<run_dir>/.requests/`; the run's parent (run/requests.py), after the workers are gone, streams
every part's row groups into one file with one schema: REQUEST_COLUMNS in their order, then every
`server.<part>` column any part has (null in the parts without it), `node` filled from
`node_of_worker` (a distributed run's machines; null in a local run). Parts are read batch by batch
and written in row groups of about ROW_GROUP_ROWS, so memory stays flat whatever the run's size;
the file is written to a temporary name and renamed, and the parts are removed only after that.
A part that cannot be read (a worker killed mid-write leaves only a temporary name, which is
skipped) is left out, with a warning.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from latscope.results.schema import REQUEST_COLUMNS, REQUEST_SERVER_PREFIX

ROW_GROUP_ROWS = 131_072
COMPRESSION = "zstd"
_TYPES = {"int64": pa.int64(), "int32": pa.int32(), "string": pa.string(), "bool": pa.bool_()}


def request_schema(server_parts: list[str] | tuple[str, ...] = ()) -> pa.Schema:
    """requests.parquet's schema: REQUEST_COLUMNS (their type is the first word of each meaning),
    then `server.<part>` float64 columns in the order given."""
    fields = [pa.field(name, _TYPES[meaning.split(":", 1)[0]]) for name, meaning in REQUEST_COLUMNS.items()]
    fields += [pa.field(REQUEST_SERVER_PREFIX + part, pa.float64()) for part in server_parts]
    return pa.schema(fields)


def write_options(schema: pa.Schema) -> dict:
    """How requests.parquet and its parts are encoded (pq.ParquetWriter's keywords): zstd, integers
    DELTA_BINARY_PACKED (times and rows nearly monotone, durations close to each other: measured 27 →
    10 bytes a plain HTTP request, benchmarks/RESULTS.md), strings and the rest dictionary-encoded."""
    ints = [f.name for f in schema if pa.types.is_integer(f.type)]
    return {"compression": COMPRESSION, "use_dictionary": [f.name for f in schema if f.name not in ints],
            "column_encoding": {name: "DELTA_BINARY_PACKED" for name in ints}}


def part_files(parts_dir: str | Path) -> list[Path]:
    """The complete part files under `parts_dir` (temporary names excluded), in name order."""
    directory = Path(parts_dir)
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.glob("*.parquet") if not p.name.startswith("."))


def merge_parts(parts_dir: str | Path, out_path: str | Path, node_of_worker: dict[int, str] | None = None,
                *, remove: bool = True) -> int:
    """Merge every part file under `parts_dir` into `out_path` (requests.parquet); the rows written.
    `node_of_worker`: engine index -> node name for the `node` column (None: null, a local run).
    With `remove`, `parts_dir` is deleted once the file is in place. No parts: a file of 0 rows."""
    files, skipped = [], 0
    server: set[str] = set()
    for path in part_files(parts_dir):
        try:
            names = pq.read_schema(path).names
        except (OSError, pa.ArrowException):
            skipped += 1
            continue
        files.append(path)
        server.update(n[len(REQUEST_SERVER_PREFIX):] for n in names if n.startswith(REQUEST_SERVER_PREFIX))
    schema = request_schema(sorted(server))
    out = Path(out_path)
    tmp = out.with_name(f".{out.name}.tmp")
    rows = pending_rows = 0
    pending: list[pa.RecordBatch] = []
    damaged: list[Path] = []
    try:
        with pq.ParquetWriter(tmp, schema, **write_options(schema)) as writer:
            for path in files:
                for batch in _batches(path, damaged):
                    pending.append(_conform(batch, schema, node_of_worker))
                    pending_rows += batch.num_rows
                    if pending_rows >= ROW_GROUP_ROWS:
                        rows += _write(writer, pending, schema)
                        pending, pending_rows = [], 0
            if pending:
                rows += _write(writer, pending, schema)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    skipped += len(damaged)
    os.replace(tmp, out)
    if remove:
        shutil.rmtree(parts_dir, ignore_errors=True)
    if skipped:
        logging.getLogger("latscope.results").warning("%d damaged part file(s) of %s left out (or cut short)",
                                                      skipped, out.name)
    return rows


def _batches(path: Path, damaged: list[Path]):  # noqa: ANN202 - a generator of RecordBatch
    """A part's record batches; one that cannot be read ends them there (its complete batches stay)
    and is noted in `damaged`."""
    try:
        yield from pq.ParquetFile(path).iter_batches(batch_size=ROW_GROUP_ROWS)
    except (OSError, pa.ArrowException):
        damaged.append(path)


def _write(writer: pq.ParquetWriter, batches: list[pa.RecordBatch], schema: pa.Schema) -> int:
    table = pa.Table.from_batches(batches, schema)
    writer.write_table(table, row_group_size=ROW_GROUP_ROWS)
    return table.num_rows


def _nodes(workers: np.ndarray, node_of_worker: dict[int, str]) -> pa.Array:
    """The `node` column of rows sent by `workers` (null for an engine the map does not name)."""
    names = sorted(set(node_of_worker.values()))
    lookup = np.full(max([*node_of_worker, int(workers.max(initial=0))]) + 1, -1, np.int32)
    for worker, node in node_of_worker.items():
        lookup[worker] = names.index(node)
    codes = lookup[workers]
    indices = pa.array(np.maximum(codes, 0), pa.int32(), mask=codes < 0)
    return pa.DictionaryArray.from_arrays(indices, pa.array(names, pa.string())).cast(pa.string())


def _conform(batch: pa.RecordBatch, schema: pa.Schema, node_of_worker: dict[int, str] | None) -> pa.RecordBatch:
    """A part's batch with the merged file's columns, in its order: missing ones null, `node` filled."""
    n = batch.num_rows
    have = set(batch.schema.names)
    columns = []
    for field in schema:
        if field.name == "node" and node_of_worker is not None:
            columns.append(_nodes(batch.column("worker").to_numpy(zero_copy_only=False), node_of_worker))
        elif field.name in have:
            columns.append(batch.column(field.name).cast(field.type))
        else:
            columns.append(pa.nulls(n, field.type))
    return pa.RecordBatch.from_arrays(columns, schema=schema)
