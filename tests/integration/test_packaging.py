"""The package as a shared server gets it: the wheel, installed without extras in a fresh venv, runs every part.

Every test venv has the test extras, so an import only they satisfy goes unnoticed everywhere else (gguf
was one: `board fit`, `book --model` and `serve start` ended in ModuleNotFoundError on a real install).
Here the wheel is built from a copy of what it is made of (pyproject.toml, README.md, app/), installed
with pip and no extras into a venv of its own, as scripts/install_shared.sh installs it, once for the
module; then the installed `board` runs the commands that load each optional part: fit, book --model,
serve start on the tiny model, report, ical, and the agent's /metrics.

About a minute with a warm pip cache. The serve test needs llama-server (make test names it in
BOARD_LLAMA_SERVER, where a missing binary fails); the /metrics test runs the agent as the unit does (root).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.llama.conftest import LLAMA_SERVER, NO_LLAMA_REASON, Board, _subreaper  # noqa: F401 - a fixture
from tests.llama.tiny_gguf import write_tiny_gguf
from tests.shared_install import scratch_dir


NAMED_LLAMA_SERVER = os.environ.get("BOARD_LLAMA_SERVER")  # read before the autouse fixture clears BOARD_*
ENVIRON = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "TZ": "UTC", "PYTHONDONTWRITEBYTECODE": "1"}


def _step(*command: str, cwd: Path | None = None) -> None:
    result = subprocess.run(command, capture_output=True, text=True, cwd=cwd, timeout=900, umask=0o022,
                            env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    assert result.returncode == 0, f"{' '.join(command)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"


@pytest.fixture(scope="module")
def installed() -> Path:
    """The installed `board` (its venv's console script); the venv lives under /tmp, where user board can reach it."""
    root = scratch_dir("board-packaging-")
    try:
        source = root / "src"  # pip builds in the tree: a copy, never the checkout
        source.mkdir()
        for name in ("pyproject.toml", "README.md"):
            shutil.copy2(REPO / name, source / name)
        shutil.copytree(REPO / "app", source / "app", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        _step(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(root / "dist"), str(source))
        [wheel] = (root / "dist").glob("board-*.whl")
        base = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
        _step(base, "-m", "venv", str(root / "venv"))
        _step(str(root / "venv/bin/python"), "-m", "pip", "install", "--quiet", str(wheel))  # no extras
        yield root / "venv/bin/board"
    finally:
        shutil.rmtree(root, ignore_errors=True)


class InstalledBoard(Board):
    """tests/llama's Board (a fresh database, the simulated fleet, a port range), run through the installed `board`."""

    def __init__(self, tmp_path: Path, program: Path, server_bin: str | None = None):
        super().__init__(tmp_path, server_bin)
        self.program = program

    def run(self, *args: str, env: dict | None = None, timeout: float = 120):
        # Outside the checkout, with nothing of the test venv: only the installed package can answer.
        return subprocess.run([str(self.program), *args], capture_output=True, text=True, cwd=self.tmp_path,
                              env={**ENVIRON, "HOME": str(self.tmp_path), **self.env, **(env or {})}, timeout=timeout)


@pytest.fixture
def board(installed, tmp_path) -> InstalledBoard:
    made = InstalledBoard(tmp_path, installed)
    yield made
    made.cleanup()


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("model") / "tiny.gguf")


def test_the_installed_board_is_not_the_checkout(installed):
    where = subprocess.run([str(installed.parent / "python"), "-c", "import app; print(app.__file__)"],
                           capture_output=True, text=True, cwd=installed.parent, env=ENVIRON, timeout=60)
    assert where.returncode == 0 and where.stdout.startswith(str(installed.parents[1])), where.stdout + where.stderr


def test_every_module_of_the_package_imports(installed):
    """The TUI (textual, rich), the NVML backend (pynvml, psutil), the history (sqlite-utils), /metrics (prometheus-client)."""
    code = ("import importlib, pkgutil, app\n"
            "names = [m.name for m in pkgutil.walk_packages(app.__path__, 'app.') if m.name != 'app.__main__']\n"
            "for name in names:\n"
            "    importlib.import_module(name)\n"
            "print(len(names))\n")
    result = subprocess.run([str(installed.parent / "python"), "-c", code], capture_output=True, text=True,
                            cwd=installed.parent, env=ENVIRON, timeout=120)
    assert result.returncode == 0, result.stderr
    assert int(result.stdout) > 50


def test_fit_and_book_by_model(board, tiny_model):
    fitted = board.run("fit", str(tiny_model), "--ctx", "256")
    assert fitted.returncode == 0 and "smallest fit: 1 card" in fitted.stdout, fitted.stderr
    booked = board.json("book", "--model", str(tiny_model), "--ctx", "256", "--for", "1h")
    assert booked["cards"] == [booked["cards"][0]] and booked["request"]["model"] == str(tiny_model)
    assert booked["request"]["ctx"] == 256
    listed = board.ok("list")
    assert "[tiny.gguf ctx 256 ×1" in listed.stdout, listed.stdout


def test_report_and_ical(board):
    board.book("0")
    report = board.run("report", "--since", "1d")
    assert report.returncode == 0 and report.stdout.startswith("Booked against used"), report.stderr
    ical = board.run("ical")
    assert ical.returncode == 0 and ical.stdout.startswith("BEGIN:VCALENDAR"), ical.stderr
    assert "board booking #1" in ical.stdout


@pytest.fixture
def llama_server_bin() -> str:
    """As tests/llama does: a named binary that is not there fails (make test names one); none named skips."""
    if LLAMA_SERVER:
        return LLAMA_SERVER
    if NAMED_LLAMA_SERVER:
        pytest.fail(f"BOARD_LLAMA_SERVER={NAMED_LLAMA_SERVER!r} is not an executable file")
    pytest.skip(NO_LLAMA_REASON)


@pytest.mark.usefixtures("_subreaper")  # the detached supervisors are reaped here (tests/llama/conftest.py)
def test_serve_start_serves_the_booked_request(installed, tmp_path, tiny_model, llama_server_bin):
    board = InstalledBoard(tmp_path, installed, llama_server_bin)
    try:
        booking = board.json("book", "--model", str(tiny_model), "--ctx", "256", "--for", "1h")
        started = json.loads(board.ok("serve", "start", str(booking["id"]), "--json").stdout)  # the stored request
        assert started["state"] == "ready" and started["ctx"] == 256, started
        assert started["estimate"]["fits"] is True
        board.ok("serve", "stop", str(started["id"]))
        assert board.gone(started)
    finally:
        board.cleanup()


@pytest.mark.real_users
def test_the_agent_serves_metrics(installed):
    from tests.service.support import SERVICE_USER, Agent, check_reachable, ensure_system_user, needs_root
    from tests.service.test_metrics_prometheus import free_port, get, wait_for

    needs_root()
    ensure_system_user()
    check_reachable(SERVICE_USER)  # opens the way (o+x) to the interpreter the installed venv links to
    root = scratch_dir("board-packaging-agent-")
    agent = Agent(root, program=[str(installed)])
    try:
        agent.write_config()
        port = free_port()
        with open(agent.config, "a") as config:
            config.write(f'\n[metrics]\nlisten = "127.0.0.1:{port}"\n')
        agent.start()
        body = wait_for("the installed agent's /metrics answers", lambda: get(f"http://127.0.0.1:{port}/metrics"), 30,
                        agent.log_text()).decode()
        assert "board_gpu_memory_total_bytes{" in body and "board_bookings_queued" in body
        assert agent.stop() == 0, agent.log_text()
    finally:
        agent.stop()
        shutil.rmtree(root, ignore_errors=True)


def test_the_dashboard_and_the_rules_ship_in_the_wheel(board):
    """app/monitoring's files are package data (pyproject's package-data): without them the commands fail here."""
    dashboard = board.run("monitoring", "dashboard")
    assert dashboard.returncode == 0 and dashboard.stdout.startswith("{"), dashboard.stderr
    rules = board.run("monitoring", "rules")
    assert rules.returncode == 0 and "alert: BoardVramHigh" in rules.stdout, rules.stderr
