"""The supervisor: a tiny detached Python process that owns one llama-server for its whole life.

Why a supervisor. The board process that starts a server (the CLI, a TUI) must be able to exit
without taking the server along, yet a detached process's exit status is lost unless its parent
collects it. So `board serve start` (app.llama.launch) starts this script, detached and as the
member who asked, and this script starts llama-server as its own child:

    board serve start ──spawn (new session, stdio → log)──▶ supervisor ──Popen──▶ llama-server
                       (returns when the row says ready)    pid = pgid = sid     same process group

* **Process group.** The supervisor leads a new session and process group; llama-server inherits it.
  On SIGTERM the supervisor notes the request, forwards it to llama-server, SIGKILLs it after 10 s,
  records `stopped` with the exit status, then exits.
* **Exit information.** When llama-server ends without being asked (`kill -9`, a segfault, a failed
  bind), the supervisor sees the exit status via `waitpid` and reports `crashed` with the exit code or
  signal and the last 20 lines of the log.
* **No orphans if the supervisor itself dies.** llama-server runs with PR_SET_PDEATHSIG = SIGKILL, so a
  `kill -9` of the supervisor takes the server with it.
* **Its own key.** Before the launch it makes a random API key and hands it to llama-server through a
  pipe (`--api-key-file /dev/fd/N`, read to its end at start), so nobody without the key can use the port
  and the key lies in no file: servers that run as one user (the runner's) cannot read each other's. The
  key goes to the service (or the user's database) with the registration.
* **Files it hands over.** A file flag of the extra arguments (`--chat-template-file`, `--lora`, ...;
  app.llama.flags) is opened here, checked to be a regular file that really lies under `--model-dirs`
  (`[llama] model_dirs`), and passed as /dev/fd/N; a command line off the allow-list is not started
  (the reason goes where the exit goes). llama-server thus opens no path a member chose.
* **Readiness.** It polls GET /health (503 while loading) and reports `ready` at the first 200, or
  `failed` (and stops the server) when none comes within llama.ready_timeout_s.
* **Memory.** With `ready` goes what llama.cpp logged of its buffers at load (`-lv 4`: weights, KV cache
  and compute per device), read from this server's part of its own log by app.llama.memory, so that
  board can show the memory actually used beside its estimate.

Where the reports go: one `_Reporter` interface, two ends.

* `--socket PATH` (the shared install). Right after the launch it connects to the board service
  and registers (`register`, kind "server", the server id) on a connection it keeps open. The
  service takes its pid and uid from SO_PEERCRED and opens a pidfd: from then on the service
  signals only through that. Reports are JSON lines on that connection (`ready`, `failed`, `exit`,
  and `log` with the new lines of its own log, which the service never opens). A refused
  registration stops the server. Losing the connection (the service restarted, or was killed) does
  not: the server keeps serving, and the supervisor registers again (`resume`) once a second until
  the service answers; the service checks the pid, start time and uid against what it recorded, and
  a refusal then stops the server. While the service is away, the booking's end (as the last
  registration told it) plus `--backstop` seconds stops the server, as in file mode.
* `--db PATH` (file mode: the user's own database). It calls the same ServerService methods on its
  own connection, reads its row once a second (a `stopping` row means stop) and, as a backstop for
  a host without `board agent`, stops the server `--backstop` seconds after the booking ends.

The server is launched before anything slow is imported, so the supervisor adds only an interpreter
start to the time to ready. Usage (by app.llama.launch, not by hand):

    python supervisor.py (--db DB | --socket PATH) --server ID --host H --port P --ready-timeout S
                         --backstop S --log PATH [--model-dirs "DIR\nDIR..."] -- llama-server ARGS...
"""

from __future__ import annotations

import os
import signal
import sys
import time

KILL_AFTER_S = 10.0
CHECK_S = 1.0
PR_SET_PDEATHSIG = 1
LOG_LINE_MAX = 1000  # characters of one log line sent to the service
LOG_BATCH_MAX = 200  # lines in one `log` message
LOG_RESEND_MAX = 256 << 10  # bytes of the log's end sent again after a resume (the service kept none of it)
MEMORY_LOG_MAX = 16 << 20  # bytes of the log read for the memory figures (llama.cpp logs them at load, early on)
MEMORY_TRIES, MEMORY_RETRY_S = 10, 0.05  # llama.cpp's log thread may not have written the last buffer line yet
RECONNECT_S = 1.0  # how often a supervisor that lost the service tries to register again


class _StopRequest:
    requested = False
    at = 0.0

    def __call__(self, signum, frame) -> None:
        if not self.requested:
            self.requested, self.at = True, time.monotonic()


def _parse(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    if "--" not in argv:
        raise SystemExit("usage: supervisor.py (--db DB | --socket PATH) --server ID ... -- llama-server ARGS...")
    split = argv.index("--")
    options, command = argv[:split], argv[split + 1:]
    opts = {}
    for i in range(0, len(options) - 1, 2):
        opts[options[i].lstrip("-")] = options[i + 1]
    for required in ("server", "host", "port", "ready-timeout", "backstop", "log"):
        if required not in opts:
            raise SystemExit(f"supervisor: missing --{required}")
    if ("db" in opts) == ("socket" in opts):
        raise SystemExit("supervisor: give --db or --socket")
    if not command:
        raise SystemExit("supervisor: no command after --")
    return opts, command


def _death_signal_setter():
    """A preexec_fn that ties the child's life to ours (Linux); resolved before fork."""
    try:
        # start-up: imported where first needed, after the launch where it can (the module's note)
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

    # start-up: imported where first needed, after the launch where it can (the module's note)
    import subprocess

    launched_at = time.monotonic()
    log_start = _size(opts["log"])  # the log may hold an earlier server's lines (it is appended to)
    api_key = _new_key()
    passed: list[int] = []
    try:
        command, passed = _hand_over(command, [d for d in opts.get("model-dirs", "").split("\n") if d])
        key_in = _key_pipe(api_key)
        passed.append(key_in)
        child = subprocess.Popen([*command, "--api-key-file", f"/dev/fd/{key_in}"], stdin=subprocess.DEVNULL,
                                 close_fds=True, pass_fds=passed, preexec_fn=_death_signal_setter())
        launch_error = None
    except _Refused as refused:
        child, launch_error = None, str(refused)
    except OSError as error:
        child, launch_error = None, f"can't run {command[0]}: {error.strerror or error}"
    finally:
        for fd in passed:
            os.close(fd)
    return _supervise(opts, command, child, launch_error, launched_at, stop, log_start, api_key)


class _Refused(Exception):
    """The command line holds what the supervisor will not hand to llama-server."""


def _new_key() -> str:
    import secrets  # start-up: small; before the launch, which needs the key

    return secrets.token_urlsafe(32)


def _key_pipe(key: str) -> int:
    """The read end of a pipe that holds the key and is closed for writing: llama-server reads its
    --api-key-file with std::ifstream and getline, to the end, so the key never lies in a file."""
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, (key + "\n").encode())
    finally:
        os.close(write_end)
    return read_end


def _hand_over(command: list[str], model_dirs: list[str]) -> tuple[list[str], list[int]]:
    """The command with each file flag's path replaced by /dev/fd/N of a file opened here, and those fds.

    Each file must be a regular file that really lies under [llama] model_dirs (symlinks resolved, read
    back from the open descriptor itself), so a name swapped after the check changes nothing: llama-server
    reads the very file checked, and opens no path a member chose (app.llama.flags). The whole line is
    read as llama.cpp reads it; anything off the allow-list is refused here too."""
    import stat  # start-up: small; before the launch

    from app.llama import flags

    try:
        pairs = flags.split(command[1:], board=True)
    except flags.Refused as refused:
        raise _Refused(str(refused)) from None
    dirs = [os.path.realpath(d) for d in model_dirs if os.path.isabs(d)]
    line = [command[0]]
    fds: list[int] = []
    try:
        for flag, values in pairs:
            if flag in flags.FILES:
                values = [f"/dev/fd/{_open_under(flag, values[0], dirs, fds, stat)}"]
            line += [flag, *values]
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return line, fds


def _open_under(flag: str, path: str, dirs: list[str], fds: list[int], stat) -> int:
    from app.llama import flags
    refusal = f"extra argument {flag}: {path[:200]} is not a file under [llama] model_dirs"
    if not dirs:
        raise _Refused(f"extra argument {flag} takes a file under [llama] model_dirs, and none is configured")
    try:  # non-blocking: a FIFO put in the file's place must not hang the launch
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK)
    except OSError as error:
        raise _Refused(f"extra argument {flag}: can't open {path[:200]}: {error.strerror}") from None
    fds.append(fd)
    real = os.readlink(f"/proc/self/fd/{fd}")
    if not stat.S_ISREG(os.fstat(fd).st_mode) or not flags.under(real, dirs):
        raise _Refused(refusal)
    os.set_blocking(fd, True)
    return fd


def _supervise(opts, command, child, launch_error, launched_at, stop, log_start, api_key) -> int:
    # Everything below may be slow to import; the server is already loading.
    try:
        reporter: _SocketReporter | _DatabaseReporter
        if "socket" in opts:
            reporter = _SocketReporter(opts, child, api_key)
        else:
            reporter = _DatabaseReporter(opts, child, api_key)
    except Exception as error:  # noqa: BLE001 - nobody to report to: the server must not run unsupervised
        print(f"board supervisor: {error}; stopping the server", file=sys.stderr, flush=True)
        if child is not None:
            child.kill()
            child.wait()
        return 1
    return _Supervision(opts, command, child, launch_error, launched_at, stop, reporter, log_start).run()


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


# -- where reports go ---------------------------------------------------------------------------


class _SocketReporter:
    """The shared install: register with the service, then send each report as a JSON line; register again
    (`resume`) after the service went away."""

    def __init__(self, opts, child, api_key: str) -> None:
        # start-up: imported where first needed, after the launch where it can (the module's note)
        import json
        import socket

        self.json, self.socket = json, socket
        self.path, self.server_id, self.log_path = opts["socket"], int(opts["server"]), opts["log"]
        self.backstop = float(opts["backstop"])
        self.child_pid, self.api_key = (child.pid if child else None), api_key
        self.position = 0
        self.pending = b""
        self.partial = False  # the first line read is the rest of one (after a rewind)
        self.booking_end: float | None = None
        self.ready_report: dict | None = None  # sent again after a resume: it may have been lost with the service
        self.refused: str | None = None
        self.next_try = 0.0
        error = self._connect(resume=False)
        if error is not None:
            raise RuntimeError(error)
        self.send_log()

    def _connect(self, *, resume: bool) -> str | None:
        """Connect and register; None when the service took us, else why not (self.refused when it said no)."""
        json, socket = self.json, self.socket
        self.lost = True
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(30)
        try:
            sock.connect(self.path)
        except OSError as error:
            sock.close()
            return f"can't reach the board service at {self.path}: {error.strerror or error}"
        reader = sock.makefile("rb")
        args = {"kind": "server", "server": self.server_id, "pid": self.child_pid, "log": self.log_path,
                "api_key": self.api_key}
        if resume:
            args["resume"] = True
        try:
            sock.sendall((json.dumps({"v": 1, "id": 1, "op": "register", "args": args}) + "\n").encode())
        except OSError:
            pass  # refused at the door (too many connections): the service closed first; its one line is still here
        try:
            reply = reader.readline(1 << 20)
        except OSError:
            reply = b""
        try:
            answer = json.loads(reply) if reply else {}
        except ValueError:
            answer = {}
        if not answer.get("ok"):
            sock.close()
            if not answer.get("error"):  # closed without a word: a service going down or not up yet
                return "the service closed the connection"
            message = answer["error"].get("message") or "refused"
            self.refused = f"the board service refused server {self.server_id}: {message}"
            return self.refused
        end = (answer.get("result") or {}).get("booking_end")
        if isinstance(end, (int, float)) and not isinstance(end, bool):
            self.booking_end = float(end)
        self.sock, self.reader, self.lost = sock, reader, False
        self.sock.setblocking(False)
        return None

    def _send(self, message: dict) -> None:
        if self.lost:
            return
        data = (self.json.dumps(message, separators=(",", ":")) + "\n").encode()
        self.sock.settimeout(10)
        try:
            self.sock.sendall(data)
        except OSError:
            self._lose()
        else:
            self.sock.setblocking(False)

    def _lose(self) -> None:
        if not self.lost:
            self.lost = True
            print("board: lost the board service; the server keeps running, registering again", file=sys.stderr,
                  flush=True)
            try:
                self.sock.close()
            except OSError:
                pass

    def started(self, child_identity) -> None:
        pass  # the service learnt the pid at registration

    def ready(self, memory: dict | None) -> None:
        self.ready_report = {"event": "ready", "memory": memory} if memory else {"event": "ready"}
        self._send(self.ready_report)

    def failed(self, reason: str, tail: list[str]) -> None:
        self._send({"event": "failed", "reason": reason, "tail": tail})

    def ended(self, *, code, sig, text, tail, asked) -> None:
        if self.lost and self.refused is None:
            self._connect(resume=True)  # once: the service may be back to hear how it ended
        self.send_log()
        self._send({"event": "exit", "code": code, "signal": sig, "text": text, "tail": tail, "asked": asked})
        if not self.lost:
            try:
                self.sock.close()
            except OSError:
                pass

    def check(self, now: float) -> str | None:
        """'stop' when the service refused us again, or it is away and the booking is over (plus the backstop)."""
        if self.lost:
            return self._reconnect(now)
        self.send_log()
        try:
            data = self.sock.recv(4096)
        except BlockingIOError:
            data = None
        except OSError:
            data = b""
        if data == b"" or self.lost:
            self._lose()
            return self._reconnect(now)
        return None

    def _reconnect(self, now: float) -> str | None:
        if self.refused is not None:
            print(f"board: {self.refused}; stopping the server", file=sys.stderr, flush=True)
            return "stop"
        if self.booking_end is not None and self.backstop >= 0 and time.time() >= self.booking_end + self.backstop:
            print("board: the booking is over and the board service is away; stopping the server", file=sys.stderr,
                  flush=True)
            return "stop"
        if now < self.next_try:
            return None
        self.next_try = now + RECONNECT_S
        if self._connect(resume=True) is None:
            print("board: registered again with the board service", file=sys.stderr, flush=True)
            self._rewind()
            if self.ready_report is not None:
                self._send(self.ready_report)
            self.send_log()
        elif self.refused is not None:
            print(f"board: {self.refused}; stopping the server", file=sys.stderr, flush=True)
            return "stop"
        return None

    def _rewind(self) -> None:
        """A restarted service holds none of our log: send its last lines again, for `board serve logs`."""
        self.position = max(0, _size(self.log_path) - LOG_RESEND_MAX)
        self.pending, self.partial = b"", self.position > 0

    def send_log(self) -> None:
        """The new complete lines of our own log (written by us and llama-server), for `board serve logs`."""
        if self.lost:
            return  # read on once the service is back
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self.position)
                chunk = f.read(1 << 20)
        except OSError:
            return
        if not chunk:
            return
        self.position += len(chunk)
        self.pending += chunk
        *complete, self.pending = self.pending.split(b"\n")
        if self.partial and complete:
            complete, self.partial = complete[1:], False
        lines = [line.decode("utf-8", "replace")[:LOG_LINE_MAX] for line in complete]
        for start in range(0, len(lines), LOG_BATCH_MAX):
            self._send({"event": "log", "lines": lines[start:start + LOG_BATCH_MAX]})


class _DatabaseReporter:
    """File mode: the user's own database, through the same ServerService methods the service uses."""

    def __init__(self, opts, child, api_key: str) -> None:
        # start-up: imported where first needed, after the launch where it can (the module's note)
        import pwd
        from pathlib import Path

        from app.config import Config
        from app.core.identity import Identity
        from app.llama.service import ServerService
        from app.store.db import connect

        self.server_id, self.backstop, self.log_path = int(opts["server"]), float(opts["backstop"]), opts["log"]
        self.api_key = api_key
        uid = os.getuid()
        try:
            user = pwd.getpwuid(uid).pw_name
        except KeyError:
            user = f"uid{uid}"
        # --db is the SQLite file, or a PostgreSQL store's url (app.service.ops.servers' launch grant).
        url = opts["db"] if opts["db"].startswith(("postgresql://", "postgres://")) else None
        config = Config(storage_url=url) if url else Config(db_path=Path(opts["db"]))
        try:
            self.conn = connect(config.store, create=False)
        except Exception as error:  # noqa: BLE001
            raise RuntimeError(f"can't open the board database {opts['db']}: {error}") from None
        self.service = ServerService(self.conn, Identity(user, uid, False), config)

    def _write(self, change, attempts: int = 5):
        """Run one report; retry a locked database, never die of it."""
        # start-up: imported where first needed, after the launch where it can (the module's note)
        import sqlite3

        from app.errors import BoardError

        for attempt in range(attempts):
            try:
                return change(self.service)
            except (sqlite3.Error, BoardError) as error:
                if attempt == attempts - 1:
                    print(f"board supervisor: can't update server {self.server_id}: {error}", file=sys.stderr)
                    return None
                time.sleep(0.2 * (attempt + 1))

    def started(self, child_identity) -> None:
        # start-up: imported where first needed, after the launch where it can (the module's note)
        from app.llama.identity import capture

        me = capture(os.getpid())
        self._write(lambda s: s.supervised(self.server_id, supervisor=me, pgid=os.getpgrp(), child=child_identity,
                                           api_key=self.api_key))

    def ready(self, memory: dict | None) -> None:
        self._write(lambda s: s.ready(self.server_id, measured=memory))

    def failed(self, reason: str, tail: list[str]) -> None:
        self._write(lambda s: s.failed(self.server_id, reason, tail))

    def ended(self, *, code, sig, text, tail, asked) -> None:
        self._write(lambda s: s.ended(self.server_id, exit_code=code, exit_signal=sig, text=text, tail=tail,
                                      asked=asked))

    def check(self, now: float) -> str | None:
        """'ready' when the row already says so, 'stop' when it asks to stop or the booking is over."""
        # start-up: imported where first needed, after the launch where it can (the module's note)
        import sqlite3

        from app.llama import rows

        try:
            row = rows.get(self.conn, self.server_id)
        except sqlite3.Error:
            return None
        if row is None:
            return None
        if row.state not in (rows.STARTING, rows.READY):
            return "stop"  # stopping (asked by someone who cannot signal us), or already final
        if self.backstop >= 0:
            booking = self.conn.execute("SELECT ends_at, status FROM bookings WHERE id = ?",
                                        (row.booking_id,)).fetchone()
            if booking is not None and (booking[1] != "booked" or time.time() >= booking[0] + self.backstop):
                reason = f"booking {row.booking_id} ended"
                print(f"board: {reason}; stopping the server", file=sys.stderr, flush=True)
                self._write(lambda s: s.stop(self.server_id, reason=reason, enforce=True, wait=False))
                return "stop"
        return "ready" if row.state == rows.READY else None

    def send_log(self) -> None:
        pass  # the file is the user's own; readers open it


# -- the life of the server ---------------------------------------------------------------------


class _Supervision:
    def __init__(self, opts, command, child, launch_error, launched_at, stop, reporter, log_start: int = 0) -> None:
        self.server_id = int(opts["server"])
        self.host, self.port = opts["host"], int(opts["port"])
        self.ready_timeout = float(opts["ready-timeout"])
        self.log_path, self.log_start = opts["log"], log_start
        self.command, self.child, self.launch_error = command, child, launch_error
        self.launched_at, self.stop, self.report = launched_at, stop, reporter
        self.ready = False
        self.kill_at: float | None = None  # set once the server has been asked to stop
        self.killed = False

    def _tail(self) -> list[str]:
        # start-up: imported where first needed, after the launch where it can (the module's note)
        from app.llama import logs

        return logs.tail(self.log_path)

    def run(self) -> int:
        # start-up: imported where first needed, after the launch where it can (the module's note)
        from app.llama import identity

        if self.child is None:
            self._finish(None)
            return 1
        self.report.started(identity.capture(self.child.pid))
        try:
            pidfd = os.pidfd_open(self.child.pid)
        except (AttributeError, OSError):
            pidfd = None
        next_check = 0.0
        while self.child.poll() is None:
            now = time.monotonic()
            if self.stop.requested:
                self._terminate(now)
            if self.kill_at is not None and now >= self.kill_at and not self.killed:
                self.child.kill()
                self.killed = True
            if not self.ready and self.kill_at is None:
                self._check_ready(now)
            if now >= next_check:
                next_check = now + CHECK_S
                verdict = self.report.check(now)
                if verdict == "ready":
                    self.ready = True  # the waiting CLI saw the 200 first
                elif verdict == "stop":
                    self._terminate(now)
            timeout = 0.1 if not self.ready else CHECK_S
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
        # start-up: imported where first needed, after the launch where it can (the module's note)
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
        # start-up: imported where first needed, after the launch where it can (the module's note)
        from app.llama import health

        if health.health(self.host, self.port, timeout=0.5) == 200:
            self.ready = True
            self.report.ready(self._memory())
        elif now - self.launched_at > self.ready_timeout:
            reason = f"not ready within {self.ready_timeout:g} s"
            print(f"board: {reason}; stopping it", file=sys.stderr, flush=True)
            self.report.failed(reason, self._tail())
            self._terminate(now)

    def _memory(self) -> dict | None:
        """What llama.cpp logged of its buffers at load (Measured.to_json), or None when the log has none
        (a build that does not log them, or `-lv` lowered in the extra arguments)."""
        # start-up: imported where first needed, after the launch where it can (the module's note)
        from app.llama.memory import read_memory

        measured = None
        for attempt in range(MEMORY_TRIES):
            measured = read_memory(self._log_lines())
            if measured is not None and measured.compute_mib > 0:  # compute is reserved, and logged, last
                break
            if attempt < MEMORY_TRIES - 1:
                time.sleep(MEMORY_RETRY_S)
        return measured.to_json() if measured is not None else None

    def _log_lines(self) -> list[str]:
        """This server's lines of the log: from where it stood at launch."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self.log_start)
                data = f.read(MEMORY_LOG_MAX)
        except OSError:
            return []
        return data.decode("utf-8", "replace").splitlines()

    def _finish(self, returncode: int | None) -> None:
        # start-up: imported where first needed, after the launch where it can (the module's note)
        from app.llama import identity

        if returncode is None:
            code, sig, text = None, None, self.launch_error
        else:
            code, sig = identity.exit_info(returncode)
            text = f"killed by signal {sig} ({identity.signal_name(sig)})" if sig else f"exit code {code}"
        print(f"board: llama-server {'(pid %d) ' % self.child.pid if self.child else ''}ended: {text}",
              file=sys.stderr, flush=True)
        self.report.ended(code=code, sig=sig, text=text, tail=self._tail(), asked=self.stop.requested)


if __name__ == "__main__":
    # Run as a script by path: put the package root (not this directory) first on sys.path.
    sys.path[0] = __file__.rsplit("/", 3)[0]
    raise SystemExit(main())
