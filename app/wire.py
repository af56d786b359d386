"""The service's wire: newline-delimited JSON, one object a line, at most MAX_MESSAGE bytes.

Request `{"v": 1, "id": 7, "op": "book", "args": {...}}`; reply `{"id": 7, "ok": true, "result": ...}`
or `{"id": 7, "ok": false, "error": {"code": 3, "message": "..."}}`, where the code is the CLI's
exit code; a refused booking's error also carries `earliest`, the arguments of the `earliest` operation that words
the message's second half when a client shows it. Streams (`subscribe`, `register`) reply once, then send `{"event": ...}` lines.
Both sides import this module, so it stays on the client's quick path: json only. The clients word the stamps
in what the service says (app.client.stamps).
"""

from __future__ import annotations

import json

VERSION = 1
VERSIONS = (1,)
MAX_MESSAGE = 1 << 20


def encode(message: dict) -> bytes:
    # ensure_ascii: other users' text stays inert bytes on the wire and on any terminal.
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


def decode(line: bytes | str) -> dict:
    """One message; ValueError for anything that is not one JSON object of valid Unicode text."""
    try:
        message = json.loads(line)
    except RecursionError:  # [[[[... nested deeper than the parser goes: still just bad input
        raise ValueError("a message nests too deeply") from None
    if not isinstance(message, dict):
        raise ValueError("a message is one JSON object")
    # Only a \u escape can make a lone surrogate (the bytes are UTF-8), so most lines skip the walk.
    escaped = b"\\u" in line if isinstance(line, bytes) else "\\u" in line
    if escaped and not _unicode(message):
        raise ValueError("a message's text has a lone surrogate (\\ud800-\\udfff), which is not Unicode text")
    return message


def _unicode(value: object) -> bool:
    """No string in it (keys included) holds a lone surrogate, which SQLite, UTF-8 and terminals cannot take."""
    todo = [value]
    while todo:  # a loop, not recursion: the message may nest as deep as the parser went
        item = todo.pop()
        if isinstance(item, str):
            if not item.isascii():
                try:
                    item.encode()
                except UnicodeEncodeError:
                    return False
        elif isinstance(item, list):
            todo.extend(item)
        elif isinstance(item, dict):
            todo.extend(item)
            todo.extend(item.values())
    return True
