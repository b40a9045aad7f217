"""Build a local Hugging Face tokenizer that counts tokens the way the reference server does.

Why: independent load generators (guidellm, NVIDIA aiperf) need a tokenizer to synthesize
prompts of N tokens and to count output tokens. They load it with
``transformers.AutoTokenizer.from_pretrained``, which normally downloads one from the Hugging
Face Hub -- impossible on an offline machine, and a real model's tokenizer (BPE) would not count
tokens like the reference server anyway. The reference server's toy tokenizer is *one token per
whitespace-separated word* (see reference_server/README.md, "Text generation"). This script
writes a ``WordLevel`` model with a ``WhitespaceSplit`` pre-tokenizer, so:

* a prompt the tool builds as N tokens is exactly N whitespace-separated words, i.e. an N-token
  prefill on the server (``decode`` joins tokens with single spaces, ``encode`` splits on
  whitespace; words outside the vocabulary become ``[UNK]``, still exactly one token/word);
* every generated pseudo-word the server streams back counts as one token.

The vocabulary is the ``--vocab-size`` most frequent words of the ``--corpus`` files (if given),
topped up with pseudo-words ``w0``, ``w1``, ... It only affects what the prompts *look* like, not
how many tokens they have. There are no special tokens at all: ``[UNK]`` (id 0) is an ordinary
word, so ``decode(..., skip_special_tokens=True)`` keeps it; no BOS/EOS is added to prompts.

Usage::

    python benchmarks/tokenizer_for_reference_server.py /tmp/refserver-tokenizer \
        [--vocab-size 4096] [--corpus some_text.txt ...]

Load it with ``HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1`` and
``AutoTokenizer.from_pretrained("/tmp/refserver-tokenizer")``. Only needs the ``tokenizers``
package (both tools' venvs have it); the self-check also uses ``transformers`` when present.
"""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path

from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import WhitespaceSplit

UNK = "[UNK]"
CONTEXT_TOKENS = 1024  # the reference decoder's context length


def build_vocab(vocab_size: int, corpora: list[Path]) -> dict[str, int]:
    """Return ``{word: id}``: ``[UNK]`` first, then frequent corpus words, then pseudo-words."""
    counts: collections.Counter[str] = collections.Counter()
    for path in corpora:
        counts.update(path.read_text(encoding="utf-8", errors="replace").split())
    vocab: dict[str, int] = {UNK: 0}
    for word, _ in counts.most_common():
        if len(vocab) >= vocab_size:
            break
        if word != UNK:
            vocab[word] = len(vocab)
    i = 0
    while len(vocab) < vocab_size:
        vocab.setdefault(f"w{i}", len(vocab))
        i += 1
    return vocab


def build_tokenizer(out_dir: Path, vocab_size: int = 4096, corpora: list[Path] | None = None) -> Path:
    """Write tokenizer.json, tokenizer_config.json and special_tokens_map.json into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(WordLevel(vocab=build_vocab(vocab_size, corpora or []), unk_token=UNK))
    tok.pre_tokenizer = WhitespaceSplit()
    # No decoder: tokenizers then joins decoded tokens with single spaces.
    # [UNK] is deliberately NOT registered as a special token: tools decode synthetic prompts
    # with skip_special_tokens=True (guidellm does), which would silently drop every [UNK] and
    # shrink a 128-token prompt to however many words happened to be in the vocabulary.
    tok.save(str(out_dir / "tokenizer.json"))

    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": CONTEXT_TOKENS,
        "clean_up_tokenization_spaces": False,  # keep " ," etc. as separate words
        "add_bos_token": False,
        "add_eos_token": False,
        "padding_side": "left",
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out_dir / "special_tokens_map.json").write_text("{}\n")  # no special tokens (see above)
    return out_dir


def self_check(out_dir: Path) -> None:
    """Assert that N words <-> N tokens and that decode(encode(text)) is space-joined words."""
    text = "the quick brown fox , jumps over   the lazy\tdog qwertyuiop w3"
    words = text.split()
    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(out_dir))
        ids = tok.encode(text, add_special_tokens=False)
        back = tok.decode(ids, skip_special_tokens=True)
        kind = type(tok).__name__
    except ImportError:
        raw = Tokenizer.from_file(str(out_dir / "tokenizer.json"))
        ids = raw.encode(text, add_special_tokens=False).ids
        back = raw.decode(ids, skip_special_tokens=True)
        kind = "tokenizers.Tokenizer"
    assert len(ids) == len(words), (len(ids), len(words))
    assert len(back.split()) == len(words) and back == " ".join(back.split()), back
    print(f"ok: {kind} from {out_dir}: {len(words)} words -> {len(ids)} tokens -> {back!r}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", type=Path, help="directory to write the tokenizer into")
    parser.add_argument("--vocab-size", type=int, default=4096)
    parser.add_argument("--corpus", type=Path, action="append", default=[],
                        help="text file(s) whose most frequent words make up the vocabulary")
    args = parser.parse_args()
    build_tokenizer(args.out_dir, args.vocab_size, args.corpus)
    self_check(args.out_dir)


if __name__ == "__main__":
    main()
