"""The layers, checked statically: each package imports only the ones below it (every import, also inside functions)."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

APP = Path(__file__).resolve().parents[2] / "app"

# Leaf modules (model, errors, config, gpu) at the bottom; the TUI and the front doors on top.
ALLOWED = {
    "model": set(),
    "errors": set(),
    "config_file": set(),
    "config": {"config_file"},
    "gpu": set(),
    "core": {"model", "errors", "config", "gpu"},
    "store": {"model", "errors", "gpu"},
    "fit": {"errors", "output", "core", "config"},
    "llama": {"model", "errors", "config", "gpu", "core", "store", "output", "fit", "faults"},
    "faults": {"model", "errors", "gpu", "core", "store", "output"},
    "history": {"model", "errors", "config", "gpu", "core", "store"},
    "notify": {"errors", "config", "core", "store", "output"},
    "service": {"model", "errors", "config", "gpu", "core", "store", "llama", "demo", "wire", "history", "notify", "faults",
                "alerts", "report"},
    "alerts": {"config", "core", "errors", "faults", "gpu", "history", "notify", "output", "service", "store"},
    "report": {"config", "core", "errors", "faults", "gpu", "history", "output", "store"},
    "client": {"core", "errors", "gpu", "model", "service", "wire"},
    "output": {"core"},
    "tui": {"model", "errors", "config", "gpu", "core", "llama", "client", "fit"},
}


def imports() -> dict[str, set[str]]:
    """Package (app/X) -> the other app packages it imports."""
    found: dict[str, set[str]] = defaultdict(set)
    for path in APP.rglob("*.py"):
        package = path.relative_to(APP).parts[0].removesuffix(".py")
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "app":
                names = [f"{node.module}.{alias.name}" for alias in node.names] if node.module == "app" else [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names if alias.name.split(".")[0] == "app"]
            else:
                continue
            for name in names:
                parts = name.split(".")
                if len(parts) > 1 and parts[1] not in (package, "__version__"):
                    found[package].add(parts[1])
    return found


def test_each_layer_imports_only_the_layers_below_it():
    found = imports()
    wrong = {package: sorted(found[package] - allowed) for package, allowed in ALLOWED.items()
             if found[package] - allowed}
    assert wrong == {}


def test_only_the_front_door_reaches_the_tui():
    found = imports()
    assert sorted(package for package, targets in found.items() if "tui" in targets) == ["cli"]


def test_the_check_sees_imports_inside_functions():
    assert "tui" in imports()["cli"]  # cmd_board imports the TUI lazily, inside the function
