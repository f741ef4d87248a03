"""Verdict glyphs: inline SVG for the HTML report (no font can be missing), narrow
characters for the terminal and Markdown."""

from __future__ import annotations

# every verdict a cell can have, in the order reports list them (harness.matrix.verdict names
# each one)
VERDICTS = ("pass", "fail", "crash", "hang", "error", "skip")

# One column wide in a terminal (no emoji), so rich grids keep their alignment.
SYMBOL = {"pass": "✔", "fail": "✘", "crash": "✸", "hang": "⧗", "error": "⚠", "skip": "–"}
COLOUR = {"pass": "#c8f7c5", "fail": "#f7c5c5", "crash": "#f79f9f", "hang": "#f7e3a1",
          "error": "#f7d1a1", "skip": "#e4e4e4"}
INK = {"pass": "#1b7a1b", "fail": "#b01818", "crash": "#8a0000", "hang": "#8a6200",
       "error": "#a85400", "skip": "#555555"}

# 16x16 drawings, none of them a box (a box is what a missing glyph looks like)
_PATHS = {
    "pass": "<path d='M2 9l4 4 8-10' fill='none' stroke-width='2.4' stroke-linecap='round' "
            "stroke-linejoin='round'/>",
    "fail": "<path d='M3 3l10 10M13 3L3 13' fill='none' stroke-width='2.4' "
            "stroke-linecap='round'/>",
    "crash": "<path d='M8 0l1.8 4.6L14.6 2.6 12 7l4 1.6-4.4 1.2 2 4.6-4.4-2.4L8 16l-1.2-4-4.4 "
             "2.4 2-4.6L0 8.6 4 7 1.4 2.6l4.8 2z' stroke='none'/>",
    "hang": "<path d='M3 1.5h10M3 14.5h10M4 2c0 4 8 4 8 12M12 2c0 4-8 4-8 12' fill='none' "
            "stroke-width='1.8' stroke-linecap='round'/>",
    "error": "<path d='M8 1.5L15 14.5H1z' fill='none' stroke-width='1.8' "
             "stroke-linejoin='round'/><path d='M8 6v4.2M8 12.2v.4' fill='none' "
             "stroke-width='2' stroke-linecap='round'/>",
    "skip": "<path d='M3 8h10' fill='none' stroke-width='2.4' stroke-linecap='round'/>",
}


def svg_defs() -> str:
    """The glyph symbols, once per page (each use is then a short <use>)."""
    symbols = "".join(f"<symbol id='glyph-{v}' viewBox='0 0 16 16'>{p}</symbol>"
                      for v, p in _PATHS.items())
    return f"<svg width='0' height='0' style='position:absolute' aria-hidden='true'>{symbols}</svg>"


def svg_glyph(verdict: str) -> str:
    """An inline glyph for ``verdict`` (class ``glyph`` marks it for the browser check)."""
    ink = INK.get(verdict, "#000")
    return (f"<svg class='glyph' data-verdict='{verdict}' width='14' height='14' "
            f"viewBox='0 0 16 16' role='img' aria-label='{verdict}' fill='{ink}' "
            f"stroke='{ink}'><use href='#glyph-{verdict}'/></svg>")
