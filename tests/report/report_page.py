"""Reading a written report page in tests: one panel's section, its start tags, the figures' JSON, a figure's data."""

from __future__ import annotations

import base64
import json
from html.parser import HTMLParser

import numpy as np

FIGURES_MARKER = '<script type="application/json" id="latscope-figures">'


def panel_section(page: str, sid: str) -> str:
    """The `<section id=sid>` of the page, whole."""
    start = page.index(f'<section id="{sid}">')
    return page[start:page.index("</section>", start) + len("</section>")]


def start_tags(page: str) -> list[tuple[str, dict]]:
    """Every start tag of `page` as parsed, (tag, its attributes), in order."""
    tags: list[tuple[str, dict]] = []

    class Parser(HTMLParser):
        def handle_starttag(self, tag, attrs):  # noqa: ANN001 - HTMLParser's
            tags.append((tag, dict(attrs)))

    parser = Parser()
    parser.feed(page)
    parser.close()
    return tags


def page_figures(page: str) -> dict:
    """The page's figures by plot id (the JSON the page draws them from)."""
    start = page.index(FIGURES_MARKER) + len(FIGURES_MARKER)
    return json.loads(page[start:page.index("</script>", start)])["figures"]


def figure_array(data) -> np.ndarray:  # noqa: ANN001 - a list or plotly's {"dtype", "bdata"}
    """A figure's data array as floats: a list (None as NaN), or plotly's base64 form of a numpy one."""
    if isinstance(data, dict):
        return np.frombuffer(base64.b64decode(data["bdata"]), dtype=data["dtype"]).astype(float)
    return np.asarray([np.nan if v is None else v for v in data], float)
