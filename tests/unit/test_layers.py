"""The layers and the import cycles, checked statically over every module under app/.

A module imports its own top-level package and the layers below it, never a peer of its layer or anything above.
Every import counts: at module level, inside a function, under TYPE_CHECKING. No import run at module level
closes a cycle, between packages or inside one (importing a module also imports the packages above it). An import
inside a function that would close one is there for start-up speed and says so (a `# start-up: ...` comment, on its
line or heading its block), as the GPU backends are; otherwise it only hides the cycle, which wants fixing.
Inside app/service the same holds one level down: its sub-packages have an order of their own (SERVICE_LEVELS).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

APP = Path(__file__).resolve().parents[2] / "app"

# Bottom to top, by top-level name under app/ (a package, or a module such as app/config.py; "__init__" is app
# itself). The peers of one layer import none of each other.
LAYERS: tuple[frozenset[str], ...] = tuple(frozenset(layer) for layer in (
    # Leaves, importing nothing of app: errors, entities, the wire's JSON lines, the operations' table, the config
    # file's reader, and the GPUs (one interface, its backends and the cached Fleet reader; the rules read its frozen
    # snapshots); the Grafana dashboard and Prometheus rules shipped as files (monitoring).
    {"__init__", "errors", "model", "wire", "operations", "config_file", "gpu", "monitoring"},
    {"config"},  # typed settings from config_file, which every rule takes
    {"core"},  # the pure rules: bookings, policy, slots, card states, time grammar, identity
    {"store"},  # SQLite rows
    {"fit", "demo", "faults", "history", "notify"},  # the estimate, the demo's seed, and what the service records
    {"llama", "alerts", "report"},  # these read the layer below: servers' OOMs and fits, history, faults, outbox
    {"migrate"},  # board migrate: the SQLite store and its history file into PostgreSQL
    {"service"},  # every rule behind one door
    {"client"},  # the one door's two transports
    {"tui", "gateway"},  # the board; the gateway (the team's OpenAI front door); the command line starts either
    {"output"},  # printing, over core's text: the command line's alone (the layers below return data)
    {"cli"},  # the command line: the package app/cli/, one module per command group
    {"quick"},  # the console script: the hot commands' fast path, else the command line
    {"__main__"},  # python -m app
))

# Inside app/service, bottom to top, by sub-package (app/service/rules/, ...). The package itself (Service,
# open_service) is everyone's own top-level package, importable from any of them. Peers import none of each other.
SERVICE_LEVELS: tuple[frozenset[str], ...] = tuple(frozenset(level) for level in (
    # a connection's parts (who is asking, lines against a deadline, what a handler gets of the agent); the hosts
    {"conn", "fleet"},
    {"rules"},  # bookings, series, planned servers, the audit trail
    {"box"},  # watching the box: enforcement, registered processes, supervised servers, alerts, pushes, /metrics
    {"door", "ops"},  # the socket, its events and database thread; the operations, run by name
))


@dataclass(frozen=True)
class Import:
    importer: str  # a module: "app.core.policy"
    target: str  # the module it reaches: "app.tui.app" (or the package, where the name is not a module)
    line: int
    in_function: bool
    type_only: bool  # under `if TYPE_CHECKING:`
    start_up: bool = False  # a `# start-up: ...` comment says why it is inside a function


def module_name(path: Path, root: Path = APP) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def top(module: str) -> str:
    """The layer's name for a module: the top-level package or module under app/."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def packages_above(module: str) -> list[str]:
    """app.service.ops.registry -> app, app.service, app.service.ops: imported before it, whoever imports it."""
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def says_start_up(lines: list[str], line: int) -> bool:
    """A `start-up` comment on the import's line, or heading the block of imports it is in."""
    for text in reversed(lines[:line]):
        text = text.strip()
        if "# start-up" in text:
            return True
        if text and not text.startswith(("import ", "from ", "#")):
            return False
    return False


def imports_of(sources: dict[str, str], packages: set[str]) -> list[Import]:
    """Every import of an app module in `sources` ({module: its text}); `packages` are the modules that are
    packages (an __init__.py), for relative imports."""

    def resolve(name: str) -> str:
        while name not in sources and "." in name:
            name = name.rpartition(".")[0]
        return name

    found: list[Import] = []
    for module, text in sources.items():
        here = module if module in packages else module.rpartition(".")[0]
        lines = text.splitlines()

        def visit(node: ast.AST, in_function: bool, type_only: bool) -> None:
            for child in ast.iter_child_nodes(node):
                function = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                if isinstance(child, ast.If) and ast.unparse(child.test).endswith("TYPE_CHECKING"):
                    for part in child.body:
                        visit(ast.Module([part], []), function, True)
                    for part in child.orelse:
                        visit(ast.Module([part], []), function, type_only)
                    continue
                names: list[str] = []
                if isinstance(child, ast.Import):
                    names = [alias.name for alias in child.names]
                elif isinstance(child, ast.ImportFrom):
                    base = child.module or ""
                    if child.level:
                        base = ".".join(filter(None, [here.rsplit(".", child.level - 1)[0], base]))
                    # `from app.x import y` reaches the module app.x.y where there is one, else app.x itself
                    names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in sources else base
                             for alias in child.names]
                for name in names:
                    if name == "app" or name.startswith("app."):
                        found.append(Import(module, resolve(name), child.lineno, function, type_only,
                                            function and says_start_up(lines, child.lineno)))
                visit(child, function, type_only)

        visit(ast.parse(text), False, False)
    return found


def read_app(root: Path = APP) -> tuple[dict[str, str], set[str]]:
    paths = sorted(root.rglob("*.py"))
    sources = {module_name(path, root): path.read_text() for path in paths}
    packages = {module_name(path, root) for path in paths if path.name == "__init__.py"}
    return sources, packages


def part(module: str) -> str | None:
    """The level's name inside app/service: app.service.rules.plans -> rules; None outside it and for app.service."""
    parts = module.split(".")
    return parts[2] if parts[:2] == ["app", "service"] and len(parts) > 2 else None


def layer_of(name: str, layers: tuple[frozenset[str], ...] = LAYERS) -> int | None:
    return next((i for i, layer in enumerate(layers) if name in layer), None)


def upward(found: list[Import], layers: tuple[frozenset[str], ...] = LAYERS,
           name: Callable[[str], str | None] = top) -> list[str]:
    """Each import of a peer or of a higher layer, as a line that says where it is and what it breaks. Inside
    app/service: upward(found, SERVICE_LEVELS, part)."""
    wrong = []
    for i in found:
        mine, theirs = name(i.importer), name(i.target)
        if mine is None or theirs is None or mine == theirs:
            continue
        below, above = layer_of(theirs, layers), layer_of(mine, layers)
        if below is None or above is None or not below < above:
            why = f"{theirs} is above {mine}" if (below or 0) > (above or 0) else f"{theirs} and {mine} are peers"
            wrong.append(f"{i.importer} (line {i.line}) imports {i.target}: {why}")
    return wrong


def reached(i: Import) -> list[str]:
    """The modules an import runs: its target and the packages above it, less those above the importer (they are
    being imported already), unless it names one of them itself (`from app.service import Service`)."""
    own = set(packages_above(i.importer))
    return [t for t in (i.target, *packages_above(i.target)) if t != i.importer and (t == i.target or t not in own)]


def runtime_graph(found: list[Import], modules: set[str]) -> dict[str, set[str]]:
    """Module -> the modules importing it runs at once: what its module-level imports reach (not those under
    TYPE_CHECKING)."""
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for i in found:
        if i.in_function or i.type_only:
            continue
        for target in reached(i):
            if target in modules:
                graph[i.importer].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted; a self-import too."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph[v]:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return sorted(found)


def reaches(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for w in graph[todo.pop()] - seen:
            seen.add(w)
            todo.append(w)
    return seen


def hidden_cycles(found: list[Import], graph: dict[str, set[str]]) -> list[str]:
    """Imports inside functions that would close a cycle at module level and are not there for start-up: each
    only dodges its cycle."""
    wrong = []
    for i in found:
        if not i.in_function or i.type_only or i.start_up:
            continue
        for target in reached(i):
            if target in graph and i.importer in reaches(graph, target):
                wrong.append(f"{i.importer} (line {i.line}) imports {i.target} inside a function, and {target}"
                             f" imports {i.importer} at module level")
    return wrong


# -- the app --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def app():
    sources, packages = read_app()
    return sources, imports_of(sources, packages)


def test_every_top_level_module_and_package_has_one_layer(app):
    sources, _ = app
    names = {top(m) for m in sources}
    assert sorted(n for n in names if layer_of(n) is None) == [], "give each a layer in LAYERS"
    assert sorted(n for n in names if sum(n in layer for layer in LAYERS) > 1) == []
    assert {"service", "core", "tui", "cli", "quick", "__main__"} <= names  # the walk sees all of app/


def test_each_module_imports_only_its_own_package_and_the_layers_below(app):
    _, found = app
    wrong = upward(found)
    assert not wrong, "imports against the layers (tests/unit/test_layers.py: LAYERS):\n" + "\n".join(wrong)


def test_every_module_of_the_service_is_in_one_sub_package_with_one_level(app):
    """A module added flat to app/service, or a sub-package without a level, is named here."""
    sources, _ = app
    names = {part(m) for m in sources} - {None}
    assert sorted(n for n in names if layer_of(n, SERVICE_LEVELS) is None) == [], "give each a level in SERVICE_LEVELS"
    assert sorted(n for n in names if sum(n in level for level in SERVICE_LEVELS) > 1) == []
    assert {"conn", "fleet", "rules", "box", "door", "ops"} <= names  # the walk sees all of app/service


def test_each_service_module_imports_only_its_own_sub_package_and_the_levels_below(app):
    """The door imports the handlers, never they the door: a rules module importing app.service.door.server, even
    for a type, is named here, and so is one sub-package importing a peer (box and ops, rules and fleet)."""
    _, found = app
    wrong = upward(found, SERVICE_LEVELS, part)
    assert not wrong, "imports against app/service's levels (tests/unit/test_layers.py: SERVICE_LEVELS):\n" + \
        "\n".join(wrong)


def test_no_import_at_module_level_closes_a_cycle(app):
    sources, found = app
    found_cycles = cycles(runtime_graph(found, set(sources)))
    assert not found_cycles, "import cycles at module level:\n" + "\n".join(" <-> ".join(c) for c in found_cycles)


def test_no_import_inside_a_function_hides_a_cycle(app):
    sources, found = app
    wrong = hidden_cycles(found, runtime_graph(found, set(sources)))
    assert not wrong, "imports inside functions that only dodge a cycle:\n" + "\n".join(wrong)


# -- the checks themselves, on made-up modules ----------------------------------------------------


def made_up(**modules: str) -> tuple[dict[str, str], list[Import]]:
    """Modules by dotted name under app (`core__policy` is app.core.policy; `service` is the package app.service)."""
    sources = {"app." + name.replace("__", "."): text for name, text in modules.items()}
    sources.setdefault("app", "")
    packages = {"app"} | {m.rpartition(".")[0] for m in sources if m.count(".") > 1}
    for package in packages:
        sources.setdefault(package, "")
    return sources, imports_of(sources, packages)


def test_an_upward_import_is_found_inside_a_function_and_under_type_checking():
    _, found = made_up(
        core__policy="def f():\n    from app.tui import app\n",
        store__db="from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from app.service import Service\n",
        service="", tui__app="from app.core import policy\n")
    assert upward(found) == ["app.core.policy (line 2) imports app.tui.app: tui is above core",
                             "app.store.db (line 3) imports app.service: service is above store"]


def test_peers_of_a_layer_do_not_import_each_other():
    _, found = made_up(history__sampler="from app.faults import store\n", faults__store="")
    assert upward(found) == ["app.history.sampler (line 1) imports app.faults.store: faults and history are peers"]


def test_inside_the_service_an_upward_import_even_for_a_type_is_found_and_the_package_itself_is_free():
    _, found = made_up(
        service="from app.service.door.server import ServiceServer\n",
        service__conn__agent="from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from app.service import Service\n",
        service__rules__plans="from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                              "    from app.service.door.server import ServiceServer\n",
        service__box__enforce="from app.service.rules import plans\nfrom app.service.box import servers\n"
                              "from app.service.conn.agent import Agent\n",
        service__box__servers="", service__ops__reads="from app.service.door import hub\n",
        service__door__hub="", service__door__server="from app.service.box.enforce import enforce_once\n")
    assert upward(found, SERVICE_LEVELS, part) == [
        "app.service.rules.plans (line 3) imports app.service.door.server: door is above rules",
        "app.service.ops.reads (line 1) imports app.service.door.hub: door and ops are peers"]


def test_a_cycle_inside_a_package_through_its_init_is_found():
    # app.service.ops imports its handlers; a handler imports app.service.notify, which imports app.service.ops.reads:
    # importing that runs app.service.ops first, so the cycle closes through the package.
    sources, found = made_up(
        service__ops="from app.service.ops import notify\n",
        service__ops__notify="from app.service import notify\n",
        service__ops__reads="",
        service__notify="from app.service.ops.reads import x\n")
    assert cycles(runtime_graph(found, set(sources))) == [["app.service.notify", "app.service.ops",
                                                            "app.service.ops.notify"]]


def test_imports_inside_functions_and_for_types_make_no_cycle_but_one_that_dodges_is_found():
    sources, found = made_up(
        service__enforce="from app.service import servers\n",
        service__servers="def f():\n    from app.service import enforce\n",
        service__audit="from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from app.service import status\n",
        service__status="from app.service import audit\n",
        gpu="def open_source():\n    # start-up: a backend loads only when chosen\n    import sys\n\n"
            "    from app.gpu.nvml import Nvml\n",
        gpu__nvml="from app.gpu import NoDriverError\n")
    graph = runtime_graph(found, set(sources))
    assert cycles(graph) == []
    assert hidden_cycles(found, graph) == ["app.service.servers (line 2) imports app.service.enforce inside a function,"
                                           " and app.service.enforce imports app.service.servers at module level"]


def test_a_module_of_a_package_reaching_a_sibling_is_no_cycle_but_reaching_the_package_itself_is():
    sources, found = made_up(service="from app.service.hub import Hub\n", service__hub="import app.service.peer\n",
                             service__peer="")
    assert cycles(runtime_graph(found, set(sources))) == []  # app.service is being imported already: no edge
    sources, found = made_up(service="from app.service.hub import Hub\n", service__hub="from app.service import Service\n")
    assert cycles(runtime_graph(found, set(sources))) == [["app.service", "app.service.hub"]]
