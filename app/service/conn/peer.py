"""Who is at the other end of a Unix socket, as the kernel recorded it when that process connected.

SO_PEERCRED (pid, uid, gid) and SO_PEERGROUPS (the supplementary groups) are the connecting process's
credentials at connect(), kept by the kernel with the socket. Nothing is looked up by pid afterwards:
by the time the service reads a connection, its pid may belong to another process (the client exited
and someone else's process took the number), and /proc/<pid> would describe that one.
"""

from __future__ import annotations

import errno
import grp
import os
import pwd
import socket
import struct
from dataclasses import dataclass

from app.core.identity import Identity

SO_PEERGROUPS = getattr(socket, "SO_PEERGROUPS", 59)  # Linux 4.13+; Python's socket module does not name it
GETSOCKOPT_MAX = 1024  # the largest buffer Python's getsockopt takes: 256 groups


@dataclass(frozen=True, slots=True)
class Peer:
    pid: int  # the connecting process's pid at connect(): for registration, which checks it again
    uid: int
    gid: int
    groups: frozenset[int]

    @property
    def name(self) -> str:
        try:
            return pwd.getpwuid(self.uid).pw_name
        except KeyError:
            return f"uid{self.uid}"


def peer_of(sock: socket.socket) -> Peer:
    # struct ucred: pid_t (signed), uid_t and gid_t (unsigned)
    pid, uid, gid = struct.unpack("iII", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("iII")))
    return Peer(pid, uid, gid, frozenset({gid, *_peer_groups(sock)}))


def _peer_groups(sock: socket.socket) -> tuple[int, ...]:
    """The peer's supplementary groups (gid_t, unsigned) at connect()."""
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, SO_PEERGROUPS, GETSOCKOPT_MAX)
    except OSError as error:
        if error.errno != errno.ERANGE:
            raise
        raw = _getsockopt_large(sock, SO_PEERGROUPS, struct.calcsize("I") * os.sysconf("SC_NGROUPS_MAX"))
    return struct.unpack(f"{len(raw) // 4}I", raw)


def _getsockopt_large(sock: socket.socket, option: int, size: int) -> bytes:
    """getsockopt through libc, for an answer larger than Python's buffer (a peer in more than 256 groups)."""
    import ctypes  # start-up: only a peer in more than 256 groups needs libc

    libc = ctypes.CDLL(None, use_errno=True)
    buffer, length = ctypes.create_string_buffer(size), ctypes.c_uint32(size)
    if libc.getsockopt(sock.fileno(), socket.SOL_SOCKET, option, buffer, ctypes.byref(length)) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    return buffer.raw[:length.value]


def gid_of(group: str) -> int | None:
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        return None


def identity_of(peer: Peer, admin_group: str) -> Identity:
    admin_gid = gid_of(admin_group)
    return Identity(name=peer.name, uid=peer.uid, is_admin=peer.uid == 0 or (admin_gid is not None and admin_gid in peer.groups))


def is_member(peer: Peer, members_group: str, admin_group: str) -> bool:
    wanted = {gid_of(members_group), gid_of(admin_group)} - {None}
    return peer.uid in (0, os.getuid()) or bool(wanted & peer.groups)
