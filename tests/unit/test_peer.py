"""Who is at the other end of the socket (app.service.conn.peer): the kernel's SO_PEERCRED and SO_PEERGROUPS on a
real socket, as they were when the peer connected, and the admin and member checks the service's door makes
from them. (tests/users/test_identity_at_connect.py puts another user's process on a client's pid.)

The groups used are Debian's standard ones (adm, tape, nogroup), so no account is created here;
tests/users runs the same door with real members."""

from __future__ import annotations

import ctypes
import errno
import grp
import os
import pwd
import shutil
import socket
import subprocess
import tempfile

import pytest

from app.service.conn.peer import SO_PEERGROUPS, Peer, _getsockopt_large, gid_of, identity_of, is_member, peer_of

ADM = grp.getgrnam("adm").gr_gid
TAPE = grp.getgrnam("tape").gr_gid
NOBODY = pwd.getpwnam("nobody")
STRANGER_UID = 4_000_123  # no passwd entry

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="starting a process as another user needs root")


def peer(uid: int, *groups: int, gid: int | None = None) -> Peer:
    gid = NOBODY.pw_gid if gid is None else gid
    return Peer(pid=1, uid=uid, gid=gid, groups=frozenset({gid, *groups}))


def test_the_kernel_names_this_process_at_the_other_end():
    ours, theirs = socket.socketpair(socket.AF_UNIX)
    with ours, theirs:
        found = peer_of(ours)
    assert (found.pid, found.uid, found.gid) == (os.getpid(), os.getuid(), os.getgid())
    assert os.getgid() in found.groups and set(os.getgroups()) <= found.groups


def peer_at_the_door(uid: int, gid: int, extra_groups: list[int], *, stays: bool = True) -> tuple[Peer, int]:
    """(what peer_of says, the pid) for a process of `uid` that connects to a socket; with stays=False it has
    exited before the service reads the connection, as a client that sent its line and left would have."""
    folder = tempfile.mkdtemp(prefix="board-peer-")  # pytest's tmp_path is root's alone
    os.chmod(folder, 0o755)
    path = os.path.join(folder, "door.sock")
    try:
        with socket.socket(socket.AF_UNIX) as door:
            door.bind(path)
            os.chmod(path, 0o777)
            door.listen(1)
            door.settimeout(10)
            child = subprocess.Popen(  # the system python: nobody may not read this checkout's venv
                ["/usr/bin/python3", "-c", "import socket, sys, time; s = socket.socket(socket.AF_UNIX);"
                 " s.connect(sys.argv[1]); print('in', flush=True); time.sleep(30 if sys.argv[2] == 'stay' else 0)",
                 path, "stay" if stays else "leave"],
                user=uid, group=gid, extra_groups=extra_groups, stdout=subprocess.PIPE, text=True, cwd="/",
            )
            try:
                assert child.stdout.readline().strip() == "in"
                if not stays:
                    child.wait(timeout=10)
                conn, _ = door.accept()
                with conn:
                    return peer_of(conn), child.pid
            finally:
                child.kill()
                child.wait()
    finally:
        shutil.rmtree(folder)


@root_only
def test_a_process_of_another_user_is_seen_with_its_own_uid_and_groups():
    found, pid = peer_at_the_door(NOBODY.pw_uid, NOBODY.pw_gid, [TAPE])
    assert (found.pid, found.uid, found.gid) == (pid, NOBODY.pw_uid, NOBODY.pw_gid)
    assert found.groups == {NOBODY.pw_gid, TAPE}  # the process's groups, not root's who started it
    assert found.name == "nobody"


@root_only
def test_a_uid_past_two_to_the_31_is_read_as_it_is():
    big = 3_000_000_000  # valid on Linux (uid_t is unsigned): user namespaces map ranges up there
    found, _ = peer_at_the_door(big, big, [])
    assert (found.uid, found.gid, found.name) == (big, big, f"uid{big}")


@root_only
def test_a_client_gone_before_it_is_read_keeps_the_groups_it_connected_with():
    found, pid = peer_at_the_door(NOBODY.pw_uid, NOBODY.pw_gid, [TAPE], stays=False)
    assert (found.pid, found.uid) == (pid, NOBODY.pw_uid)
    # The process's own groups at connect(), not the account's (nobody is in no group) nor whatever holds the pid now.
    assert found.groups == {NOBODY.pw_gid, TAPE}


@root_only
def test_a_peer_in_more_groups_than_python_s_getsockopt_buffer_holds_is_seen_whole():
    many = list(range(60_000, 60_300))  # 300 groups: 1,200 bytes, past Python's 1,024-byte getsockopt buffer
    found, _ = peer_at_the_door(NOBODY.pw_uid, NOBODY.pw_gid, many)
    assert found.groups == {NOBODY.pw_gid, *many}


def test_the_large_getsockopt_says_what_the_kernel_refused():
    ctypes.set_errno(0)  # ctypes' own copy of errno: what is read must come from this call
    with open("/dev/null") as not_a_socket:
        with pytest.raises(OSError) as refused:
            _getsockopt_large(not_a_socket, SO_PEERGROUPS, 4096)
    assert (refused.value.errno, refused.value.strerror) == (errno.ENOTSOCK, os.strerror(errno.ENOTSOCK))


def test_an_account_without_a_name_is_called_by_its_uid():
    assert peer(STRANGER_UID).name == f"uid{STRANGER_UID}"
    assert peer(NOBODY.pw_uid).name == "nobody"


def test_gid_of_a_group():
    assert gid_of("adm") == ADM
    assert gid_of("no-such-group-here") is None


def test_admins_are_root_and_members_of_the_admin_group():
    assert identity_of(peer(0), "adm").is_admin
    assert identity_of(peer(NOBODY.pw_uid, ADM), "adm").is_admin
    assert identity_of(peer(NOBODY.pw_uid, ADM, gid=ADM), "adm").is_admin  # as the primary group too
    member = identity_of(peer(NOBODY.pw_uid, TAPE), "adm")
    assert not member.is_admin
    assert (member.name, member.uid) == ("nobody", NOBODY.pw_uid)
    assert not identity_of(peer(NOBODY.pw_uid, ADM), "no-such-group-here").is_admin  # a missing group names nobody


def test_the_door_lets_in_members_admins_root_and_the_service_itself():
    assert is_member(peer(NOBODY.pw_uid, TAPE), "tape", "adm")
    assert is_member(peer(NOBODY.pw_uid, ADM), "tape", "adm")
    assert is_member(peer(0), "tape", "adm")
    assert is_member(peer(os.getuid()), "tape", "adm")


def test_the_door_keeps_out_everyone_else():
    assert not is_member(peer(NOBODY.pw_uid), "tape", "adm")
    assert not is_member(peer(1), "tape", "adm")  # a system account (daemon) is no member either
    assert not is_member(peer(STRANGER_UID, 999_999), "tape", "adm")
    # Groups that do not exist admit nobody: a missing name must not match a missing gid.
    assert not is_member(peer(NOBODY.pw_uid), "no-such-group-here", "nor-this-one")
