"""The service's wire: newline-delimited JSON, one object a line, at most MAX_MESSAGE bytes.

Request `{"v": 1, "id": 7, "op": "book", "args": {...}}`; reply `{"id": 7, "ok": true, "result": ...}`
or `{"id": 7, "ok": false, "error": {"code": 3, "message": "..."}}`, where the code is the CLI's
exit code; a refused booking's error also carries `earliest`, the arguments of the `earliest` operation that words
the message's second half when a client shows it. Streams (`subscribe`, `register`) reply once, then send `{"event": ...}` lines.
Both sides import this module, so it stays on the client's quick path. The clients word the stamps in what the
service says (app.client.stamps).

It reads and writes JSON with the json package's own C parts (_json), not through the package: json's modules import
re and enum, which cost a quick command more than its request (issue 37). Same output as json.dumps, byte for byte
(tests/unit/test_wire.py compares them); malformed input alone loads json.decoder, for its error.
"""

from __future__ import annotations

from _json import encode_basestring_ascii, make_encoder, make_scanner

VERSION = 1
VERSIONS = (1,)
MAX_MESSAGE = 1 << 20
WHITESPACE = " \t\n\r"  # what JSON allows around a value


def _unserialisable(value: object) -> object:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


class _Parsing:
    """What the C scanner reads off json.JSONDecoder: json.loads's defaults (NaN and Infinity read as floats)."""

    strict = True  # control characters inside strings are refused
    object_hook = object_pairs_hook = None
    parse_float, parse_int = float, int
    parse_constant = {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}.__getitem__


_scan = make_scanner(_Parsing())  # type: ignore[arg-type]  # typeshed wants a scanner as its own context


def encode(message: dict) -> bytes:
    """One line, as json.dumps(message, separators=(",", ":")) writes it: ensure_ascii, so other users' text stays
    inert bytes on the wire and on any terminal."""
    chunks = make_encoder({}, _unserialisable, encode_basestring_ascii, None, ":", ",", False, False, True)(message, 0)
    return "".join(chunks).encode() + b"\n"


def document(value: object) -> str:
    """A --json command's document, as json.dumps(value, indent=2) writes it (ensure_ascii, NaN as NaN)."""
    return "".join(_indented(value, "\n"))


def _indented(value: object, newline: str):
    if isinstance(value, str):
        yield encode_basestring_ascii(value)
    elif isinstance(value, dict) and value:
        inner = newline + "  "
        yield "{"
        for n, (key, item) in enumerate(value.items()):
            yield ("," if n else "") + inner + encode_basestring_ascii(_key(key)) + ": "
            yield from _indented(item, inner)
        yield newline + "}"
    elif isinstance(value, (list, tuple)) and value:
        inner = newline + "  "
        yield "["
        for n, item in enumerate(value):
            yield ("," if n else "") + inner
            yield from _indented(item, inner)
        yield newline + "]"
    elif isinstance(value, (dict, list, tuple)):
        yield "{}" if isinstance(value, dict) else "[]"
    else:
        yield _scalar(value)


def _scalar(value: object) -> str:
    if value is None:
        return "null"
    if value is True or value is False:
        return "true" if value else "false"
    if isinstance(value, int):
        return int.__repr__(value)
    if isinstance(value, float):
        if value != value:
            return "NaN"
        if value in (float("inf"), float("-inf")):
            return "Infinity" if value > 0 else "-Infinity"
        return float.__repr__(value)
    _unserialisable(value)
    return ""  # not reached


def _key(key: object) -> str:
    """A key as json writes it: strings as they are, numbers, booleans and None in their JSON words."""
    if isinstance(key, str):
        return key
    if key is None or isinstance(key, (int, float)):
        return _scalar(key)
    raise TypeError(f"keys must be str, int, float, bool or None, not {type(key).__name__}")


def decode(line: bytes | str) -> dict:
    """One message; ValueError for anything that is not one JSON object of valid Unicode text."""
    # Strict UTF-8: bytes that encode a surrogate (ED A0 80) are refused here, where json.loads would let them through.
    text = line.decode() if isinstance(line, bytes) else line
    start = len(text) - len(text.lstrip(WHITESPACE))
    try:
        message, end = _scan(text, start)
    except StopIteration:
        raise ValueError("a message is one JSON value") from None
    except RecursionError:  # [[[[... nested deeper than the parser goes: still just bad input
        raise ValueError("a message nests too deeply") from None
    if text[end:].strip(WHITESPACE):
        raise ValueError("a message is one JSON value, and nothing after it")
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
