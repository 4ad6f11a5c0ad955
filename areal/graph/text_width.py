"""How wide a line of SVG text will be, estimated without font metrics (none are at hand where a picture is
drawn), and how to make a renderer fit it anyway. The layout (layout.py) sizes boxes and places labels by it.
"""

from __future__ import annotations

CHAR_W = 7.0  # 12 px text: the width of most glyphs (DejaVu Sans, the widest of the usual stand-ins for Helvetica)
BOLD = 1.18  # how much wider bold is
NARROW, WIDE = set("ijlftrI.,:;!|()[]{}' "), set("mwMW")  # glyphs about half as wide, and half again as wide


def text_width(text: str, bold: bool = False) -> float:
    """An estimate that errs wide: no font metrics are at hand, and a label cut short is worse than a gap."""
    width = sum(CHAR_W * (0.55 if c in NARROW else 1.45 if c in WIDE else 1.2 if c.isupper() else 1.0) for c in text)
    return width * (BOLD if bold else 1.0)


def fitted(text: str, room: float, bold: bool = True) -> str:
    """SVG attributes that squeeze text into `room` when the estimate says it may not fit, whatever the font."""
    if text_width(text, bold) <= room * 0.9:
        return ""
    return f' textLength="{min(room, text_width(text, bold)):.1f}" lengthAdjust="spacingAndGlyphs"'
