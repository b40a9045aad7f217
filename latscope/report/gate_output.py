"""The gate's verdict in the forms CI reads: a plain-text table, JUnit XML (one testcase per check),
Markdown for $GITHUB_STEP_SUMMARY, and GitHub Actions `::error` / `::warning` annotations."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from latscope.analysis.gate import FAIL, INCONCLUSIVE, PASS, GateResult

_MARK = {PASS: "PASS", FAIL: "FAIL", INCONCLUSIVE: "INCONCLUSIVE"}
_EMOJI = {PASS: "✅", FAIL: "❌", INCONCLUSIVE: "⚠️"}
HEADLINE = {
    "pass": "gate passed",
    "slo_breach": "gate failed: SLO breach",
    "regression": "gate failed: regression against the baseline",
    "inconclusive": "gate inconclusive: the measurement cannot decide",
    "invalid": "gate failed: invalid measurement",
}


def text_table(result: GateResult) -> str:
    """One line per check, status first, then the reason; the outcome last."""
    width = max((len(_MARK[c.status]) for c in result.checks), default=4)
    lines = [f"{_MARK[c.status]:<{width}}  {c.kind:<10}  {c.message}" for c in result.checks]
    lines.append(HEADLINE[result.outcome])
    return "\n".join(lines)


def junit_xml(result: GateResult, suite: str = "latscope gate") -> str:
    """JUnit XML: a <testsuite> with one <testcase> per check; a failed check is a <failure>, an
    inconclusive one an <error> (CI systems show both as not passing, and tell them apart)."""
    failures = sum(c.status == FAIL for c in result.checks)
    errors = sum(c.status == INCONCLUSIVE for c in result.checks)
    root = ET.Element("testsuites", name=suite, tests=str(len(result.checks)), failures=str(failures), errors=str(errors))
    ts = ET.SubElement(root, "testsuite", name=suite, tests=str(len(result.checks)), failures=str(failures), errors=str(errors))
    for c in result.checks:
        case = ET.SubElement(ts, "testcase", classname=f"latscope.gate.{c.kind}", name=c.name)
        if c.status == FAIL:
            ET.SubElement(case, "failure", message=c.message, type=c.kind).text = c.message
        elif c.status == INCONCLUSIVE:
            ET.SubElement(case, "error", message=c.message, type="inconclusive").text = c.message
        else:
            ET.SubElement(case, "system-out").text = c.message
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ").replace("<", "&lt;").replace(">", "&gt;")


def markdown(result: GateResult) -> str:
    """A Markdown summary (a heading and a table) for $GITHUB_STEP_SUMMARY or a merge-request note."""
    out = [f"### latscope: {HEADLINE[result.outcome]}", "", "| | check | why |", "| --- | --- | --- |"]
    for c in result.checks:
        out.append(f"| {_EMOJI[c.status]} | {_md_cell(c.name)} | {_md_cell(c.message)} |")
    return "\n".join(out) + "\n"


def _escape_data(text: str) -> str:
    """GitHub workflow-command escaping of the message part."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    """... and of a property value (title=...), where ':' and ',' are separators."""
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def github_annotations(result: GateResult) -> list[str]:
    """`::error` for each failed check, `::warning` for each inconclusive one (print them to stdout
    when GITHUB_ACTIONS=true)."""
    level = {FAIL: "error", INCONCLUSIVE: "warning"}
    return [f"::{level[c.status]} title={_escape_property('latscope gate ' + c.name)}::{_escape_data(c.message)}"
            for c in result.checks if c.status in level]
