"""`workload.tokenizer`: exact token counts from a local Hugging Face tokenizer.json.

Never downloaded: the file is the scenario's (`{file: path/to/tokenizer.json}`, relative to the
scenario file like a dataset), read with the `tokenizers` library (`pip install 'latscope[tokenizer]'`).
What it counts, and how, is what an OpenAI-compatible server counts (vLLM, SGLang, TGI):

    a prompt (completions, or chat without a template)  len(encode(text, add_special_tokens=True))
                                                         (the tokenizer's post-processor: BOS etc.)
    a chat prompt with `chat_template`                  len(encode(render(messages), add_special_tokens=False))
                                                         (the template writes BOS itself), where messages
                                                         = [{"role": "user", "content": text}] and the
                                                         generation prompt is asked for
    an answer (output tokens, when a server said none)  len(encode(text, add_special_tokens=False))

The chat template is Jinja, rendered as transformers' apply_chat_template does (a sandbox, trim_blocks,
lstrip_blocks, `bos_token`/`eos_token` from the template's config, `raise_exception`); it comes from
`chat_template.file` (a tokenizer_config.json's `chat_template`, or a template file) or, without one,
from the tokenizer file's own top-level `chat_template` (a key `tokenizers` itself does not read).

`cut(text, n)` cuts a prompt to at most n tokens as counted above: at a token boundary of the text
itself (the tokens' offsets, so the text is a prefix of the original, never re-decoded), then
counted again, since a cut text can tokenize differently at its end; the count returned is the cut
text's own. Counting takes a worker's CPU: an answer is counted once, after its end was stamped.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from latscope.errors import ScenarioError

if TYPE_CHECKING:
    from latscope.scenario import Scenario

FIELD = ("workload", "tokenizer", "file")
TEMPLATE_FIELD = ("workload", "tokenizer", "chat_template")
MAX_CUT_TRIES = 8  # recounts of a cut prompt (each drops what is still over: two in practice)


class Tokenizer:
    """A loaded tokenizer.json and, optionally, a chat template."""

    def __init__(self, inner: Any, template: Any = None, specials: dict[str, str] | None = None):
        self._inner = inner
        self._counting = getattr(inner, "encode_batch_fast", inner.encode_batch)  # without offsets: faster (>= 0.20.3)
        self._template = template  # a compiled jinja2 template, or None
        self._specials = specials or {}
        self.has_template = template is not None

    def render(self, text: str) -> str:
        """`text` as the chat template renders one user message with the generation prompt."""
        return self._template.render(messages=[{"role": "user", "content": text}], add_generation_prompt=True,
                                     **self._specials)

    def prompt_counts(self, prompts: list[str], chat: bool) -> list[int]:
        """Each prompt's token count as a server counts it (the module docstring)."""
        if chat and self._template is not None:
            encodings = self._counting([self.render(p) for p in prompts], add_special_tokens=False)
        else:
            encodings = self._counting(prompts, add_special_tokens=True)
        return [len(e.ids) for e in encodings]

    def count(self, text: str) -> int:
        """An answer's tokens (no special tokens added)."""
        return len(self._inner.encode(text, add_special_tokens=False).ids)

    def cut_all(self, texts: list[str], counts: list[int], limit: int, chat: bool) -> tuple[list[str], list[int]]:
        """`cut` of every text whose count (`counts`, prompt_counts') is over `limit`, in batches:
        (the texts, their counts)."""
        over = [i for i, n in enumerate(counts) if n > limit]
        if not over:
            return texts, counts
        texts, counts = list(texts), list(counts)
        cut = []
        for i, encoding in zip(over, self._inner.encode_batch([texts[i] for i in over], add_special_tokens=False)):
            keep = len(encoding.offsets) - (counts[i] - limit)  # the template's and special tokens stay
            cut.append(texts[i][: encoding.offsets[keep - 1][1]] if keep > 0 else "")
        for i, text, n in zip(over, cut, self.prompt_counts(cut, chat)):
            texts[i], counts[i] = self.cut(text, limit, chat) if n > limit else (text, n)  # rarely: the end retokenized
        return texts, counts

    def cut(self, text: str, limit: int, chat: bool) -> tuple[str, int]:
        """(text cut to at most `limit` tokens as prompt_counts counts them, its count); ("", n) when
        even an empty text is over the limit (a template's own tokens)."""
        count = self.prompt_counts([text], chat)[0]
        offsets = self._inner.encode(text, add_special_tokens=False).offsets
        keep = len(offsets)
        for _ in range(MAX_CUT_TRIES):
            if count <= limit:
                return text, count
            keep -= count - limit
            if keep <= 0:
                return "", self.prompt_counts([""], chat)[0]
            text = text[: offsets[keep - 1][1]]
            count = self.prompt_counts([text], chat)[0]
        raise ScenarioError(f"cannot cut a prompt to {limit} tokens: its count would not settle")


def load_tokenizer(scenario: Scenario) -> Tokenizer | None:
    """The scenario's workload.tokenizer (None: none), loaded once per process and file. A problem
    is a ScenarioError naming the scenario's line and field."""
    spec = scenario.workload.tokenizer
    if spec is None:
        return None
    path = scenario.resolve_path(spec.file)
    template = None if spec.chat_template is None else spec.chat_template.file
    template_path = None if template is None else scenario.resolve_path(template)
    try:
        stat = path.stat()
    except OSError:
        raise scenario.problem(FIELD, f"tokenizer file {path}: not found (a local tokenizer.json: latscope never "
                                      "downloads one)") from None
    try:
        return _load(path, stat.st_mtime_ns, stat.st_size, spec.chat_template is not None, template_path)
    except _TemplateProblem as exc:
        raise scenario.problem(TEMPLATE_FIELD, str(exc)) from None
    except ScenarioError as exc:
        raise scenario.problem(FIELD, str(exc)) from None


class _TemplateProblem(ScenarioError):
    pass


@lru_cache(maxsize=4)
def _load(path: Path, _mtime: int, _size: int, with_template: bool, template_path: Path | None) -> Tokenizer:
    try:
        from tokenizers import Tokenizer as HfTokenizer
    except ImportError:
        raise ScenarioError("workload.tokenizer needs the `tokenizers` library: pip install 'latscope[tokenizer]'") from None
    try:
        doc = json.loads(path.read_text())
        if not isinstance(doc, dict):
            raise ValueError("not a JSON object")
        own = doc.pop("chat_template", None)  # `tokenizers` refuses keys it does not know
        inner = HfTokenizer.from_str(json.dumps(doc))
    except Exception as exc:  # the Rust side raises plain Exception for a malformed file
        raise ScenarioError(f"tokenizer file {path}: not a Hugging Face tokenizer.json ({exc})") from None
    if not with_template:
        return Tokenizer(inner)
    source, config = _template_source(path, own, template_path)
    return Tokenizer(inner, _compile(source, path if template_path is None else template_path), _specials(config))


def _template_source(path: Path, own: Any, template_path: Path | None) -> tuple[str, dict]:
    """(the template's Jinja text, the config it came with) from chat_template.file or the tokenizer file."""
    if template_path is None:
        if not isinstance(own, str) or not own:
            raise _TemplateProblem(f"chat_template: true, but {path} carries no `chat_template`: give the model's "
                                   "tokenizer_config.json as chat_template: {file: ...}")
        return own, {}
    try:
        text = template_path.read_text()
    except OSError as exc:
        raise _TemplateProblem(f"chat template file {template_path}: cannot read it ({exc.strerror or exc})") from None
    if template_path.suffix != ".json":
        return text, {}
    try:
        config = json.loads(text)
    except ValueError as exc:
        raise _TemplateProblem(f"chat template file {template_path}: not JSON ({exc})") from None
    found = config.get("chat_template") if isinstance(config, dict) else None
    if isinstance(found, list):  # [{name, template}, ...]: the default one
        found = next((t.get("template") for t in found if isinstance(t, dict) and t.get("name") == "default"), None)
    if not isinstance(found, str) or not found:
        raise _TemplateProblem(f"chat template file {template_path}: no `chat_template` in it")
    return found, config


def _specials(config: dict) -> dict[str, str]:
    """bos_token / eos_token of a tokenizer_config.json (a string, or {"content": ...})."""
    out = {}
    for name in ("bos_token", "eos_token"):
        value = config.get(name)
        value = value.get("content") if isinstance(value, dict) else value
        out[name] = value if isinstance(value, str) else ""
    return out


def _compile(source: str, where: Path) -> Any:
    try:
        from jinja2 import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        raise _TemplateProblem("a chat template needs the `jinja2` library: pip install jinja2") from None

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    env.filters["tojson"] = lambda value, indent=None: json.dumps(value, ensure_ascii=False, indent=indent)
    try:
        template = env.from_string(source)
        template.render(messages=[{"role": "user", "content": "x"}], add_generation_prompt=True,
                        bos_token="", eos_token="")
    except TemplateError as exc:
        raise _TemplateProblem(f"the chat template of {where} does not render one user message ({exc})") from None
    return template
