"""Who is at the other end of a Unix socket, as the kernel says: SO_PEERCRED, and the groups of that process."""

from __future__ import annotations

import grp
import os
import pwd
import socket
import struct
from dataclasses import dataclass

from app.core.identity import Identity


@dataclass(frozen=True, slots=True)
class Peer:
    pid: int
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
    return Peer(pid, uid, gid, frozenset(_groups(pid, uid, gid)))


def _groups(pid: int, uid: int, gid: int) -> set[int]:
    """The peer process's groups from /proc; if it is already gone, the account's groups from the group database."""
    try:
        with open(f"/proc/{pid}/status", "rb") as status:
            for line in status:
                if line.startswith(b"Groups:"):
                    return {gid, *(int(g) for g in line.split()[1:])}
    except OSError:
        pass
    try:
        return {gid, *os.getgrouplist(pwd.getpwuid(uid).pw_name, gid)}
    except KeyError:
        return {gid}


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
