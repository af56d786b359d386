"""`board agent` as the systemd unit runs it, without systemd: the one way tests and benchmarks start it.

    umask 077; setpriv --reuid board --regid board --init-groups --inh-caps +kill --ambient-caps +kill board agent

in a session of its own (as under systemd: never the process group of the tests or of a job),
with the config named by BOARD_CONFIG and the simulated fleet (the default fleet, its team's processes under the
uids the real users have here: team_fleet), and where a test
gives the unit's LimitNOFILE=, under `prlimit --nofile=SOFT:HARD`. Plain Python, no pytest: bench/
uses it too.
"""

from __future__ import annotations

import json
import pwd
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import replace
from pathlib import Path

from msgspec import structs

from app.gpu.simulated import DEFAULT_FLEET, load_scenario

REPO = Path(__file__).resolve().parent.parent
SETPRIV = shutil.which("setpriv") or "/usr/bin/setpriv"
PRLIMIT = shutil.which("prlimit") or "/usr/bin/prlimit"
SERVICE_USER = "board"
PRIVILEGES = ["--reuid", SERVICE_USER, "--regid", SERVICE_USER, "--init-groups",
              "--inh-caps", "+kill", "--ambient-caps", "+kill"]
ENVIRON = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "TZ": "UTC", "PYTHONUNBUFFERED": "1",
           "PYTHONDONTWRITEBYTECODE": "1", "BOARD_SIMULATE": "1"}


def team_fleet(path: Path) -> Path:
    """Write the default simulated fleet as a scenario at `path`, each process under the uid its user has on this
    machine (its user name alone where no such user exists): the demo team's made-up uids (1001, 1002) may be other
    users' here, and alice's simulated training must be alice's whatever uid useradd gave her."""
    processes = tuple((index, structs.replace(process, uid=_uid(process.user))) for index, process in DEFAULT_FLEET.processes)
    lines = ["[cards]", f"count = {len(DEFAULT_FLEET.cards)}",
             f"switches = {len({card.switch for card in DEFAULT_FLEET.cards})}", "",
             "[faults]", f"hot = {sorted(DEFAULT_FLEET.hot)}", ""]
    for index, process in processes:
        lines += ["[[processes]]", f"card = {index}", f"pid = {process.pid}", f"command = {json.dumps(process.command)}"]
        lines += [f"{key} = {json.dumps(value)}" for key, value in
                  (("used_mib", process.used_mib), ("user", process.user), ("uid", process.uid)) if value is not None]
        lines.append("")
    path.write_text("\n".join(lines))
    path.chmod(0o644)
    # Everything else as the default fleet has it (a change there shows here, not as a puzzling test elsewhere).
    assert load_scenario(str(path)) == replace(DEFAULT_FLEET, processes=processes), "team_fleet: update it"
    return path


def _uid(user: str | None) -> int | None:
    try:
        return None if user is None else pwd.getpwnam(user).pw_uid
    except KeyError:
        return None


def start(program: list[str], config: Path, log: Path, env: dict | None = None,
          nofile: str | None = None) -> subprocess.Popen:
    """Spawn the agent (`program` is how to run board: the installed entry point or `python -m app`); `nofile`
    ("1024:1024") sets its open-file limits first, as systemd does for LimitNOFILE=. Its fleet is team_fleet's,
    written beside the config, unless `env` names BOARD_SIMULATE."""
    limits = [PRLIMIT, f"--nofile={nofile}", "--"] if nofile else []
    command = ["/bin/sh", "-c", 'umask 077; exec "$@"', "sh", *limits, SETPRIV, *PRIVILEGES, "--", *program, "agent"]
    fleet = {"BOARD_SIMULATE": str(team_fleet(config.with_name("simulated-fleet.toml")))}
    with open(log, "ab") as out:
        return subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                env={**ENVIRON, "BOARD_CONFIG": str(config), **fleet, **(env or {})}, cwd=REPO,
                                start_new_session=True)


def start_daemon(user: str, program: list[str], command: list[str], config: Path, log: Path,
                 env: dict | None = None) -> subprocess.Popen:
    """A board daemon other than the agent (`board gateway`) as its unit runs it: as `user`, no capabilities,
    umask 077, in a session of its own:  setpriv --reuid USER --regid USER --init-groups board COMMAND..."""
    privileges = ["--reuid", user, "--regid", user, "--init-groups"]
    argv = ["/bin/sh", "-c", 'umask 077; exec "$@"', "sh", SETPRIV, *privileges, "--", *program, *command]
    with open(log, "ab") as out:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                env={**ENVIRON, "BOARD_CONFIG": str(config), **(env or {})}, cwd=REPO,
                                start_new_session=True)


def answers(path: Path) -> bool:
    """Something accepts connections on the socket."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(2)
    try:
        probe.connect(str(path))
        return True
    except OSError:
        return False
    finally:
        probe.close()


def wait_serving(process: subprocess.Popen, path: Path, log: Path, timeout: float = 30.0) -> None:
    """Until the agent answers on `path`; AssertionError, with its log, when it exits or stays silent."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"board agent exited {process.returncode} at start:\n{tail(log)}")
        if answers(path):
            return
        time.sleep(0.05)
    raise AssertionError(f"board agent did not serve {path} within {timeout:g} s:\n{tail(log)}")


def stop(process: subprocess.Popen | None, timeout: float = 15.0) -> int | None:
    """SIGTERM, as systemctl stop does: its exit status, or None when it had to be killed."""
    if process is None or process.poll() is not None:
        return None if process is None else process.returncode
    process.send_signal(signal.SIGTERM)
    try:
        return process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)
        return None


def tail(log: Path) -> str:
    try:
        return log.read_text(errors="replace")[-4000:]
    except OSError:
        return "(no log)"
