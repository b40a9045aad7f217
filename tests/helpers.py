"""Readers of a results directory's files that only the tests need (latscope itself reads a run
through latscope.analysis.run_data.load_run), `run_cli_until`, a `latscope run` stopped by a signal, and
`reference_server`, the reference server on loopback, with its own counters (`server_counters`)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Collection, Iterator

import pandas as pd
from hdrh.histogram import HdrHistogram

from latscope.results import HLOG, SUMMARY, TIMESERIES
from latscope.results.hlog import read_hlog
from conftest import REPO, free_port

Interval = tuple[float, float, HdrHistogram]  # (start_s from the run's start, length_s, histogram)


def read_summary(run_dir: str | Path) -> dict:
    return json.loads((Path(run_dir) / SUMMARY).read_text())


def read_intervals(run_dir: str | Path, metrics: Collection[str] | None = None) -> dict[tuple[str, str], list[Interval]]:
    """The per-interval histograms of histograms.hlog, by (metric, class), in time order; only
    those of `metrics` when given (the others are not decoded). Warm-up intervals are included."""
    wanted = None if metrics is None else set(metrics)

    def want(tag: str | None) -> bool:
        return tag is not None and (wanted is None or tag.split("/", 1)[0] in wanted)

    out: dict[tuple[str, str], list[Interval]] = {}
    for tag, start_s, length_s, h in read_hlog(Path(run_dir) / HLOG, want=want):
        metric, cls = tag.split("/", 1)  # metric names hold no "/" (Server-Timing names are tokens)
        out.setdefault((metric, cls), []).append((start_s, length_s, h))
    return out


def read_timeseries(run_dir: str | Path) -> pd.DataFrame:
    return pd.read_parquet(Path(run_dir) / TIMESERIES)


def run_cli_until(scenario: Path, out: Path, after_s: float, sig: int, workers: int = 1) -> tuple[int, str]:
    """`latscope run SCENARIO --out OUT` as a real process, sent `sig` `after_s` seconds after its run
    started (run_start in events.jsonl); (its exit code, its output)."""
    repo = Path(__file__).resolve().parents[1]
    proc = subprocess.Popen([sys.executable, "-m", "latscope.cli", "run", str(scenario), "--out", str(out), "--workers",
                             str(workers), "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=repo)
    deadline = time.monotonic() + 30
    while not (out / "events.jsonl").exists() or "run_start" not in (out / "events.jsonl").read_text():
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()[0]
        time.sleep(0.1)
    time.sleep(after_s)
    proc.send_signal(sig)
    output, _ = proc.communicate(timeout=30)
    return proc.returncode, output


# A chat template in the shape Hugging Face ships (tokenizer_config.json's `chat_template`): every
# message between role markers, BOS first, the generation prompt last. Its special tokens are in
# the test tokenizer's vocabulary, one token each.
TEST_CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
                      "{% if add_generation_prompt %}<|assistant|>{% endif %}")
TEST_SPECIALS = ("[UNK]", "<s>", "</s>", "<|user|>", "<|assistant|>", "<|end|>")


def build_tokenizer(path: Path, chat_template: str | None = None) -> Path:
    """A small byte-level BPE tokenizer.json trained here, in milliseconds, on text of common English
    words and punctuation (never downloaded), with a BOS post-processor (`<s>` first, as Llama's);
    with `chat_template`, written into the file as a top-level `chat_template` (tokenizer.py reads it)."""
    import json

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    from latscope.workload import VOCABULARY

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=list(TEST_SPECIALS), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    words = list(VOCABULARY)
    text = [" ".join(words[i:] + words[:i]) + ", and so on." for i in range(0, len(words), 7)]
    tok.train_from_iterator(text, trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    doc = json.loads(tok.to_str())
    if chat_template is not None:
        doc["chat_template"] = chat_template
    path.write_text(json.dumps(doc))
    return path


@contextmanager
def reference_server(*flags: str) -> Iterator[str]:
    """The reference server (`serve`, HTTP only) on a free loopback port, ready; its URL."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "reference_server", "serve", "--http-port", str(port), "--grpc-port", "-1",
                             *flags], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                with urllib.request.urlopen(f"{url}/v2/health/ready", timeout=1):
                    break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "the reference server did not start"
                time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(20)


def server_counters(url: str, prefix: str) -> dict[str, float]:
    """The reference server's own /metrics samples whose names start with `prefix`, by name with labels."""
    text = urllib.request.urlopen(f"{url}/metrics", timeout=5).read().decode()
    return {name: float(value) for name, value in (line.rsplit(" ", 1) for line in text.splitlines()
                                                     if line.startswith(prefix))}


def cache_counters(url: str) -> tuple[float, float]:
    """(cached prompt tokens, prompt tokens looked up) from the server's own /metrics."""
    values = server_counters(url, "latscope_ref_prefix_cache_")
    return values["latscope_ref_prefix_cache_hits_tokens_total"], values["latscope_ref_prefix_cache_queries_tokens_total"]
