"""app.wire: the JSON it writes is json.dumps's, byte for byte, and it reads what json.loads reads, refusing more
(bytes that are not UTF-8), without importing the json package (issue 37: json's modules import re and enum)."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app import wire

SCALARS = st.none() | st.booleans() | st.integers() | st.floats() | st.text()
KEYS = st.text() | st.integers() | st.booleans() | st.none() | st.floats(allow_nan=False)
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner)
                      | st.dictionaries(KEYS, inner, max_size=4), max_leaves=20)


@given(VALUES)
def test_the_document_is_json_dumps_with_indent_2(value):
    """Nearest wrong versions: ", " or ":" without its space, nested lines indented from column 0, non-ASCII written
    as it is (not inert), NaN written as null, an empty {} or [] opened on two lines, True keys written "True"."""
    assert wire.document(value) == json.dumps(value, indent=2)


@given(st.dictionaries(KEYS, VALUES, max_size=4))
def test_a_line_on_the_wire_is_json_dumps_compact(message):
    assert wire.encode(message) == json.dumps(message, separators=(",", ":")).encode() + b"\n"


def test_what_json_cannot_write_is_refused_as_json_refuses_it():
    for value in ({"a": object()}, {(1, 2): 1}, [b"bytes"]):
        with pytest.raises(TypeError):
            json.dumps(value, indent=2)
        with pytest.raises(TypeError):
            wire.document(value)


def same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(map(same, a, b))
    return type(a) is type(b) and a == b


@given(st.dictionaries(st.text(), VALUES, max_size=4), st.sampled_from(["", " ", "\t\r\n "]))
def test_a_line_reads_as_json_loads_reads_it(message, space):
    line = (space + json.dumps(message) + space + "\n").encode()
    assert same(wire.decode(line), json.loads(line))


@pytest.mark.parametrize("line", [
    b'{"a": 1} {"b": 2}\n',  # two values
    b'{"a": 1} x', b"[1]", b"", b"   \n", b"{", b'{"a": 01}', b'{"a": "\x01"}',  # a control character in a string
    b'{"a": "\\ud800"}',  # a lone surrogate by escape
    b'{"a": "\xed\xa0\x80"}',  # ... by the bytes that would encode it (json.loads reads those as one)
    b'{"a": "\xff"}', b"\xef\xbb\xbf{}",  # not UTF-8; a byte-order mark
    b"[" * 100_000,
])
def test_anything_but_one_object_of_unicode_text_is_a_value_error(line):
    """Nearest wrong versions: trailing data ignored (the scanner alone stops after the first value), bytes decoded
    with surrogatepass as json.loads decodes them, a non-object accepted, RecursionError let through."""
    with pytest.raises(ValueError):
        wire.decode(line)


def test_the_wire_does_not_import_the_json_package():
    import subprocess
    import sys

    code = ("import sys\nfrom app import wire\nwire.decode(wire.encode({'a': [1.5, None, 'é']}))\n"
            "wire.document({'a': []})\nprint(sorted({'json', 're', 'enum'} & set(sys.modules)))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
