"""The use-case presets (latscope/presets/NAME.yaml, shipped in the package so a pip user has them)
and `retarget`: a preset pointed at another endpoint, its comments kept.

Why edit the text rather than load and dump it: a preset's comments say where its SLOs come from
and what each request models, which is what a user starting from it needs to read. The edits are to
lines whose shape every preset shares (`  url:`, `  protocol:`, `  model:` under `target:`, the
`  launch:` block, a class's `tensors:` list); tests/init checks each preset survives them.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from latscope.errors import ScenarioError
from latscope.init.probe import Input
from latscope.init.starters import SEQUENCE, tensor_line, scalar

PRESETS_DIR = Path(__file__).resolve().parents[1] / "presets"


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESETS_DIR.glob("*.yaml"))


def preset_text(name: str) -> str:
    """The preset's file; ScenarioError naming the valid ones for an unknown name."""
    if name not in preset_names():
        raise ScenarioError(f"unknown use case {name!r}: the presets are {', '.join(preset_names())}")
    return (PRESETS_DIR / f"{name}.yaml").read_text(encoding="utf-8")


def preset_protocol(text: str) -> str:
    return (yaml.safe_load(text).get("target") or {}).get("protocol", "http")


def retarget(text: str, url: str, protocol: str, model: str | None, inputs: list[Input] | None) -> tuple[str, list[str]]:
    """The preset `text` pointed at `url` (in `protocol`: a KServe v2 preset also goes over gRPC),
    its launch section removed, its model and (when the model's input names differ from the
    preset's) its tensors replaced. Also what was changed, a line each."""
    lines = text.splitlines()
    changes = [f"target.url: {url}", "target.launch: removed (the endpoint runs already)"]
    lines = _set_target_key(lines, "url", scalar(url))
    if protocol != preset_protocol(text):
        lines = _set_target_key(lines, "protocol", protocol)
        changes.append(f"target.protocol: {protocol}")
    if model is not None and model != (yaml.safe_load(text).get("target") or {}).get("model"):
        lines = _set_target_key(lines, "model", scalar(model))
        changes.append(f"target.model: {model}")
    lines = _drop_block(lines, 0, "  launch:")
    if "@" in url.split("://", 1)[-1].split("/", 1)[0]:  # userinfo: basic authentication, and a key besides is an error
        lines = [line for line in lines if not line.startswith("  api_key:")]
    data = yaml.safe_load("\n".join(lines))
    preset_inputs = {t["name"] for c in data["workload"].get("classes", []) for t in c.get("tensors", [])}
    if inputs and preset_inputs and {t.name for t in inputs} != preset_inputs:
        start = next(i for i, line in enumerate(lines) if line.strip() == "tensors:")
        end = _block_end(lines, start)
        note = (f"{' ' * (len(lines[start]) - len(lines[start].lstrip()))}# The model's inputs from its metadata "
                f"(the preset's did not match); a dimension of any size (-1) became 1 (batch) or {SEQUENCE}.")
        lines[start + 1:end] = [note] + [tensor_line(t, reference=False) for t in inputs]
        changes.append(f"workload tensors: the model's inputs ({', '.join(t.name for t in inputs)})")
    return "\n".join(lines) + "\n", changes


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _block_end(lines: list[str], start: int) -> int:
    """The index after the block that `lines[start]` opens: the lines indented deeper than it
    (comments and blank lines inside it included)."""
    depth, end = _indent(lines[start]), start + 1
    for i in range(start + 1, len(lines)):
        stripped = lines[i].strip()
        if stripped and not stripped.startswith("#") and _indent(lines[i]) <= depth:
            break
        if stripped:
            end = i + 1
    return end


def _target_range(lines: list[str]) -> tuple[int, int]:
    start = next((i for i, line in enumerate(lines) if line.rstrip() == "target:"), None)
    if start is None:
        raise ScenarioError("the preset has no `target:` section written as a block")
    return start, _block_end(lines, start)


def _set_target_key(lines: list[str], key: str, value: str) -> list[str]:
    """`  key: value` in the target section: replaced (a trailing comment dropped) or added first."""
    start, end = _target_range(lines)
    for i in range(start + 1, end):
        if lines[i].startswith(f"  {key}:"):
            return lines[:i] + [f"  {key}: {value}"] + lines[i + 1:]
    return lines[:start + 1] + [f"  {key}: {value}"] + lines[start + 1:]


def _drop_block(lines: list[str], after: int, opener: str) -> list[str]:
    """`lines` without the block opened by the first line equal to `opener` after index `after`."""
    for i in range(after, len(lines)):
        if lines[i].rstrip() == opener:
            return lines[:i] + lines[_block_end(lines, i):]
    return lines
