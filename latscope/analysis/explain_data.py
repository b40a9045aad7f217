"""requests.parquet, read compactly for `latscope explain`: only the columns it uses, numbers as
float64 arrays (NaN for null) and strings as integer codes into a list of their values.

Why not a DataFrame of the file: a million rows of Python strings (class, phase, replica) cost
hundreds of MB and seconds to build; codes from pyarrow's dictionary encoding cost 4 bytes a row.
The budget is 1M requests in under 10 s and 1 GB.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from latscope.errors import ResultsError
from latscope.results.schema import REQUEST_SERVER_PREFIX, REQUESTS

NUMERIC = ("row", "worker", "turn", "intended_us", "sent_us", "first_token_us", "end_us", "latency_us",
           "service_us", "send_lag_us", "decode_us", "ttft_us", "prompt_tokens", "output_tokens", "cached_tokens",
           "stall_us", "connection")
TEXT = ("class", "phase", "node", "replica", "error")
NEEDED = ("intended_us", "end_us", "latency_us", "warmup", "error")


@dataclass
class Records:
    """The requests of one run, every sent row (warm-up and failures included)."""

    n: int
    warmup: np.ndarray  # bool
    numbers: dict[str, np.ndarray]  # column -> float64, NaN where null (absent columns are absent)
    codes: dict[str, np.ndarray]  # column -> int32 code, -1 where null
    values: dict[str, list[str]]  # column -> its values, by code
    server_parts: list[str] = field(default_factory=list)  # "server.<part>" columns, in numbers (µs)

    def number(self, name: str) -> np.ndarray:
        """A numeric column, all NaN when the file has none."""
        found = self.numbers.get(name)
        return found if found is not None else np.full(self.n, np.nan)

    def metric_us(self, metric: str) -> np.ndarray | None:
        """The per-request values of a metric ("latency", "ttft", "service_time" ...), or None."""
        column = {"service_time": "service_us"}.get(metric, f"{metric}_us")
        return self.numbers.get(column)


def read_records(run_dir: Path) -> Records:
    """The run's requests.parquet. ResultsError naming the file when it is missing, unreadable or
    lacks the columns explain needs (`output.requests: off`, or a run written before the file existed)."""
    path = Path(run_dir) / REQUESTS
    if not path.is_file():
        raise ResultsError(f"{path}: missing — this run kept no per-request records (written by latscope "
                           "runs since the file existed, unless `output.requests: off`); explain needs them")
    try:
        schema = pq.read_schema(path)
        names = set(schema.names)
        missing = [c for c in NEEDED if c not in names]
        if missing:
            raise ResultsError(f"{path}: missing columns {', '.join(missing)} (not a latscope requests.parquet)")
        parts = [c for c in schema.names if c.startswith(REQUEST_SERVER_PREFIX)]
        wanted = [c for c in (*NUMERIC, *TEXT, "warmup") if c in names] + parts
        table = pq.read_table(path, columns=wanted)
    except ResultsError:
        raise
    except Exception as exc:  # noqa: BLE001 - pyarrow raises several kinds for a bad file
        raise ResultsError(f"{path}: unreadable ({exc})") from None
    n = table.num_rows
    numbers: dict[str, np.ndarray] = {}
    for name in [c for c in NUMERIC if c in names] + parts:
        column = table.column(name)
        try:
            array = column.cast(pa.float64()).to_numpy(zero_copy_only=False)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            raise ResultsError(f"{path}: column {name} is not numeric") from None
        numbers[name] = array * 1000.0 if name in parts else array  # Server-Timing is in ms
    parts = [name for name in parts if np.isfinite(numbers[name]).any()]  # a part no request carried says nothing
    codes, values = {}, {}
    for name in (c for c in TEXT if c in names):
        encoded = pc.dictionary_encode(table.column(name).cast(pa.string())).combine_chunks()
        codes[name] = encoded.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int32)
        values[name] = [str(v) for v in encoded.dictionary.to_pylist()]
    warmup = table.column("warmup").fill_null(False).to_numpy(zero_copy_only=False).astype(bool)
    return Records(n, warmup, numbers, codes, values, parts)
