"""A board whose terminal goes away ends (app.tui.hangup).

Each test starts the real board under a new pty (pty.fork: a new session with the pty as its
controlling terminal), waits until it has drawn, then closes the master as a terminal emulator
does when its window closes, and checks that no board process of that launch is left.
Under `make run` and `su -c` the board is not the session leader and gets no SIGHUP: it has to
notice the hung-up terminal itself.
"""

from __future__ import annotations

import fcntl
import os
import pty
import select
import shlex
import shutil
import signal
import struct
import termios
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import REPO

BOARD = REPO / ".venv" / "bin" / "board"
ENDS_WITHIN = 2.0  # seconds, from closing the terminal to the last board process gone
LEAVE_ALT_SCREEN = b"\x1b[?1049l"

pytestmark = pytest.mark.skipif(not BOARD.exists(), reason="needs the board installed in .venv (make run does it)")


class Launch:
    """One command under its own pty; remembers every process it started, to check and to clean up."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.pid, self.master = pty.fork()
        if self.pid == 0:  # the child: exec at once, never back into pytest
            try:
                os.chdir(REPO)
                os.execvpe(argv[0], argv, env)
            finally:
                os._exit(127)
        fcntl.ioctl(self.master, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 140, 0, 0))
        self.output = b""
        self.seen: list[psutil.Process] = []
        self.status: int | None = None

    def read_until(self, needle: bytes, seconds: float = 30.0) -> None:
        deadline = time.monotonic() + seconds
        while needle not in self.output:
            left = deadline - time.monotonic()
            assert left > 0, f"no {needle!r} within {seconds} s; the terminal shows {self.output[-600:]!r}"
            if select.select([self.master], [], [], min(left, 0.5))[0]:
                try:
                    chunk = os.read(self.master, 65536)
                except OSError:  # EIO: every process let go of the terminal
                    chunk = b""
                if not chunk:
                    assert needle in self.output, f"the terminal closed before {needle!r}: {self.output[-600:]!r}"
                self.output += chunk

    def drawn(self) -> list[psutil.Process]:
        """Waits for the board's footer, then returns the board processes of this launch."""
        self.read_until(b"Quit")
        root = psutil.Process(self.pid)
        self.seen = [root, *root.children(recursive=True)]
        boards = [p for p in self.seen if _is_board(p)]
        assert boards, f"no board among {[p.cmdline() for p in self.seen]}"
        return boards

    def close_terminal(self) -> None:
        os.close(self.master)
        self.master = -1

    def alive(self, processes: list[psutil.Process]) -> list[psutil.Process]:
        self._reap()
        return [p for p in processes if _running(p)]

    def wait_gone(self, processes: list[psutil.Process], seconds: float) -> float:
        """Seconds until none of `processes` runs; fails with what is left after `seconds`."""
        start = time.monotonic()
        while self.alive(processes):
            if time.monotonic() - start > seconds:
                left = [(p.pid, p.cmdline(), p.cpu_percent(0.2)) for p in self.alive(processes)]
                pytest.fail(f"still running {seconds} s after the terminal closed (pid, argv, cpu %): {left}")
            time.sleep(0.05)
        return time.monotonic() - start

    def exit_code(self) -> int:
        """The launched command's exit code (it has ended: this waits for nothing else)."""
        if self.status is None:
            self.status = os.waitpid(self.pid, 0)[1]
        return os.waitstatus_to_exitcode(self.status)

    def _reap(self) -> None:
        if self.status is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.status = status

    def cleanup(self) -> None:
        for process in self.seen:
            if _running(process):
                process.kill()
        if self.master >= 0:
            os.close(self.master)
        if self.status is None:
            try:
                os.waitpid(self.pid, 0)
            except ChildProcessError:
                pass


def _is_board(process: psutil.Process) -> bool:
    try:
        return any(Path(arg).name == "board" for arg in process.cmdline()[:2])
    except psutil.Error:
        return False


def _running(process: psutil.Process) -> bool:
    """Running, and still the same process; a zombie (ended, not yet reaped by its parent) counts as gone."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.fixture
def env(tmp_path) -> dict[str, str]:
    """Home, state and the database in tmp_path; the TERM and size a terminal emulator would give."""
    home = tmp_path / "home"
    home.mkdir()
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("BOARD_", "TEXTUAL", "PYTEST"))}
    environ.update(HOME=str(home), XDG_STATE_HOME=str(tmp_path / "state"), BOARD_DB=str(tmp_path / "demo.db"),
                   TERM="xterm-256color", LANG="C.UTF-8")
    return environ


@pytest.fixture
def launch(env):
    launches: list[Launch] = []

    def start(argv: list[str]) -> Launch:
        launches.append(Launch(argv, env))
        return launches[-1]

    yield start
    for one in launches:
        one.cleanup()


def wrapper_script(tmp_path: Path) -> str:
    script = tmp_path / "board-wrapper"
    script.write_text(f"#!/bin/sh\n{shlex.quote(str(BOARD))} --demo\necho after the board\n")  # no exec
    script.chmod(0o755)
    return str(script)


def su_command(env: dict[str, str]) -> list[str]:
    if os.geteuid() != 0 or not shutil.which("su"):
        pytest.skip("su -c needs root")
    # su resets HOME and may reset more: say the environment in the command itself.
    names = ("HOME", "XDG_STATE_HOME", "BOARD_DB", "TERM", "LANG")
    assignments = " ".join(f"{name}={shlex.quote(env[name])}" for name in names)
    return ["su", "root", "-c", f"{assignments} {shlex.quote(str(BOARD))} --demo"]


def make_run() -> list[str]:
    if not shutil.which("make"):
        pytest.skip("needs make")
    # The `run` target as is; -o keeps make from reinstalling the venv mid-test when its stamp is older
    # than pyproject.toml. Where there is an NVIDIA driver the target drops --demo: BOARD_DB still holds.
    return ["make", "-s", "-o", ".venv/.runtime", "run"]


LAUNCHERS = {
    "direct": lambda tmp_path, env: [str(BOARD), "--demo"],
    "make run": lambda tmp_path, env: make_run(),
    "sh wrapper without exec": lambda tmp_path, env: [wrapper_script(tmp_path)],
    "su -c": lambda tmp_path, env: su_command(env),
}


class TestClosedTerminal:
    @pytest.mark.parametrize("launcher", LAUNCHERS)
    def test_the_board_ends_when_its_terminal_closes(self, launch, launcher, tmp_path, env):
        started = launch(LAUNCHERS[launcher](tmp_path, env))
        boards = started.drawn()
        started.close_terminal()
        seconds = started.wait_gone(boards, ENDS_WITHIN)
        assert seconds <= ENDS_WITHIN
        started.wait_gone(started.seen, 5.0)  # and the launcher (make, sh, su) follows it


class TestStillEnds:
    def test_q_quits_and_restores_the_terminal(self, launch):
        started = launch([str(BOARD), "--demo"])
        boards = started.drawn()
        os.write(started.master, b"q")
        started.read_until(LEAVE_ALT_SCREEN, 5.0)
        started.wait_gone(boards, 5.0)
        assert started.exit_code() == 0

    def test_sigterm_ends_the_board_and_restores_the_terminal(self, launch):
        started = launch([str(BOARD), "--demo"])
        (board,) = started.drawn()
        board.send_signal(signal.SIGTERM)
        started.read_until(LEAVE_ALT_SCREEN, ENDS_WITHIN)
        started.wait_gone([board], ENDS_WITHIN)
        assert started.exit_code() == 128 + signal.SIGTERM

    def test_sighup_under_make_ends_the_board(self, launch):
        """`kill -HUP` reaches the board itself (the terminal still open): it ends rather than lingering."""
        started = launch(make_run())
        (board,) = started.drawn()
        board.send_signal(signal.SIGHUP)
        started.read_until(LEAVE_ALT_SCREEN, ENDS_WITHIN)
        started.wait_gone([board], ENDS_WITHIN)


# An app that never ends (a shutdown stuck writing to a dead terminal): only the fallback is left.
STUCK_APP = """
import os, time, tty
from app.tui.hangup import ending_on_hangup
with ending_on_hangup(lambda code: None):
    tty.setraw(0)
    os.write(2, b"ready")
    time.sleep(60)
"""


class TestFallback:
    def test_a_stuck_app_still_ends_when_the_terminal_closes(self, launch):
        started = launch([str(REPO / ".venv" / "bin" / "python"), "-c", STUCK_APP])
        started.read_until(b"ready")
        started.close_terminal()
        process = psutil.Process(started.pid)
        started.seen = [process]
        started.wait_gone([process], ENDS_WITHIN)
        assert started.exit_code() == 128 + signal.SIGHUP

    def test_a_stuck_app_puts_the_terminal_back_on_sigterm(self, launch):
        started = launch([str(REPO / ".venv" / "bin" / "python"), "-c", STUCK_APP])
        started.read_until(b"ready")
        process = psutil.Process(started.pid)
        started.seen = [process]
        process.send_signal(signal.SIGTERM)
        started.read_until(LEAVE_ALT_SCREEN, ENDS_WITHIN)
        started.wait_gone([process], ENDS_WITHIN)
        assert started.exit_code() == 128 + signal.SIGTERM
