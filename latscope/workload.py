"""What each request carries: prompt and answer lengths, prompts, tensors. Nothing about timing.

The plan draws every request's lengths up front (`draw_lengths`, seeded, vectorized) so a run is
reproducible and its schedule file says what each request asked for. In a worker, `Payloads` turns
one planned request into a protocol-neutral `Payload` (a prompt of N tokens, a max_tokens, input
tensors); the protocol then encodes it for the wire and times that encode.

Synthetic prompts need no tokenizer download: they are runs of common short English words, each of
which is one token (with its leading space) in the BPE tokenizers of GPT-2/GPT-4, Llama 2/3, Mistral
and Qwen, so a prompt of N words is N tokens give or take a few percent on those servers (and exactly
N on the reference server, whose toy tokenizer counts words). The server's own count, when it
reports usage, is what the results record.

With `workload.tokenizer` (tokenizer.py), a dataset's prompts have exact lengths: `class_prompts`
counts each as the server will (a chat class's through the chat template when one is given), leaves
out those outside the dataset's [min_tokens, max_tokens] or cuts the longer ones (`cut`), and the
plan's prompt_tokens of the class's requests are those counts (plan.py). A worker counts an answer's
text with it when the server sent no usage (`Payloads.count_output`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from latscope.errors import ScenarioError
from latscope.mooncake import block_prompt
from latscope.records import Outcome, Request
from latscope.scenario import Dataset, LengthDist, Scenario, TensorSpec
from latscope.scenario.base import DataPath
from latscope.scenario.workload import DTYPES, WorkloadClass
from latscope.tokenizer import Tokenizer, load_tokenizer

# Common English words that tokenize as a single token with a leading space in mainstream BPE
# vocabularies (checked against GPT-2's and Llama's merges: all are whole-word entries).
VOCABULARY = (
    "the of and to in is that for it as was with be by on not he this are or his from at which but "
    "have an they you were her she there one all we their can has been more if no would out so what "
    "up its about into than them only other new some time could these two may then do first any my "
    "now such like our over man me even most made after also did many before must through back years "
    "where much your way well down should because each just those people how too little state good "
    "very make world still own see men work long get here between both life being under never day "
    "same another know while last might us great old year off come since against go came right used "
    "take three"
).split()
TEXT_WORDS = 1 << 16  # the synthetic text prompts are cut from (a prompt longer than this repeats it)
TENSOR_POOL = 4  # random tensors kept per class; requests cycle through them
MAX_PREFIXES_KEPT = 4096  # shared-prefix texts kept built (per worker); more variants are built when used
DATATYPES = {dtype: name for name, dtype in DTYPES.items()}  # numpy dtype -> KServe v2 datatype


@dataclass(frozen=True, slots=True)
class Tensor:
    name: str
    datatype: str  # KServe v2 datatype, e.g. "FP32"
    array: np.ndarray


@dataclass(slots=True)
class Payload:
    """What one request carries, before any protocol encodes it."""

    prompt: str | None = None  # text prompt (synthetic or from a dataset)
    max_tokens: int | None = None  # answer length asked for
    tensors: list[Tensor] | None = None  # KServe v2 inputs


def seed_streams(scenario: Scenario) -> list[np.random.SeedSequence]:
    """The scenario's independent random streams, by position: one per phase (arrivals), then class
    draws, per-request lengths, the payload contents (synthetic text, random tensors: `PAYLOAD_STREAM`
    after the phases'), and sessions (sessions.py). Adding a stream at the end never changes the ones
    before it."""
    return np.random.SeedSequence(scenario.seed).spawn(len(scenario.phases) + 4)


PAYLOAD_STREAM, SESSION_STREAM = 2, 3  # after the phases' streams


# -- the prompts' salt (scenario `prompt_salt`) -------------------------------------------------
# Synthetic prompts are words of VOCABULARY drawn from the seed. A salt redraws them: the same
# lengths, the same shared prefixes and Mooncake blocks within the run (they are places in the one
# text, or block ids spelled over it), other words from run to run, and still only words of
# VOCABULARY, so every prompt keeps its exact token count. Dataset prompts are sent as written.


def with_run_salt(scenario: Scenario) -> Scenario:
    """The scenario a run sends with: `prompt_salt: run` replaced by a salt drawn now (63 random
    bits), once per run, so that every worker and machine of the run uses the same one. Anything
    else is returned as it is."""
    if scenario.prompt_salt != "run":
        return scenario
    import secrets

    resolved = scenario.model_copy(update={"prompt_salt": secrets.randbits(63)})
    resolved._salt_drawn = True
    return resolved


def salt_record(scenario: Scenario) -> dict:
    """summary.json's `prompt_salt`: how the run's prompts were salted (`run`: drawn for this run;
    `fixed`: given in the scenario; `none`: not at all, the seed alone) and the salt (null for none),
    which `--set prompt_salt=<value>` gives again."""
    salt = run_salt(scenario)
    mode = "none" if salt is None else "run" if scenario._salt_drawn else "fixed"
    return {"mode": mode, "value": salt}


def run_salt(scenario: Scenario) -> int | None:
    """The salt the prompts are built with; None with `prompt_salt: none`, and for a scenario no run
    has resolved (`run`: `validate`, a test building Payloads itself): the seed alone."""
    return scenario.prompt_salt if isinstance(scenario.prompt_salt, int) else None


def text_seed(scenario: Scenario) -> int:
    """The 64-bit key of the run's text (the Mooncake blocks' words, the request ids' run part):
    the seed, mixed with the salt when there is one."""
    salt = run_salt(scenario)
    if salt is None:
        return scenario.seed
    return int(np.random.SeedSequence([scenario.seed, salt]).generate_state(1, np.uint64)[0])


# -- lengths (used by the plan) ---------------------------------------------------------------


def draw_lengths(dist: LengthDist, n: int, rng: np.random.Generator, scenario: Scenario) -> np.ndarray:
    """`n` lengths (int32, each >= 1) from `dist`."""
    match dist.dist:
        case "fixed":
            return np.full(n, dist.value, dtype=np.int32)
        case "uniform":
            return rng.integers(dist.min, dist.max + 1, size=n).astype(np.int32)
        case "normal":
            values = rng.normal(dist.mean, dist.std, size=n)
        case "lognormal":
            # mean/std are of the lengths themselves: sigma² = ln(1 + std²/mean²), mu = ln(mean) − sigma²/2
            sigma2 = np.log1p((dist.std / dist.mean) ** 2)
            values = rng.lognormal(np.log(dist.mean) - sigma2 / 2, np.sqrt(sigma2), size=n)
        case "empirical":
            sample = read_lengths(scenario.resolve_path(dist.file), dist.column)
            return rng.choice(sample, size=n).astype(np.int32)
        case _:
            raise AssertionError(f"unhandled length distribution {dist.dist}")
    high = dist.max if dist.max is not None else np.iinfo(np.int32).max
    return np.clip(np.rint(values), dist.min, high).astype(np.int32)


def read_lengths(path: Path, column: str | None) -> np.ndarray:
    """Positive integer lengths from a CSV column, a JSONL field or a file of one number per line."""
    if not path.is_file():
        raise ScenarioError(f"length file {path}: not found")
    try:
        if path.suffix == ".csv":
            import pandas as pd

            frame = pd.read_csv(path)
            if column not in frame.columns:
                raise ScenarioError(f"length file {path}: no column {column!r} (columns: {', '.join(map(str, frame.columns))})")
            values = frame[column].to_numpy()
        elif path.suffix in (".jsonl", ".ndjson"):
            if column is None:
                raise ScenarioError(f"length file {path}: say which field holds the lengths (column: ...)")
            values = np.array([json.loads(line)[column] for line in path.read_text().splitlines() if line.strip()])
        else:
            values = np.array([float(line) for line in path.read_text().split()])
        lengths = np.asarray(values, dtype=np.float64)
    except (ValueError, KeyError, TypeError, OSError, UnicodeDecodeError) as exc:
        raise ScenarioError(f"length file {path}: cannot read lengths ({exc})") from None
    lengths = lengths[np.isfinite(lengths) & (lengths >= 1)]
    if len(lengths) == 0:
        raise ScenarioError(f"length file {path}: no positive lengths in it")
    return np.rint(lengths).astype(np.int32)


# -- payloads (used by the protocols, in the workers) -----------------------------------------


def _dataset_rows(path: Path) -> list:
    if not path.is_file():
        raise ScenarioError(f"dataset {path}: not found")
    try:
        text = path.read_text()
        return json.loads(text) if text.lstrip().startswith("[") else [json.loads(l) for l in text.splitlines() if l.strip()]
    except (ValueError, OSError, UnicodeDecodeError) as exc:
        raise ScenarioError(f"dataset {path}: not JSON lines ({exc})") from None


def _human_turns(row: object) -> list[str]:
    """A ShareGPT conversation's human turns (`conversations[].from` human or user), in order."""
    turns = (row.get("conversations") or []) if isinstance(row, dict) else []
    return [t["value"] for t in turns if isinstance(t, dict) and t.get("from") in ("human", "user")
            and isinstance(t.get("value"), str) and t["value"].strip()]


def read_dataset(dataset: Dataset, path: Path) -> list[str]:
    """The prompts of a dataset file: JSONL (one object per line) or, for ShareGPT, a JSON array too."""
    prompts = []
    for row in _dataset_rows(path):
        if dataset.format == "sharegpt":
            prompt = next(iter(_human_turns(row)), None)
        else:
            prompt = row.get(dataset.field) if isinstance(row, dict) else None
        if isinstance(prompt, str) and prompt.strip():
            prompts.append(prompt)
    if not prompts:
        what = "conversations with a human turn" if dataset.format == "sharegpt" else f"rows with a text field {dataset.field!r}"
        raise ScenarioError(f"dataset {path}: no {what}")
    return prompts


@dataclass(frozen=True, slots=True)
class Prompts:
    """A dataset class's prompts as sent, and with a tokenizer each one's token count."""

    texts: list[str]
    tokens: np.ndarray | None  # int32, texts' counts (tokenizer.py); None: no workload.tokenizer


_PROMPTS: dict[tuple, Prompts] = {}  # per process: the plan, the parent's check and a worker each ask
TEMPLATED_PROTOCOLS = ("openai-responses", "anthropic-messages")  # messages, rendered by the chat template


def templated(scenario: Scenario, c: int) -> bool:
    """Whether class `c` sends chat messages (its prompt goes through the model's chat template)."""
    endpoint = scenario.endpoint(c)
    if endpoint.protocol == "openai":
        return endpoint.openai is not None and endpoint.openai.api == "chat"
    return endpoint.protocol in TEMPLATED_PROTOCOLS


def class_prompts(scenario: Scenario, c: int) -> Prompts | None:
    """Class `c`'s dataset prompts (None: it has no dataset): with workload.tokenizer, counted,
    picked by [min_tokens, max_tokens] and cut (module docstring). Kept per process and file."""
    dataset = scenario.workload.effective_classes()[c].dataset
    if dataset is None:
        return None
    where = ("workload", "classes", c, "dataset")
    path = scenario.resolve_path(dataset.file)
    spec = scenario.workload.tokenizer
    chat = spec is not None and templated(scenario, c)
    try:
        stat = path.stat()
        key = (path, stat.st_mtime_ns, stat.st_size, dataset.model_dump_json(), spec and spec.model_dump_json(), chat)
    except OSError:
        key = None
    if key is not None and key in _PROMPTS:
        return _PROMPTS[key]
    with scenario.about((*where, "file")):
        texts = read_dataset(dataset, path)
    tokenizer = load_tokenizer(scenario)
    prompts = Prompts(texts, None) if tokenizer is None else _by_tokens(scenario, c, texts, tokenizer, chat)
    if key is not None:
        _PROMPTS[key] = prompts
    return prompts


def _by_tokens(scenario: Scenario, c: int, texts: list[str], tokenizer: Tokenizer, chat: bool) -> Prompts:
    dataset = scenario.workload.effective_classes()[c].dataset
    counts = tokenizer.prompt_counts(texts, chat)
    low, high = dataset.min_tokens or 0, dataset.max_tokens or np.iinfo(np.int32).max
    listed = (texts, counts) if not dataset.cut else tokenizer.cut_all(texts, counts, high, chat)
    kept, lengths = [], []
    for text, n in zip(*listed):
        if low <= n <= high:
            kept.append(text)
            lengths.append(n)
    if not kept:
        field_name = "min_tokens" if dataset.min_tokens is not None else "max_tokens"
        raise scenario.problem(("workload", "classes", c, "dataset", field_name),
                               f"no prompt of {dataset.file} is between {low:,} and {high:,} tokens (its {len(texts):,} "
                               f"prompts have {min(counts):,} to {max(counts):,})")
    return Prompts(kept, np.array(lengths, np.int32))


def read_conversations(path: Path) -> list[list[str]]:
    """A ShareGPT file's conversations, each as its human turns in order (those without any left out)."""
    conversations = [turns for row in _dataset_rows(path) if (turns := _human_turns(row))]
    if not conversations:
        raise ScenarioError(f"dataset {path}: no conversations with a human turn")
    return conversations


def make_tensors(specs: list[TensorSpec], rng: np.random.Generator, scenario: Scenario, where: DataPath) -> list[Tensor]:
    """One set of input tensors: each random (uniform in [low, high)) or loaded from its .npy file.
    `where` is the specs' place in the scenario (workload.classes[i].tensors), for errors."""
    tensors = []
    for j, spec in enumerate(specs):
        if spec.npy is not None:
            tensors.append(Tensor(spec.name, *_load_npy(scenario.resolve_path(spec.npy), scenario, (*where, j, "npy"))))
            continue
        dtype = DTYPES[spec.datatype]
        if dtype.kind == "f":
            array = rng.uniform(spec.low, spec.high, size=spec.shape).astype(dtype)
        elif dtype.kind == "b":
            array = rng.random(size=spec.shape) < 0.5
        else:
            array = rng.integers(int(spec.low), max(int(spec.high), int(spec.low) + 1), size=spec.shape).astype(dtype)
        tensors.append(Tensor(spec.name, spec.datatype, array))
    return tensors


def _load_npy(path: Path, scenario: Scenario, where: DataPath) -> tuple[str, np.ndarray]:
    """(KServe datatype, array) of a .npy file, its size checked from its header (limits.max_body_bytes)
    before its data is read."""
    try:
        mapped = np.load(path, mmap_mode="r", allow_pickle=False)
        limit = scenario.limits.max_body_bytes
        if mapped.nbytes > limit:
            raise scenario.problem(where, f"{path} holds {mapped.nbytes:,} bytes; the limit is {limit:,} (limits.max_body_bytes)")
        if mapped.dtype not in DATATYPES:
            raise scenario.problem(where, f"{path} holds {mapped.dtype}, which KServe v2 has no datatype for")
        return DATATYPES[mapped.dtype], np.array(mapped)
    except (OSError, ValueError, EOFError) as exc:
        raise scenario.problem(where, f"cannot load {path} ({exc})") from None


def plays_conversations(wc: WorkloadClass) -> bool:
    """Whether a class's sessions play a ShareGPT dataset's conversations (their human turns in order)."""
    return wc.session is not None and wc.dataset is not None and wc.dataset.format == "sharegpt"


class Payloads:
    """Builds each request's payload in a worker. Datasets and tensors are loaded once, here, so a
    broken file fails the run before it starts (the parent builds one to check)."""

    def __init__(self, scenario: Scenario):
        classes = scenario.workload.effective_classes()
        rng = np.random.default_rng(seed_streams(scenario)[len(scenario.phases) + PAYLOAD_STREAM])
        words = np.array(VOCABULARY)[rng.integers(0, len(VOCABULARY), size=TEXT_WORDS)]  # the tensors are drawn after
        if (salt := run_salt(scenario)) is not None:  # other words of the same vocabulary, the same places
            salted = np.random.default_rng([scenario.seed, salt])
            words = np.array(VOCABULARY)[salted.integers(0, len(VOCABULARY), size=TEXT_WORDS)]
        self._words: list[str] = words.tolist()
        self._datasets: list[list[str] | None] = [None] * len(classes)
        self._conversations: list[list[list[str]] | None] = [None] * len(classes)
        self.tokenizer = load_tokenizer(scenario)
        self.counts_output = self.tokenizer is not None  # a client keeps answers' text to count them
        for i, c in enumerate(classes):
            if c.dataset:
                self._datasets[i] = class_prompts(scenario, i).texts
                with scenario.about(("workload", "classes", i, "dataset", "file")):
                    if plays_conversations(c):
                        self._conversations[i] = read_conversations(scenario.resolve_path(c.dataset.file))
        self._prefix_tokens = [c.session.shared_prefix.tokens if c.session and c.session.shared_prefix else 0
                               for c in classes]
        self._prefixes: dict[tuple[int, int], str] = {}
        self._tools = [c.agent.tools if c.agent is not None else None for c in classes]
        self._seed = text_seed(scenario)  # a Mooncake block's words
        self._tensors = [[make_tensors(c.tensors, rng, scenario, ("workload", "classes", i, "tensors"))
                          for _ in range(TENSOR_POOL)] if c.tensors else None for i, c in enumerate(classes)]

    def count_output(self, outcome: Outcome, text: str) -> None:
        """A successful answer the server said no output count for (no usage): its text's tokens,
        counted by workload.tokenizer (`output_by_tokenizer`). Nothing without a tokenizer."""
        if self.tokenizer is not None and outcome.error is None and not outcome.tokens_from_usage:
            outcome.output_tokens = self.tokenizer.count(text)
            outcome.output_by_tokenizer = True

    def synthetic_prompt(self, tokens: int, start: int) -> str:
        """`tokens` words of the synthetic text, from word `start` on (wrapping around)."""
        words, n = self._words, len(self._words)
        start %= n
        if start + tokens <= n:
            return " ".join(words[start : start + tokens])
        return " ".join((words[start:] + words * (tokens // n + 1))[:tokens])

    def prefix(self, cls: int, variant: int) -> str:
        """Shared-prefix variant `variant` of class `cls` (a session's system prompt): the same text
        every time, from a place in the synthetic text that depends only on (class, variant)."""
        key = (cls, variant)
        text = self._prefixes.get(key)
        if text is None:
            start = int(np.random.default_rng([cls, variant]).integers(0, len(self._words)))
            text = self.synthetic_prompt(self._prefix_tokens[cls], start)
            if len(self._prefixes) < MAX_PREFIXES_KEPT:
                self._prefixes[key] = text
        return text

    def tool_descriptions(self, cls: int) -> list[str] | None:
        """An agent class's tools' descriptions (None: the class is no agent): `schema_tokens` words of the
        synthetic text in all, split across its `count` tools, each from a place that depends only on
        (class, tool), so every job of every worker declares the same tools (a prefix cache keeps them)."""
        tools = self._tools[cls]
        if tools is None:
            return None
        size, extra = divmod(tools.schema_tokens, tools.count)
        return [self.synthetic_prompt(size + (i < extra), int(np.random.default_rng([cls, i, 1]).integers(0, len(self._words))))
                for i in range(tools.count)]

    def get(self, request: Request) -> Payload:
        payload = Payload(max_tokens=request.output_tokens or None)
        dataset, tensors = self._datasets[request.cls], self._tensors[request.cls]
        conversations = self._conversations[request.cls]
        if conversations is not None and request.turn:  # a session's turn k: its conversation's k-th human turn
            turns = conversations[request.item % len(conversations)]
            payload.prompt = turns[min(request.turn, len(turns)) - 1]
        elif request.blocks is not None:  # a Mooncake trace's: its blocks' text, shared as the trace shares them
            ids, block_tokens = request.blocks
            payload.prompt = block_prompt(ids, request.prompt_tokens, block_tokens, VOCABULARY, self._seed)
        elif dataset is not None:
            payload.prompt = dataset[request.item % len(dataset)]
        elif request.prompt_tokens:
            payload.prompt = self.synthetic_prompt(request.prompt_tokens, request.item)
        if tensors is not None:
            payload.tensors = tensors[request.item % len(tensors)]
        return payload
