"""`board run` jobs through the service: stopped when their booking ends, and nobody else's process ever is.

The agent runs as the system user board with CAP_KILL only (as the unit runs it), enforcing every
0.5 s with a 2 s grace ([enforce] in the fixture's config). A booking's end is simulated by its
holder releasing it (`board release ID`), which makes it inactive at once.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest

from tests.users.conftest import wait_for


# A job: writes what it was given, notes SIGTERM in a file, and exits on it unless told to hold on.
JOB = """
import json, os, signal, sys, time
out, mode = sys.argv[1], sys.argv[2]
def on_term(*_):
    with open(os.path.join(out, "term"), "a") as f:
        f.write("TERM\\n")
    if mode == "exit":
        sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
keys = ("BOARD_BOOKING_ID", "BOARD_BOOKING_END", "CUDA_VISIBLE_DEVICES")
with open(os.path.join(out, "env.tmp"), "w") as f:
    json.dump({**{k: os.environ.get(k) for k in keys}, "pid": os.getpid(), "pgid": os.getpgrp()}, f)
os.rename(os.path.join(out, "env.tmp"), os.path.join(out, "env.json"))
while True:
    time.sleep(0.05)
"""

# A forger: registers over the socket by hand, naming someone else's pid, uid and booking in the arguments.
FORGE = """
import json, os, signal, socket, sys, time
from app.config import load_config
out = sys.argv[1]
booking, victim_pid, victim_uid, other_booking = (int(a) for a in sys.argv[2:6])
signal.signal(signal.SIGTERM, lambda *_: (open(os.path.join(out, "term"), "a").write("TERM\\n"), sys.exit(0)))
sock = socket.socket(socket.AF_UNIX)
sock.connect(load_config().service.socket)
reader = sock.makefile("rb")
def send(message):
    sock.sendall((json.dumps(message) + "\\n").encode())
send({"v": 1, "id": 1, "op": "register", "args": {"kind": "job", "booking": booking, "pid": victim_pid,
                                                   "uid": victim_uid, "pgid": victim_pid}})
first = json.loads(reader.readline())
# A replay on the same line, for someone else's booking: a registered line takes no more requests.
send({"v": 1, "id": 2, "op": "register", "args": {"kind": "job", "booking": other_booking}})
with open(os.path.join(out, "env.tmp"), "w") as f:
    json.dump({"pid": os.getpid(), "reply": first}, f)
os.rename(os.path.join(out, "env.tmp"), os.path.join(out, "env.json"))
while True:
    time.sleep(0.05)
"""


def read_json(path: Path, timeout: float = 30.0) -> dict:
    assert wait_for(path.exists, timeout), f"{path} never appeared"
    return json.loads(path.read_text())


def alive(process: subprocess.Popen) -> bool:
    return process.poll() is None


def start_job(board, user: str, booking: int, mode: str, name: str = "job", **popen) -> tuple[subprocess.Popen, Path]:
    out = board.home(user) / f"{name}-{booking}"
    out.mkdir()
    entry = pwd.getpwnam(user)
    os.chown(out, entry.pw_uid, entry.pw_gid)
    popen.setdefault("process_group", 0)  # as a login shell would: a group of its own
    job = board.spawn(user, "run", "--booking", str(booking), "--", sys.executable, "-c", JOB, str(out), mode,
                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, **popen)
    return job, out


def sleeper(board, user: str, **popen) -> subprocess.Popen:
    """A process of `user`'s that has nothing to do with any booking."""
    return board.spawn(user, program=["sleep", "300"], **popen)


def events(board, action: str, booking: int) -> list[dict]:
    return [e for e in board.log() if e["action"] == action and e["booking_id"] == booking]


def finish(*processes: subprocess.Popen) -> None:
    for process in processes:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=10)


def test_a_job_outliving_its_booking_gets_sigterm_and_knows_its_end(board):
    booking = board.book("bob", "1", "--for", "1h")
    job, out = start_job(board, "bob", booking["id"], "exit")
    try:
        env = read_json(out / "env.json")
        assert env["pid"] == job.pid  # board run registered, then exec'd the job: one process
        assert env["BOARD_BOOKING_ID"] == str(booking["id"])
        assert datetime.fromisoformat(env["BOARD_BOOKING_END"]) == datetime.fromisoformat(booking["end"])
        assert env["CUDA_VISIBLE_DEVICES"] == ",".join(booking["card_uuids"])
        [registered] = events(board, "run", booking["id"])
        assert registered["ok"] and registered["actor"] == "bob" and registered["details"]["pid"] == job.pid
        time.sleep(1.5)  # three enforcement passes: an active booking's job is left alone
        assert alive(job) and not (out / "term").exists()

        released = time.monotonic()
        board.json("bob", "release", str(booking["id"]))
        job.wait(timeout=15)
        assert job.returncode == 0, job.stderr.read()  # it exited from its SIGTERM handler
        assert time.monotonic() - released < 2 + 2, "SIGTERM took longer than a pass or two"
        assert (out / "term").read_text() == "TERM\n"
    finally:
        finish(job)
    stops = events(board, "job-stop", booking["id"])
    assert [(e["actor"], e["details"]["signal"], e["details"]["pid"]) for e in stops] == [
        ("board-agent", "SIGTERM", job.pid)]
    assert [e["actor"] for e in events(board, "release", booking["id"])] == ["bob"]
    assert board.agent_alive()


def test_a_job_that_ignores_sigterm_is_killed_after_the_grace(board):
    booking = board.book("bob", "1", "--for", "1h")
    job, out = start_job(board, "bob", booking["id"], "hold")
    try:
        read_json(out / "env.json")
        board.json("bob", "release", str(booking["id"]))
        assert wait_for(lambda: (out / "term").exists(), 10), "no SIGTERM"
        termed = time.monotonic()
        job.wait(timeout=15)
        assert job.returncode == -signal.SIGKILL
        assert time.monotonic() - termed >= 2 - 0.6, "SIGKILL came before [enforce] grace_s"
    finally:
        finish(job)
    stops = events(board, "job-stop", booking["id"])
    assert [(e["details"]["signal"], e["details"]["pid"]) for e in stops] == [("SIGTERM", job.pid), ("SIGKILL", job.pid)]
    apart = datetime.fromisoformat(stops[1]["time"]) - datetime.fromisoformat(stops[0]["time"])
    assert apart.total_seconds() >= 1  # whole seconds in the log; grace_s is 2
    assert board.agent_alive()


def test_at_the_end_only_the_holders_processes_in_the_jobs_group_are_signalled(board):
    """Root's and alice's processes placed in bob's job's process group survive SIGTERM and SIGKILL; so does the agent."""
    booking = board.book("bob", "1", "--for", "1h")
    job, out = start_job(board, "bob", booking["id"], "hold")
    others = []
    try:
        env = read_json(out / "env.json")
        group = env["pgid"]
        assert group == job.pid
        # Only root can put other users' processes in bob's group (same session): the worst case for the service.
        roots = sleeper(board, "root", process_group=group)
        alices = sleeper(board, "alice", process_group=group)
        bobs = sleeper(board, "bob", process_group=group)  # bob's own, in the job's group: it goes with the job
        outside = sleeper(board, "root", start_new_session=True)
        others = [roots, alices, bobs, outside]
        assert wait_for(lambda: all(os.getpgid(p.pid) == group for p in (roots, alices, bobs)), 5)
        board.json("bob", "release", str(booking["id"]))
        job.wait(timeout=15)
        assert job.returncode == -signal.SIGKILL
        bobs.wait(timeout=10)
        assert bobs.returncode in (-signal.SIGTERM, -signal.SIGKILL)
        time.sleep(2 + 1)  # past the grace and two more passes
        assert alive(roots) and alive(alices) and alive(outside)
        assert board.agent_alive()
    finally:
        finish(job, *others)
    signalled = {pid for e in events(board, "job-stop", booking["id"]) for pid in e["details"]["pids"]}
    assert job.pid in signalled and bobs.pid in signalled
    assert not signalled & {roots.pid, alices.pid, outside.pid, board.agent.pid}


# A job that starts two children and holds on through SIGTERM: `sleep`, and a copy of sleep that runs setuid.
SPAWNER = """
import json, os, signal, subprocess, sys, time
out, setuid_sleep = sys.argv[1], sys.argv[2]
signal.signal(signal.SIGTERM, lambda *_: open(os.path.join(out, "term"), "a").write("TERM\\n"))
plain = subprocess.Popen(["sleep", "300"])
setuid = subprocess.Popen([setuid_sleep, "300"])  # Popen returns once the exec has happened
with open(os.path.join(out, "env.tmp"), "w") as f:
    json.dump({"pid": os.getpid(), "plain": plain.pid, "setuid": setuid.pid}, f)
os.rename(os.path.join(out, "env.tmp"), os.path.join(out, "env.json"))
while True:
    time.sleep(0.05)
"""


def uids(pid: int) -> list[int]:
    """Real, effective, saved and filesystem uid (/proc/PID/status)."""
    with open(f"/proc/{pid}/status") as status:
        return next([int(u) for u in line.split()[1:]] for line in status if line.startswith("Uid:"))


def running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_child_of_the_job_running_setuid_is_not_the_holders_and_is_never_signalled(board):
    """What is signalled is the holder's alone: every uid of the process (real, effective, saved) is theirs.
    Bob's job starts `sleep` and a setuid copy of it owned by alice (as passwd is root's); the first goes
    with the job, the second keeps bob's real uid but is not bob's, and is left alone."""
    booking = board.book("bob", "1", "--for", "1h")
    setuid_sleep = board.home("alice") / "sleep-as-alice"
    shutil.copy("/bin/sleep", setuid_sleep)
    alice = pwd.getpwnam("alice")
    os.chown(setuid_sleep, alice.pw_uid, alice.pw_gid)
    os.chmod(setuid_sleep, 0o4755)
    out = board.home("bob") / f"spawner-{booking['id']}"
    out.mkdir()
    bob = pwd.getpwnam("bob")
    os.chown(out, bob.pw_uid, bob.pw_gid)
    job = board.spawn("bob", "run", "--booking", str(booking["id"]), "--", sys.executable, "-c", SPAWNER, str(out),
                      str(setuid_sleep), stdout=subprocess.PIPE, stderr=subprocess.PIPE, process_group=0)
    children = {}
    try:
        children = read_json(out / "env.json")
        assert uids(children["plain"]) == [bob.pw_uid] * 4
        assert uids(children["setuid"]) == [bob.pw_uid] + [alice.pw_uid] * 3, "the setuid bit did not take"
        board.json("bob", "release", str(booking["id"]))
        job.wait(timeout=15)  # it holds on through SIGTERM: SIGKILL after the grace, the second pass of the two
        assert job.returncode == -signal.SIGKILL
        assert not running(children["plain"])
        assert running(children["setuid"]), "a process running setuid was signalled as the holder's"
        assert board.agent_alive()
    finally:
        finish(job)
        if children.get("setuid"):
            os.kill(children["setuid"], signal.SIGKILL)
    stops = events(board, "job-stop", booking["id"])
    assert [e["details"]["signal"] for e in stops] == ["SIGTERM", "SIGKILL"]
    assert job.pid in stops[0]["details"]["pids"] and children["plain"] in stops[0]["details"]["pids"]
    assert not {pid for e in stops for pid in e["details"]["pids"]} & {children["setuid"]}


def test_bob_cannot_register_for_alices_booking(board):
    alices = board.book("alice", "1", "--for", "1h")
    mine = board.book("bob", "1", "--for", "1h")
    result = board.run("bob", "run", "--booking", str(alices["id"]), "--", "sh", "-c", "echo ran")
    assert result.returncode == 4 and result.stdout == ""
    assert len(result.stderr.splitlines()) == 1 and "belongs to alice" in result.stderr
    [refused] = events(board, "run", alices["id"])
    assert (refused["actor"], refused["ok"]) == ("bob", False) and refused["details"]["refused"]
    # No booking named: bob's only active booking, never alice's.
    job, out = start_job(board, "bob", mine["id"], "exit")
    try:
        assert read_json(out / "env.json")["BOARD_BOOKING_ID"] == str(mine["id"])
    finally:
        finish(job)


def test_a_forged_or_replayed_registration_names_only_the_callers_own_process(board):
    alices = board.book("alice", "1", "--for", "1h")
    mine = board.book("bob", "1", "--for", "1h")
    victim = sleeper(board, "alice", start_new_session=True)
    roots = sleeper(board, "root", start_new_session=True)
    out = board.home("bob") / "forge"
    out.mkdir()
    os.chown(out, pwd.getpwnam("bob").pw_uid, pwd.getpwnam("bob").pw_gid)
    forger = board.spawn("bob", str(out), str(mine["id"]), str(victim.pid), str(pwd.getpwnam("alice").pw_uid),
                         str(alices["id"]), program=[sys.executable, "-c", FORGE], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, process_group=0)
    try:
        state = read_json(out / "env.json")
        assert state["reply"]["ok"], state
        # The service took the pid from SO_PEERCRED, not from the arguments.
        [registered] = [e for e in events(board, "run", mine["id"]) if e["ok"]]
        assert registered["details"]["pid"] == forger.pid == state["pid"] != victim.pid
        time.sleep(1)
        assert events(board, "run", alices["id"]) == []  # the replayed line was not a registration
        # Alice's booking ending signals nothing: nothing of hers registered.
        board.json("alice", "release", str(alices["id"]))
        time.sleep(1.5)
        assert alive(victim) and alive(forger) and alive(roots)
        # Bob's booking ending signals his forger, and only it.
        board.json("bob", "release", str(mine["id"]))
        forger.wait(timeout=15)
        assert (out / "term").read_text() == "TERM\n"
        time.sleep(2 + 1)
        assert alive(victim) and alive(roots) and board.agent_alive()
    finally:
        finish(forger, victim, roots)
    stops = events(board, "job-stop", mine["id"])
    assert stops and {pid for e in stops for pid in e["details"]["pids"]} == {forger.pid}
    assert events(board, "job-stop", alices["id"]) == []


def _spawn_at_pid(pid: int, spawn) -> subprocess.Popen | None:
    """Start a process that gets `pid` (a reused pid), through /proc/sys/kernel/ns_last_pid; None if racing forks won."""
    for _ in range(50):
        with open("/proc/sys/kernel/ns_last_pid", "w") as f:
            f.write(str(pid - 1))
        process = spawn()
        if process.pid == pid:
            return process
        process.kill()
        process.wait()
    return None


def test_a_reused_pid_is_never_signalled(board):
    """Bob's registered job dies; alice's next process gets its pid (and so its process group id); bob's booking ends."""
    if not os.access("/proc/sys/kernel/ns_last_pid", os.W_OK):
        pytest.skip("needs a writable /proc/sys/kernel/ns_last_pid to reuse a pid on purpose")
    booking = board.book("bob", "1", "--for", "1h")
    job, out = start_job(board, "bob", booking["id"], "hold")
    reused = None
    try:
        read_json(out / "env.json")
        board.json("bob", "release", str(booking["id"]))
        assert wait_for(lambda: (out / "term").exists(), 10), "no SIGTERM"  # the grace runs from here
        pid = job.pid
        job.kill()
        job.wait()
        reused = _spawn_at_pid(pid, lambda: sleeper(board, "alice", start_new_session=True))
        if reused is None:
            pytest.skip("other processes kept taking the pid first")
        assert os.getpgid(reused.pid) == pid  # same pid, same process group id: only the pidfd tells them apart
        time.sleep(2 + 1.5)  # past the grace: a service that kept the pid number would SIGKILL it now
        assert alive(reused) and board.agent_alive()
    finally:
        finish(job, *([reused] if reused else []))
    stops = events(board, "job-stop", booking["id"])
    assert [e["details"]["signal"] for e in stops] == ["SIGTERM"]


def test_an_admin_move_waits_for_running_work_unless_forced_and_then_stops_it(board):
    booking = board.book("bob", "--cards", "6", "--for", "1h")
    job, out = start_job(board, "bob", booking["id"], "exit", name="moved")
    try:
        env = read_json(out / "env.json")
        refused = board.run("carol", "admin", "reassign", str(booking["id"]), "--cards", "7")
        assert refused.returncode == 3, refused.stderr
        assert f"job {env['pid']}" in refused.stderr and "--force" in refused.stderr
        assert alive(job) and not (out / "term").exists()

        time.sleep(1.1)  # at least a second of the booking is past, to stay on card 6 as history
        moved = board.json("carol", "admin", "reassign", str(booking["id"]), "--cards", "7", "--force")
        assert moved["cards"] == [7] and moved["id"] != booking["id"]  # the rest of the booking, on card 7
        job.wait(timeout=15)  # the old piece ended at now: the job on card 6 is stopped at once
        assert (out / "term").read_text() == "TERM\n"
        [audit] = [e for e in events(board, "reassign", booking["id"]) if e["ok"]]
        assert audit["details"]["stopped"] == [f"job {env['pid']}"] and audit["details"]["to_booking"] == moved["id"]
        assert events(board, "job-stop", booking["id"])
    finally:
        finish(job)


def test_a_restarted_service_takes_its_jobs_back(board):
    booking = board.book("bob", "1", "--for", "1h")
    job, out = start_job(board, "bob", booking["id"], "exit", name="kept")
    gone, gone_out = start_job(board, "bob", board.book("bob", "1", "--for", "1h")["id"], "exit", name="gone")
    try:
        read_json(out / "env.json")
        read_json(gone_out / "env.json")
        board.agent.kill()  # kill -9 while both jobs run: their registrations were acknowledged
        board.agent.wait(timeout=10)
        gone.kill()  # this one ends while the service is away: nothing to take back
        gone.wait(timeout=10)
        board.start_agent()
        assert wait_for(lambda: "took back 1 running job(s)" in board.agent_log.read_text(), 10), \
            board.agent_log.read_text()
        assert alive(job)
        board.json("bob", "release", str(booking["id"]))
        job.wait(timeout=15)  # the adopted job is still stopped when its booking ends
        assert (out / "term").read_text() == "TERM\n"
    finally:
        finish(job, gone)
