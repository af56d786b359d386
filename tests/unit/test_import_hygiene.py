"""The core never imports Textual, and the quick CLI path stays light."""

import pkgutil
import subprocess
import sys

import pytest

import app
from tests.conftest import REPO

HEADLESS = sorted(
    m.name for m in pkgutil.walk_packages(app.__path__, "app.")
    if not m.name.startswith("app.tui") and m.name != "app.__main__"
)


def loaded_after(code: str) -> set[str]:
    result = subprocess.run([sys.executable, "-c", code + "\nimport sys; print(' '.join(sys.modules))"],
                            capture_output=True, text=True, cwd=REPO, timeout=60)
    assert result.returncode == 0, result.stderr
    return set(result.stdout.split())


def test_there_are_headless_modules_to_check():
    assert {"app.cli", "app.service.rules.bookings", "app.store.db", "app.gpu.nvml"} <= set(HEADLESS)


@pytest.mark.parametrize("module", HEADLESS)
def test_headless_module_does_not_import_textual(module):
    assert "textual" not in loaded_after(f"import {module}")


def test_quick_commands_do_not_load_textual_or_heavy_libraries(tmp_path):
    code = (
        "import os, contextlib, io\n"
        f"os.environ.update(BOARD_DB={str(tmp_path / 'b.db')!r}, BOARD_SIMULATE='1')\n"
        "from app.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    assert main(['book', '--cards', '0', '--for', '1h']) == 0\n"
        "    assert main(['status', '--json']) == 0\n"
        "    assert main(['list']) == 0\n"
    )
    loaded = loaded_after(code)
    assert not loaded & {"textual", "rich", "sqlite_utils", "numpy", "pandas", "psutil", "pynvml"}


def test_the_tui_does_import_textual():
    # Guards the test above: the probe really sees Textual when it is imported.
    assert "textual" in loaded_after("import textual.app")


def third_party_imports() -> dict[str, str]:
    """Every top-level module app/ imports that is neither the standard library nor app: {module: a file importing it}."""
    import ast

    found = {}
    for path in sorted((REPO / "app").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top != "app":
                    found.setdefault(top, str(path.relative_to(REPO)))
    return found


def test_every_package_app_imports_is_a_declared_dependency():
    """An import only the test extras satisfy fails on a real install (pip install ., as install_shared.sh does):
    each module app/ imports, also inside functions, must come from a [project] dependency."""
    import re
    import tomllib
    from importlib.metadata import packages_distributions

    def normal(name: str) -> str:
        return re.sub(r"[-_.]+", "-", name).lower()

    declared = {normal(re.match(r"[A-Za-z0-9_.-]+", d).group()) for d in
                tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]}
    provided_by = packages_distributions()
    imported = third_party_imports()
    assert {"textual", "gguf", "prometheus_client"} <= set(imported)  # the walk sees lazy imports too
    undeclared = {module: where for module, where in imported.items()
                  if not {normal(d) for d in provided_by.get(module, [])} & declared}
    assert undeclared == {}, f"imported by app/ but not in [project] dependencies: {undeclared}"


def test_file_mode_quick_commands_load_only_what_they_run(tmp_path):
    """File mode (BOARD_DB, no shared install) runs the quick commands on the service in this process: the store
    and the booking rules, not the full parser, pushes, the history, alerts, sizing, the watchers, or llama's
    modules while no server runs (the simulated fleet shows the demo's servers on their cards); only the
    operations' modules it calls (not servers, keys, faults), and no logging unless a row is malformed."""
    code = (
        "import os, contextlib, io\n"
        f"os.environ.update(BOARD_DB={str(tmp_path / 'b.db')!r}, BOARD_SIMULATE='1')\n"
        "from app.quick import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    assert main(['book', '--cards', '0', '--for', '1h']) == 0\n"
        "    assert main(['book', '1', '--for', '1h', '--json']) == 0\n"
        "    assert main(['status', '--json']) == 0\n"
        "    assert main(['list']) == 0\n"
    )
    loaded = loaded_after(code)
    assert "app.service.rules.bookings" in loaded  # the probe did run the commands in process
    assert not loaded & {"argparse", "app.cli.fit", "app.cli.serve", "app.fit.estimate", "app.notify.deliver",
                         "app.service.box.notify", "http.client", "app.history.store", "app.alerts.engine",
                         "app.service.box.watch", "app.service.door.server", "app.llama.rows",
                         "app.service.ops.servers", "app.service.box.servers", "app.service.ops.gateway", "app.core.keys",
                         "app.service.ops.faults", "app.faults.store", "app.service.ops.series", "app.store.plans",
                         "logging", "random", "traceback"}


def test_file_mode_reads_load_no_booking_rules_or_registry(tmp_path):
    """A read in process (`status --json`, `whoami`, `list`) opens the service for the read alone: not the booking
    rules (and their audit, fair share, projects, hardware), nor the pidfd registry of jobs and servers (signal,
    select), which only a booking or the socket needs; a booking made next in the same process does load the rules.
    Nearest wrong versions: app.service importing BookingService or Registry at its top again, Service.__init__
    making its Registry eagerly."""
    probe = ("import os, sys, contextlib, io\n"
             f"os.environ.update(BOARD_DB={str(tmp_path / 'b.db')!r}, BOARD_SIMULATE='1')\n"
             "from app.quick import main\n"
             "with contextlib.redirect_stdout(io.StringIO()):\n"
             "    for argv in (['status', '--json'], ['whoami'], ['list', '--json']):\n"
             "        assert main(argv) == 0\n"
             "print(' '.join(sys.modules))\n"
             "with contextlib.redirect_stdout(io.StringIO()):\n"
             "    assert main(['book', '--cards', '0', '--for', '1h']) == 0\n")
    result = subprocess.run([sys.executable, "-c", probe + "print(' '.join(sys.modules))"], capture_output=True,
                            text=True, cwd=REPO, timeout=60)
    assert result.returncode == 0, result.stderr
    after_reads, after_book = (set(line.split()) for line in result.stdout.splitlines())
    rules = {"app.service.rules.bookings", "app.service.rules.audit", "app.core.fairshare", "app.service.box.processes"}
    assert "app.service.ops.reads" in after_reads  # the probe did read in process
    assert not after_reads & rules
    assert {"app.service.rules.bookings", "app.service.box.processes"} <= after_book
