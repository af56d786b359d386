"""docs/json.md's JSON shapes (and `board usage`'s in docs/gateway.md) against what the real command line prints on
the demo (`board --demo ... --json`, a subprocess): each example's keys, recursively, so that a key added to or
dropped from a `--json` shows in the doc or fails here.

The docs write a shape three ways, and all three are read: a JSON example (`"uuid": "GPU-..."`, `1796...`), the keys
alone (`{"index", "uuid"}`), and a placeholder: `{booking}` or `booking` for the booking's example, `{...}`, `[...]`
or `...` for what the doc leaves open (`{"key": "total", ...the same fields...}` shows some keys of an object). Every
element of a list printed is held to the example's first; a `null` in the example stands for any value.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"

BOOK = ("1", "--start", "+30d", "--for", "1h")  # a booking the demo has room for
# (page, the words that introduce the example: the next code after them is it, the command that prints it).
EXAMPLES = [
    ("json.md", "A booking (`board book --json`", ("book", *BOOK, "--json")),
    ("json.md", "`board list --json`:", ("list", "--json")),
    ("json.md", "`board status --json`:", ("status", "--json")),
    ("json.md", "`board cards --json`", ("cards", "--json")),
    ("json.md", "`board topo --json`:", ("topo", "--json")),
    ("json.md", "`board power --json`:", ("power", "--json")),
    ("json.md", "`board log --json`:", ("log", "--json")),
    ("json.md", "`board whoami --json`:", ("whoami", "--json")),
    ("json.md", "`board serve list --json`:", ("serve", "list", "--json")),
    ("json.md", "`board serve plan --list --json`", ("serve", "plan", "--list", "--json")),
    ("json.md", "`board report --json` prints one object:", ("report", "--json")),
    ("json.md", "`board projects --json` prints one object:", ("projects", "--json")),
    ("json.md", "`board models --json` prints one object:", ("models", "--json")),
    ("gateway.md", "`board usage [--since 7d] [--by user|key|model] [--json]` sums them:", ("usage", "--json")),
]
# The `--json`s json.md names that the demo cannot print.
NOT_RUN = {
    "board serve key ID --json": "needs a server; the demo starts none",
}
# Objects of an example the demo prints none of (an empty list): their keys go unchecked, and this says so.
UNSEEN = {
    "board serve list --json": {"servers[]", "servers[].estimate", "planned[]"},
    "board report --json": {"tokens[]", "tp[]", "energy.users[]"},
    "board usage --json": {"rows[]", "energy[]"},
    # the demo has no [[projects]]: tests/service/test_projects_view.py holds a board's with projects to the example
    "board projects --json": {"projects[]", "projects[].allocations[]"},
    # the demo has no catalog: tests/integration/test_models_cli.py holds a board's with one to the example
    "board models --json": {"models[]", "models[].preload"},
}


@dataclass
class Open:
    """What a doc leaves open (`...`, `{...}`, `[...]`): anything."""


@dataclass
class Obj:
    keys: dict  # key -> its shape
    open: bool = False  # `...` among its keys: the doc shows some of them


@dataclass
class Arr:
    first: object  # the shape of every element


@dataclass
class Value:
    text: str  # a string, number, true, false or null


TOKEN = re.compile(r'\s*(?:("(?:[^"\\]|\\.)*")|([{}\[\]:,])|([^\s{}\[\]:,"]+))')


@dataclass
class Reader:
    """A shape from a doc's example (module docstring); `refs`: the placeholders' shapes by name."""

    text: str
    refs: dict = field(default_factory=dict)
    tokens: list = field(init=False)

    def __post_init__(self) -> None:
        self.tokens = [next(t for t in m.groups() if t is not None) for m in TOKEN.finditer(self.text.strip())]

    def shape(self):
        found = self.value()
        assert not self.tokens, f"left over after the example: {self.tokens[:5]}"
        return found

    def take(self, expected: str | None = None) -> str:
        token = self.tokens.pop(0)
        assert expected is None or token == expected, f"expected {expected!r}, got {token!r} before {self.tokens[:5]}"
        return token

    def skip_etc(self) -> None:
        """`...` and the words after it (`...the same fields...`), to the next comma or bracket."""
        while self.tokens and self.tokens[0] not in ",]}":
            self.take()

    def value(self):
        token = self.take()
        if token == "{":
            return self.object()
        if token == "[":
            return self.array()
        if token.startswith("..."):
            self.tokens.insert(0, token)
            self.skip_etc()
            return Open()
        return self.refs.get(token, Value(token))

    def object(self):
        if self.tokens[1] == "}" and not self.tokens[0].startswith('"'):  # {booking}, {...}
            name = self.take()
            self.take("}")
            return Open() if name.startswith("...") else self.refs[name]
        keys: dict = {}
        shown = Obj(keys)
        while self.tokens[0] != "}":
            if self.tokens[0].startswith("..."):
                shown.open = True
                self.skip_etc()
            else:
                key = json.loads(self.take())
                keys[key] = self.value() if self.tokens[0] == ":" and self.take() else Open()
            if self.tokens[0] == ",":
                self.take()
        self.take("}")
        return shown

    def array(self):
        items = []
        while self.tokens[0] != "]":
            if self.tokens[0].startswith("..."):
                self.skip_etc()
            else:
                items.append(self.value())
            if self.tokens[0] == ",":
                self.take()
        self.take("]")
        return Arr(items[0] if items else Open())


def mismatches(doc, real, path: str, seen: set[str]) -> list[str]:
    """Where `real` (what a command printed) differs from the doc's shape; `seen` gathers the paths of the doc's
    objects that met one."""
    if isinstance(doc, Open) or isinstance(doc, Value) and doc.text == "null":
        return []
    if isinstance(doc, Value):
        return [f"{path}: the doc shows a value, the command prints {json.dumps(real)[:60]}"] if isinstance(
            real, (dict, list)) else []
    if isinstance(doc, Arr):
        if not isinstance(real, list):
            return [f"{path}: the doc shows a list, the command prints {json.dumps(real)[:60]}"]
        return [m for item in real for m in mismatches(doc.first, item, f"{path}[]", seen)]
    if real is None:  # a booking that is not there: `null`, as the doc's words say
        return []
    if not isinstance(real, dict):
        return [f"{path}: the doc shows an object, the command prints {json.dumps(real)[:60]}"]
    seen.add(path)
    found = [f"{inside(path, key)}: in the doc, not printed" for key in sorted(doc.keys.keys() - real.keys())]
    if not doc.open:
        found += [f"{inside(path, key)}: printed, not in the doc" for key in sorted(real.keys() - doc.keys.keys())]
    for key in doc.keys.keys() & real.keys():
        found += mismatches(doc.keys[key], real[key], inside(path, key), seen)
    return found


def inside(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def objects(doc, path: str = "") -> set[str]:
    """The paths of the objects a shape shows keys of."""
    if isinstance(doc, Arr):
        return objects(doc.first, f"{path}[]")
    if isinstance(doc, Obj):
        return {path} | {p for key, shape in doc.keys.items() for p in objects(shape, inside(path, key))}
    return set()


CODE = re.compile(r"```[a-z]*\n(.*?)```|`(\{.*?\})`", re.DOTALL)


def example(page: str, intro: str) -> str:
    """The first code after `intro` on the page: a fenced block, or inline code that opens with `{`."""
    text = (DOCS / page).read_text(encoding="utf-8")
    assert text.count(intro) == 1, f"{page}: {intro!r} is not there once"
    match = CODE.search(text, text.index(intro) + len(intro))
    assert match, f"{page}: no example after {intro!r}"
    return match.group(1) or match.group(2)


def name(argv: tuple[str, ...]) -> str:
    """`board book --json`: the command as the doc names it."""
    return " ".join(("board", *(a for a in argv if a not in BOOK)))


# Each command through the console script's own entry (app.quick.main, as `python -m app`), one after the other in
# one fresh interpreter: a dozen start-ups would cost seconds.
RUN = """
import contextlib, io, json, sys
from app.quick import main
found = []
for argv in json.loads(sys.argv[1]):
    with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.redirect_stderr(io.StringIO()) as err:
        code = main(argv)
    found.append([code, out.getvalue(), err.getvalue()])
print(json.dumps(found))
"""


def run_demo(tmp: Path, *commands: tuple[str, ...]) -> list[str]:
    """What each command prints on stdout on one demo (`board --demo ...`), run in order; each must succeed."""
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("BOARD_")}, "XDG_STATE_HOME": str(tmp),
           "TZ": "UTC"}
    result = subprocess.run([sys.executable, "-c", RUN, json.dumps([["--demo", *argv] for argv in commands])],
                            capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    assert [(argv, code, err) for argv, (code, _, err) in zip(commands, found)] == [(argv, 0, "") for argv in commands]
    return [out for _, out, _ in found]


@pytest.fixture(scope="module")
def printed(tmp_path_factory) -> dict[str, str]:
    """What each example's command prints on the demo, by the command's name, and `board report --csv`; in the
    order of EXAMPLES (the booking first, so that the list and the status show it)."""
    argvs = [argv for _, _, argv in EXAMPLES] + [("report", "--csv")]
    return {name(argv): out for argv, out in zip(argvs, run_demo(tmp_path_factory.mktemp("demo"), *argvs))}


def documented() -> dict[str, object]:
    """Each example's shape by its command's name; the booking's first, as the others name it."""
    refs: dict = {}
    found = {}
    for page, intro, argv in EXAMPLES:
        found[name(argv)] = shape = Reader(example(page, intro), refs).shape()
        refs.setdefault("booking", shape)
    return found


@pytest.mark.parametrize("command", [name(argv) for _, _, argv in EXAMPLES])
def test_the_docs_example_has_the_keys_the_command_prints(printed, command):
    """Wrong versions: a key printed and not in the doc (`hosts` shown "with a fleet" only), a key in the doc and
    not printed, a key nested in one and flat in the other (`pcie.tx_mib_s` against `pcie_tx_mib_s`)."""
    doc = documented()[command]
    seen: set[str] = set()
    assert sorted(set(mismatches(doc, json.loads(printed[command]), "", seen))) == []  # once for all the elements
    assert objects(doc) - seen == UNSEEN.get(command, set()), "an object of the example the demo printed none of"


def test_every_json_the_page_names_is_checked_or_says_why_not():
    """Wrong version: a new `--json` documented with no example run here."""
    named = set(re.findall(r"`(board [a-z][^`]*?--json)`", (DOCS / "json.md").read_text(encoding="utf-8")))
    assert named - {name(argv) for _, _, argv in EXAMPLES} - set(NOT_RUN) == set()


def test_the_report_csv_header_is_the_documented_one(printed):
    """Wrong versions: a column added, dropped or moved in one and not the other."""
    doc = (DOCS / "json.md").read_text(encoding="utf-8")
    header = re.search(r"`board report --csv` prints a header\s*\(`([^`]*)`", doc).group(1)
    assert printed["board report --csv"].splitlines()[0] == header


class TestReader:
    """The doc's notation read as the module docstring says."""

    def test_keys_values_placeholders_and_what_is_left_open(self):
        booking = Obj({"id": Value("7")})
        shape = Reader('{"a": 1796..., "b": [{"x", "y"}, ...], "c": {booking}, "d": {...}, "e": [booking, ...], '
                       '"f": {"key": "total", ...the same fields...}, "g": [...], "h": ...}', {"booking": booking}).shape()
        assert shape == Obj({"a": Value("1796..."), "b": Arr(Obj({"x": Open(), "y": Open()})), "c": booking,
                             "d": Open(), "e": Arr(booking), "f": Obj({"key": Value('"total"')}, open=True),
                             "g": Arr(Open()), "h": Open()})

    @pytest.mark.parametrize("real, wrong", [
        ({"a": 1, "b": [{"x": 1}]}, ["b[].y: in the doc, not printed"]),
        ({"a": 1, "b": [{"x": 1, "y": 2, "z": 3}]}, ["b[].z: printed, not in the doc"]),
        ({"a": {"n": 1}, "b": []}, ["a: the doc shows a value, the command prints {\"n\": 1}"]),
        ({"a": 1, "b": [{"x": 1, "y": 2}, {"x": 1}]}, ["b[].y: in the doc, not printed"]),  # every element, not the first
    ])
    def test_a_key_missing_added_or_of_another_kind_is_named_with_its_path(self, real, wrong):
        doc = Reader('{"a": 1, "b": [{"x", "y"}]}').shape()
        assert mismatches(doc, real, "", set()) == wrong

    def test_a_null_or_an_open_object_takes_what_it_is_given(self):
        doc = Reader('{"a": null, "b": {"x": 1, ...}, "c": {...}}').shape()
        seen: set[str] = set()
        assert mismatches(doc, {"a": {"n": 1}, "b": {"x": 1, "y": 2}, "c": [1]}, "", seen) == []
        assert seen == {"", "b"}
