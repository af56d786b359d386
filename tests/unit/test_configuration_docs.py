"""docs/configuration.md's example against the config's sections (app.config.ConfigFile): every key of every section
is in the example, in its own table, and every key the example shows is one the code reads."""

from __future__ import annotations

import re
import tomllib
import types
import typing
from pathlib import Path

import msgspec
import pytest

from app.config import ConfigFile, PoolWindow, PreloadWindow, load_config

PAGE = Path(__file__).parents[2] / "docs" / "configuration.md"


def example(text: str) -> tuple[str, dict]:
    """The page's TOML example: (as written, its tables with the commented-out keys too)."""
    block = re.search(r"```toml\n(.*?)```", text, re.S)[1]
    # A key commented out (`# url = "..."`: an alternative, or a default left to the code) is documented all the same.
    shown = re.sub(r"^# (\w+ = )", r"\1", block, flags=re.M)
    return block, tomllib.loads(shown)


def keys(section: type) -> set[str]:
    # By the file's names ([[models]] class); _fields are the loader's
    return {field.encode_name for field in msgspec.structs.fields(section) if not field.name.startswith("_")}


def entry(kind: object) -> object:
    """The Struct a section's field holds: the element of tuple[Pool, ...], X of X | None, else the type."""
    if isinstance(kind, types.UnionType):
        kind = next(k for k in typing.get_args(kind) if k is not type(None))
    if typing.get_origin(kind) is tuple:
        return typing.get_args(kind)[0]
    return kind


def is_section(kind: object) -> bool:
    return isinstance(kind, type) and issubclass(kind, msgspec.Struct)


def tables(doc: dict) -> list[tuple[str, type, list[dict]]]:
    """(where, the Struct, the example's tables for it): each section, each array of tables' entries, each window."""
    found = []
    for name, kind in typing.get_type_hints(ConfigFile).items():
        section = entry(kind)
        if not is_section(section):
            continue  # [labels], [classes]: tables of the admin's own keys
        shown = doc.get(name, {})
        found.append((f"[{name}]", section, shown if isinstance(shown, list) else [shown]))
        for key, inner in typing.get_type_hints(section).items():
            if typing.get_origin(inner) is tuple and is_section(entry(inner)) and isinstance(shown, dict):
                found.append((f"[[{name}.{key}]]", entry(inner), shown.get(key, [])))  # [[notify.targets]]
    windows = [w for pool in doc.get("pools", []) for w in pool.get("windows", {}).values()]
    found.append(("[pools.windows]", PoolWindow, windows))
    found.append(("[models.preload]", PreloadWindow, [m["preload"] for m in doc.get("models", []) if "preload" in m]))
    return found


def differences(doc: dict) -> dict[str, tuple[list[str], list[str]]]:
    """Per table: (keys of its Struct the example does not show, keys the example shows that the Struct lacks)."""
    found = {}
    for where, section, shown in tables(doc):
        written = set().union(*(set(table) for table in shown))
        found[where] = sorted(keys(section) - written), sorted(written - keys(section))
    return found


DOC = example(PAGE.read_text())[1]


@pytest.mark.parametrize("where", differences(DOC))
def test_every_key_of_the_section_is_in_its_table_and_no_other(where):
    """Nearest wrong versions: a key added to a Struct and not to the page, a key the page shows that the code
    dropped or renamed, a key shown in another section's table."""
    assert differences(DOC)[where] == ([], [])


def test_every_section_is_in_the_example():
    assert sorted(set(ConfigFile.__struct_fields__) - set(DOC)) == []


def test_the_example_as_written_loads(tmp_path):
    """What a reader copies (the commented-out keys left out) is a config that loads, the zone and all."""
    path = tmp_path / "board.toml"
    path.write_text(example(PAGE.read_text())[0])
    config = load_config(environ={"BOARD_CONFIG": str(path)})
    assert config.policy.timezone == "Europe/Berlin" and config.power.cards == {7: 450.0}


@pytest.mark.parametrize("change, where, found", [
    (("max_fill = 0.90", ""), "[fit]", (["max_fill"], [])),
    (("max_fill = 0.90", "max_fil = 0.90"), "[fit]", (["max_fill"], ["max_fil"])),
    (("hours = ", "hour = "), "[pools.windows]", (["hours"], ["hour"])),
    (('type = "wecom"', 'kind = "wecom"'), "[[notify.targets]]", (["type"], ["kind"])),
    (("# log_dir = ", "# logs = "), "[llama]", (["log_dir"], ["logs"])),
])
def test_the_check_finds_a_key_missing_or_unknown(change, where, found):
    """The check itself, on the page with one key left out or misspelt (a commented-out one too)."""
    assert differences(example(PAGE.read_text().replace(*change))[1])[where] == found
