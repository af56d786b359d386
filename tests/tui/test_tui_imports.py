"""The TUI's modules import one another without a cycle, counting the imports made inside functions: a screen
that needs another's message reads it from app.tui.messages, never from the other screen."""

from __future__ import annotations

import ast
from graphlib import CycleError, TopologicalSorter

from tests.conftest import REPO


def tui_imports() -> dict[str, set[str]]:
    """{module: the app.tui modules it imports, anywhere in it}."""
    paths = {".".join(p.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__"): p
             for p in (REPO / "app" / "tui").rglob("*.py")}
    graph = {}
    for name, path in paths.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in paths:
                found.add(node.module)
                found |= {f"{node.module}.{alias.name}" for alias in node.names} & paths.keys()
            elif isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names} & paths.keys()
        graph[name] = found - {name}
    return graph


def test_the_tui_has_no_import_cycle():
    graph = tui_imports()
    assert "app.tui.messages" in graph["app.tui.screens.card_detail"]  # the probe sees imports
    try:
        TopologicalSorter(graph).prepare()
    except CycleError as error:
        raise AssertionError(f"import cycle: {' -> '.join(error.args[1])}") from None
