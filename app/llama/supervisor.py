"""The supervisor: a tiny detached Python process that owns one llama-server for its whole life.

Why a supervisor. The board process that starts a server (the CLI, a TUI) must be able to exit
without taking the server along, yet a detached process's exit status is lost unless its parent
collects it. So `board serve start` starts this script, detached, and this script starts
llama-server as its own child:

    board serve start ──spawn (new session, stdio → log)──▶ supervisor ──Popen──▶ llama-server
                       (returns when /health says 200)      pid = pgid = sid     same process group

* **Process group.** The supervisor leads a new session and process group; llama-server inherits it.
  Stopping is `killpg(pgid, SIGTERM)`, then SIGKILL after 10 s: both die, nothing is left behind.
  On SIGTERM the supervisor only notes the request, waits for llama-server to exit (forwarding the
  signal if it came to the supervisor alone), records `stopped` with the exit status, then exits.
* **Exit information.** When llama-server ends without being asked (`kill -9`, a segfault, a
  failed bind), the supervisor sees the exit status via `waitpid` and records `crashed` with the
  exit code or signal and the last 20 lines of the log.
* **No orphans if the supervisor itself dies.** llama-server runs with PR_SET_PDEATHSIG = SIGKILL, so
  a `kill -9` of the supervisor takes the server with it; the next board that looks (any
  `board serve list`, the TUI, `board agent`) finds neither process and marks the row `crashed`
  ("exit status unknown").
* **Readiness.** It polls GET /health (503 while loading) and records `ready` at the first 200, or
  `failed` (and stops the server) when none comes within llama.ready_timeout_s. The CLI that waits
  polls /health too and records `ready` itself if it sees the 200 first; the state change is
  conditional, so whichever is first wins.
* **Requests through the database.** Once a second it reads its row. A `stopping` state (set by an
  admin or agent who may not signal another user's processes) makes it stop the server itself. As a
  backstop for a host without `board agent`, it also stops the server `--backstop` seconds after the
  booking ends (the agent and any board instance normally do so first).
* **Identity.** The row holds pid + create time + command line of both processes; see
  app.llama.identity. Nothing signals a PID whose identity does not match.

The server is launched before anything slow is imported, so the supervisor adds only an interpreter
start to the time to ready. Usage (by app.llama.service, not by hand):

    python supervisor.py --db DB --server ID --host H --port P --ready-timeout S --backstop S -- llama-server ARGS...
"""

from __future__ import annotations

import os
import signal
import sys
import time

KILL_AFTER_S = 10.0
DB_CHECK_S = 1.0
PR_SET_PDEATHSIG = 1


class _StopRequest:
    requested = False
    at = 0.0

    def __call__(self, signum, frame) -> None:
        if not self.requested:
            self.requested, self.at = True, time.monotonic()


def _parse(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    if "--" not in argv:
        raise SystemExit("usage: supervisor.py --db DB --server ID ... -- llama-server ARGS...")
    split = argv.index("--")
    options, command = argv[:split], argv[split + 1:]
    opts = {}
    for i in range(0, len(options) - 1, 2):
        opts[options[i].lstrip("-")] = options[i + 1]
    for required in ("db", "server", "host", "port", "ready-timeout", "backstop"):
        if required not in opts:
            raise SystemExit(f"supervisor: missing --{required}")
    if not command:
        raise SystemExit("supervisor: no command after --")
    return opts, command


def _death_signal_setter():
    """A preexec_fn that ties the child's life to ours (Linux); resolved before fork."""
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # we died between fork and prctl
            os._exit(1)

    return preexec


def main(argv: list[str] | None = None) -> int:
    opts, command = _parse(sys.argv[1:] if argv is None else argv)
    stop = _StopRequest()
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, stop)

    import subprocess

    launched_at = time.monotonic()
    try:
        child = subprocess.Popen(command, stdin=subprocess.DEVNULL, close_fds=True,
                                 preexec_fn=_death_signal_setter())
        launch_error = None
    except OSError as error:
        child, launch_error = None, f"can't run {command[0]}: {error.strerror or error}"

    # Everything below may be slow to import; the server is already loading.
    try:
        supervision = _Supervision(opts, command, child, launch_error, launched_at, stop)
    except Exception as error:  # noqa: BLE001 - no database: the server must not run unsupervised
        print(f"board supervisor: can't open the board database {opts['db']}: {error}; stopping the server",
              file=sys.stderr, flush=True)
        if child is not None:
            child.kill()
            child.wait()
        return 1
    return supervision.run()


class _Supervision:
    def __init__(self, opts, command, child, launch_error, launched_at, stop) -> None:
        import pwd
        from pathlib import Path

        from app.store.db import connect

        self.server_id = int(opts["server"])
        self.host, self.port = opts["host"], int(opts["port"])
        self.ready_timeout = float(opts["ready-timeout"])
        self.backstop = float(opts["backstop"])
        self.command, self.child, self.launch_error = command, child, launch_error
        self.launched_at, self.stop = launched_at, stop
        self.uid = os.getuid()
        try:
            self.user = pwd.getpwuid(self.uid).pw_name
        except KeyError:
            self.user = f"uid{self.uid}"
        self.conn = connect(Path(opts["db"]), create=False)
        self.ready = False
        self.kill_at: float | None = None  # set once the server has been asked to stop
        self.killed = False

    # -- the database ---------------------------------------------------------------------------

    def _write(self, change, attempts: int = 5) -> None:
        """Run `change(conn)` in a short write transaction; retry a locked database, never die of it."""
        import sqlite3

        from app.errors import BoardError
        from app.store.db import write

        for attempt in range(attempts):
            try:
                with write(self.conn):
                    change(self.conn)
                return
            except (sqlite3.Error, BoardError) as error:
                if attempt == attempts - 1:
                    print(f"board supervisor: can't update server {self.server_id}: {error}", file=sys.stderr)
                    return
                time.sleep(0.2 * (attempt + 1))

    def _event(self, conn, action: str, booking_id: int, details: dict) -> None:
        from app.store import events

        events.record(conn, ts=int(time.time()), uid=self.uid, actor=self.user, action=action,
                      booking_id=booking_id, ok=True, details={"server": self.server_id, "by": "supervisor", **details})

    def _row(self):
        import sqlite3

        from app.llama import rows

        try:
            return rows.get(self.conn, self.server_id)
        except sqlite3.Error:
            return None

    # -- the life of the server -----------------------------------------------------------------

    def run(self) -> int:
        from app.llama import identity, rows

        if self.child is None:
            self._finish(None)
            return 1
        found = identity.capture(self.child.pid)
        if found is not None:
            self._write(lambda c: rows.set_process(c, self.server_id, found.pid, found.started, found.cmdline))
        try:
            pidfd = os.pidfd_open(self.child.pid)
        except (AttributeError, OSError):
            pidfd = None
        next_db_check = 0.0
        while self.child.poll() is None:
            now = time.monotonic()
            if self.stop.requested:
                self._terminate(now)
            if self.kill_at is not None and now >= self.kill_at and not self.killed:
                self.child.kill()
                self.killed = True
            if not self.ready and self.kill_at is None:
                self._check_ready(now)
            if now >= next_db_check:
                next_db_check = now + DB_CHECK_S
                self._check_row(now)
            timeout = 0.1 if not self.ready else DB_CHECK_S
            if self.kill_at is not None and not self.killed:
                timeout = min(timeout, max(self.kill_at - now, 0.0))  # SIGKILL on time, not a tick late
            self._wait(pidfd, timeout)
        if pidfd is not None:
            os.close(pidfd)
        self._finish(self.child.returncode)
        return 0

    def _wait(self, pidfd, timeout: float) -> None:
        if pidfd is None:
            try:
                self.child.wait(timeout)
            except Exception:  # noqa: BLE001 - subprocess.TimeoutExpired
                pass
            return
        import select

        select.select([pidfd], [], [], timeout)

    def _terminate(self, now: float) -> None:
        if self.kill_at is None:
            self.kill_at = now + KILL_AFTER_S
            try:
                self.child.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass

    def _check_ready(self, now: float) -> None:
        from app.llama import health, logs, rows

        if health.health(self.host, self.port, timeout=0.5) == 200:
            self.ready = True
            self._write(lambda c: rows.transition(c, self.server_id, [rows.STARTING], rows.READY,
                                                  ready_at=int(time.time())))
        elif now - self.launched_at > self.ready_timeout:
            row = self._row()
            tail = logs.tail(row.log_path) if row else []
            reason = f"not ready within {self.ready_timeout:g} s"
            print(f"board: {reason}; stopping it", file=sys.stderr, flush=True)

            def change(c):
                if rows.transition(c, self.server_id, [rows.STARTING], rows.FAILED, reason=reason, log_tail=tail,
                                   ended_at=int(time.time())) and row:
                    self._event(c, "server-fail", row.booking_id, {"reason": reason})

            self._write(change)
            self._terminate(now)

    def _check_row(self, now: float) -> None:
        from app.llama import rows

        row = self._row()
        if row is None:
            return
        if row.state == rows.READY:
            self.ready = True  # the waiting CLI saw the 200 first
        if row.state not in (rows.STARTING, rows.READY):
            self._terminate(now)  # stopping (asked by someone who cannot signal us), or already final
            return
        if self.backstop < 0:
            return
        booking = self.conn.execute("SELECT ends_at, status FROM bookings WHERE id = ?", (row.booking_id,)).fetchone()
        if booking is None:
            return
        ends_at, status = booking
        wall = time.time()
        if status != "booked" or wall >= ends_at + self.backstop:
            reason = f"booking {row.booking_id} ended"

            def change(c):
                if rows.transition(c, self.server_id, [rows.STARTING, rows.READY], rows.STOPPING, reason=reason):
                    self._event(c, "server-stop", row.booking_id, {"reason": reason})

            print(f"board: {reason}; stopping the server", file=sys.stderr, flush=True)
            self._write(change)
            self._terminate(now)

    def _finish(self, returncode: int | None) -> None:
        from app.llama import identity, logs, rows

        row = self._row()
        tail = logs.tail(row.log_path) if row else []
        if returncode is None:
            code, sig, text = None, None, self.launch_error
        else:
            code, sig = identity.exit_info(returncode)
            text = f"killed by signal {sig} ({identity.signal_name(sig)})" if sig else f"exit code {code}"
        print(f"board: llama-server {'(pid %d) ' % self.child.pid if self.child else ''}ended: {text}",
              file=sys.stderr, flush=True)
        ended = int(time.time())
        info = dict(exit_code=code, exit_signal=sig, ended_at=ended)

        def change(c):
            current = rows.get(c, self.server_id)
            if current is None:
                return
            if current.state == rows.STOPPING or (self.stop.requested and current.state in rows.LIVE_STATES):
                rows.transition(c, self.server_id, rows.LIVE_STATES, rows.STOPPED, **info)
            elif current.state in (rows.STARTING, rows.READY):
                reason = "exited unexpectedly" if returncode is not None else text
                if rows.transition(c, self.server_id, [current.state], rows.CRASHED, reason=reason, log_tail=tail,
                                   **info):
                    self._event(c, "server-crash", current.booking_id, {"exit": text})
            elif current.exit_code is None and current.exit_signal is None:
                rows.update(c, self.server_id, exit_code=code, exit_signal=sig,
                            ended_at=current.ended_at or ended)

        self._write(change)


if __name__ == "__main__":
    # Run as a script by path: put the package root (not this directory) first on sys.path.
    sys.path[0] = __file__.rsplit("/", 3)[0]
    raise SystemExit(main())
