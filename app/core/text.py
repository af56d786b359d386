"""Text from other users, made inert for terminals: no escape sequences, no invisible or bidi tricks."""

from __future__ import annotations

import unicodedata

_SAFE_FORMAT = {"\u200d"}  # zero-width joiner inside emoji sequences is harmless; everything else Cf is shown


def inert(text: str, limit: int | None = None) -> str:
    """Control characters (C0, C1, DEL) and format characters (bidi overrides, zero-width) become visible escapes."""
    out = []
    for char in text:
        category = unicodedata.category(char)
        if category == "Cc" or (category == "Cf" and char not in _SAFE_FORMAT) or category in ("Zl", "Zp"):
            out.append(f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}")
        else:
            out.append(char)
    result = "".join(out)
    if limit is not None and len(result) > limit:
        result = result[: max(limit - 1, 0)] + "…"
    return result
