"""Who a connection is was settled when it connected: the kernel's record (SO_PEERCRED, SO_PEERGROUPS), never
whatever process holds the client's pid when the service gets round to reading it.

The swap, steered as root: the agent is stopped (SIGSTOP, so bob's connection waits in the listen backlog),
bob connects, the process that connected exits (a child keeps the connection), and a process of carol's (an
admin) is put on exactly that pid with clone3's set_tid. The agent goes on and must still see bob.
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import signal
import subprocess
import sys

from tests.agent_process import SETPRIV
from tests.unix_users import ADMIN_GROUP
from tests.users.conftest import wait_for

# bob's client: connects, and the connecting process leaves at once; its child keeps the connection and sends
# each request line it reads on stdin, printing each answer.
BOB = """
import os, socket, sys
sock = socket.socket(socket.AF_UNIX)
sock.connect(sys.argv[1])
if os.fork():
    os._exit(0)
answers = sock.makefile("rb")
for request in sys.stdin.buffer:
    sock.sendall(request)
    sys.stdout.buffer.write(answers.readline())
    sys.stdout.flush()
"""

# As root: run argv[2:] as a process with exactly pid argv[1] (clone3 with set_tid, Linux 5.5+), print its pid,
# and wait for it.
ONTO_PID = """
import ctypes, os, signal, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
tid = (ctypes.c_int * 1)(int(sys.argv[1]))
args = struct.pack("11Q", 0, 0, 0, 0, signal.SIGCHLD, 0, 0, 0, ctypes.addressof(tid), 1, 0)  # struct clone_args
child = libc.syscall(435, args, ctypes.c_size_t(len(args)))  # clone3
if child == 0:
    try:
        os.execv(sys.argv[2], sys.argv[2:])
    finally:
        os._exit(127)
if child < 0:
    sys.exit(f"clone3 onto pid {sys.argv[1]}: {os.strerror(ctypes.get_errno())}")
print(child, flush=True)
os.waitpid(child, 0)
"""


def status_of(pid: int) -> dict[str, list[str]]:
    try:
        with open(f"/proc/{pid}/status") as status:
            return {key: value.split() for key, _, value in (line.partition(":") for line in status)}
    except OSError:
        return {}


def on_pid(pid: int, user: str) -> subprocess.Popen:
    """A process of `user`'s, with the account's groups, on exactly `pid` (free now): returned once it is theirs.
    The Popen is its parent, which has not reaped it: end() it."""
    entry = pwd.getpwnam(user)
    parent = subprocess.Popen([sys.executable, "-c", ONTO_PID, str(pid), SETPRIV, f"--reuid={entry.pw_uid}",
                               f"--regid={entry.pw_gid}", "--init-groups", "--", "/bin/sleep", "300"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert parent.stdout.readline().strip() == str(pid), parent.stderr.read()
        groups = {str(gid) for gid in os.getgrouplist(user, entry.pw_gid)}
        assert wait_for(lambda: status_of(pid).get("Uid", [])[:1] == [str(entry.pw_uid)]
                        and set(status_of(pid).get("Groups", [])) == groups), status_of(pid)
    except BaseException:
        end(parent, pid)
        raise
    return parent


def end(parent: subprocess.Popen, pid: int) -> None:
    if parent.poll() is None:
        os.kill(pid, signal.SIGKILL)  # the child `parent` waits for: not reaped yet, so still that process
    parent.wait(timeout=10)


def test_bob_stays_bob_when_an_admins_process_takes_his_pid_before_the_service_reads(board):
    booking = board.book("alice", "1", "--for", "1h")
    assert grp.getgrnam(ADMIN_GROUP).gr_gid in os.getgrouplist("carol", pwd.getpwnam("carol").pw_gid)
    agent = board.agent.pid
    os.kill(agent, signal.SIGSTOP)  # connections now wait in the listen backlog, unread
    try:
        bob = board.spawn("bob", str(board.socket), program=[sys.executable, "-c", BOB],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert bob.wait(timeout=30) == 0  # connected, handed the connection to its child, gone and reaped
        carol = on_pid(bob.pid, "carol")
    finally:
        os.kill(agent, signal.SIGCONT)
    try:
        answers = []
        for request in ({"v": 1, "id": 1, "op": "whoami"},
                        {"v": 1, "id": 2, "op": "reassign", "args": {"id": booking["id"], "user": "bob"}}):
            bob.stdin.write(json.dumps(request).encode() + b"\n")
            bob.stdin.flush()
            answers.append(json.loads(bob.stdout.readline()))
    finally:
        bob.stdin.close()  # bob's child ends
        end(carol, bob.pid)
    whoami, reassign = answers
    assert whoami["ok"] and (whoami["result"]["user"], whoami["result"]["admin"]) == ("bob", False), whoami
    assert not reassign["ok"] and reassign["error"]["code"] == 4, reassign
    assert [b["user"] for b in board.json("carol", "list", "--all")["bookings"]] == ["alice"]
