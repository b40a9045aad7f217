"""summary.json's `tokens.<class>.counts`: where a class's token counts came from, and how far the
server's counts were from the plan (the counters intervals.py keeps: results.schema.TOKEN_SOURCE_COUNTERS).

    prompt.source   "usage" (every count the server's), "plan" (none was: the plan's lengths stand in,
                    the synthetic prompt's words), "tokenizer" (none was, and the plan's are
                    workload.tokenizer's counts of a dataset's prompts), "mixed", "none" (no prompt)
    prompt.mean_difference   Σ(server − plan) / checked, over requests with both (null: none)
    prompt.worst_difference  the server − plan of largest size (+: the server counted more), exact:
                    its two halves are max counters, merged by taking the larger (schema.add_counters)
    output.source   "usage", "tokenizer" (the answer's text counted), "chunks" (a stream's chunks
                    counted: a server may pack several tokens in one), "mixed", "none" (not counted)
    output.short    answers with fewer tokens than the max_tokens asked (counted by usage or the
                    tokenizer), mean_shortfall their mean tokens short; `hint` says how to make a
                    server generate every token asked (ignore_eos / min_tokens)
"""

from __future__ import annotations

import numpy as np

from latscope.results.schema import (ALL, COUNTERS, OUTPUT_BY_TOKENIZER, OUTPUT_CHECKED, OUTPUT_FROM_CHUNKS,
                                     OUTPUT_FROM_USAGE, OUTPUT_LONG, OUTPUT_SHORT, OUTPUT_SHORT_TOKENS,
                                     OUTPUT_UNCOUNTED, PROMPT_ABOVE, PROMPT_ABOVE_MAX, PROMPT_BELOW, PROMPT_BELOW_MAX,
                                     PROMPT_CHECKED, PROMPT_DIFFER, PROMPT_FROM_PLAN, PROMPT_FROM_USAGE, add_counters)

EARLY_STOP_HINT = ("the server ended answers before max_tokens (an end-of-sequence token): to measure answers of the "
                   "planned length, ask it to ignore EOS, e.g. openai.extra_body: {ignore_eos: true} (vLLM, SGLang) "
                   "or {min_tokens: N} (vLLM)")


def _source(parts: dict[str, int]) -> str:
    seen = [name for name, n in parts.items() if n]
    return seen[0] if len(seen) == 1 else "mixed" if seen else "none"


def token_counts(rows: dict[str, np.ndarray], tokenizer_classes: set[str]) -> dict[str, dict]:
    """Per class (rows: its COUNTERS outside warm-up) and "all": the `counts` entry (module docstring).
    `tokenizer_classes`: the classes whose planned prompt lengths are the tokenizer's."""
    rows = dict(rows)
    every = np.zeros(len(COUNTERS), np.int64)
    for row in rows.values():
        every = add_counters(every, row)
    rows[ALL] = every
    out = {}
    for name, r in rows.items():
        plan = int(r[PROMPT_FROM_PLAN])
        if name == ALL:
            by_tokenizer = sum(int(rows[n][PROMPT_FROM_PLAN]) for n in rows if n in tokenizer_classes)
        else:
            by_tokenizer = plan if name in tokenizer_classes else 0
        checked, above, below = int(r[PROMPT_CHECKED]), int(r[PROMPT_ABOVE_MAX]), int(r[PROMPT_BELOW_MAX])
        prompt = {"source": _source({"usage": int(r[PROMPT_FROM_USAGE]), "tokenizer": by_tokenizer,
                                     "plan": plan - by_tokenizer}),
                  "from_usage": int(r[PROMPT_FROM_USAGE]), "from_plan": plan, "checked": checked,
                  "differ": int(r[PROMPT_DIFFER]),
                  "mean_difference": round((int(r[PROMPT_ABOVE]) - int(r[PROMPT_BELOW])) / checked, 3) if checked else None,
                  "worst_difference": (above if above >= below else -below) if checked else None}
        out_checked, short = int(r[OUTPUT_CHECKED]), int(r[OUTPUT_SHORT])
        output = {"source": _source({"usage": int(r[OUTPUT_FROM_USAGE]), "tokenizer": int(r[OUTPUT_BY_TOKENIZER]),
                                     "chunks": int(r[OUTPUT_FROM_CHUNKS]), "none": 0}),
                  "from_usage": int(r[OUTPUT_FROM_USAGE]), "by_tokenizer": int(r[OUTPUT_BY_TOKENIZER]),
                  "from_chunks": int(r[OUTPUT_FROM_CHUNKS]), "uncounted": int(r[OUTPUT_UNCOUNTED]),
                  "checked": out_checked, "short": short, "long": int(r[OUTPUT_LONG]),
                  "mean_shortfall": round(int(r[OUTPUT_SHORT_TOKENS]) / short, 3) if short else None,
                  "hint": EARLY_STOP_HINT if short else None}
        if not output["from_usage"] + output["by_tokenizer"] + output["from_chunks"] and output["uncounted"]:
            output["source"] = "none"
        out[name] = {"prompt": prompt, "output": output}
    return out


def count_lines(tokens: dict) -> list[str]:
    """The console's lines: per class, where its counts came from and how far the server's were off."""
    lines = []
    for cls, entry in tokens.items():
        counts = entry.get("counts") if isinstance(entry, dict) else None
        if not counts or (cls == ALL and len(tokens) <= 2):
            continue
        p, o = counts["prompt"], counts["output"]
        if p["source"] == "none" and o["source"] == "none":
            continue
        text = f"token counts {cls}: prompt from {_said(p['source'])}"
        if p["checked"]:
            text += (f" (server vs plan: mean {p['mean_difference']:+g}, worst {p['worst_difference']:+d} tokens, "
                     f"{p['differ']:,} of {p['checked']:,} differ)")
        text += f"; output from {_said(o['source'])}"
        if o["checked"]:
            text += f" ({o['short']:,} of {o['checked']:,} shorter than max_tokens"
            text += f", {o['mean_shortfall']:g} tokens short on average)" if o["short"] else ")"
        lines.append(text)
        if o["hint"] and cls != ALL:
            lines.append(f"  hint: {o['hint']}")
    return lines


def _said(source: str) -> str:
    return {"usage": "the server's usage", "plan": "the plan (the server sent no usage)",
            "tokenizer": "workload.tokenizer (the server sent no usage)", "chunks": "counted chunks",
            "mixed": "mixed sources", "none": "nowhere (not counted)"}[source]
