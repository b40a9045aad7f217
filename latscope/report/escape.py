"""The report's two escapers, for text that came from a scenario or a target (scenario, class, phase
and replica names, error messages, URLs). They differ only in quotes, and each is correct in
different places:

- `esc_html`: anywhere in HTML, text and attribute values alike (quotes escaped too).
- `esc_label`: plotly labels (titles, legends, annotations, hover text), and HTML text outside
  attribute values. plotly renders a subset of HTML tags and decodes &lt; &gt; &amp;, but shows
  &quot; literally, so quotes are left as they are.
"""

from __future__ import annotations

import html


def esc_html(value: object) -> str:
    """Text from a scenario or a target, safe anywhere in HTML: in text and in (quoted) attribute
    values, since '&', '<', '>', '"' and "'" are all escaped."""
    return html.escape(str(value), quote=True)


def esc_label(value: object) -> str:
    """Text from a scenario or a target, safe in plotly labels and in HTML text (not in attribute
    values). Quotes are left as they are: plotly decodes &lt; &gt; &amp; but shows &quot; literally,
    and without a '<' no tag can start."""
    return html.escape(str(value), quote=False)
