"""Who is asking: from the real UID via pwd, never from $USER, $LOGNAME or $SUDO_USER."""

from __future__ import annotations

from collections.abc import Iterable

import grp
import os
import pwd
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Identity:
    name: str
    uid: int
    is_admin: bool


def current_identity(admin_group: str) -> Identity:
    uid = os.getuid()
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:  # a UID without a passwd entry (some containers)
        name = f"uid{uid}"
    return Identity(name=name, uid=uid, is_admin=uid == 0 or _in_group(admin_group))


def _in_group(group: str) -> bool:
    try:
        gid = grp.getgrnam(group).gr_gid
    except KeyError:
        return False
    return gid == os.getgid() or gid in os.getgroups()


def listed(names: Iterable[str], user: str) -> bool:
    """Whether `user` is among `names` (a config's list of users and "@group"s): by name, or as a member of a group
    there, their own or a supplementary one, as the system's group database says ([classes], team aliases)."""
    names = set(names)
    if user in names:
        return True
    groups = {name[1:] for name in names if name.startswith("@")}
    return bool(groups & group_names(user)) if groups else False


def group_names(user: str) -> frozenset[str]:
    """The groups the system's group database puts `user` in (their own and supplementary ones), by name; none for a
    name with no account. Read for the holder whoever asks, so an admin acting for a member gets the member's."""
    try:
        entry = pwd.getpwnam(user)
        gids = os.getgrouplist(user, entry.pw_gid)
    except (KeyError, ValueError, OSError):
        return frozenset()
    names = set()
    for gid in gids:
        try:
            names.add(grp.getgrgid(gid).gr_name)
        except KeyError:
            pass
    return frozenset(names)


def lookup_user(name: str) -> tuple[str, int] | None:
    """(name, uid) of a local account, or None."""
    try:
        entry = pwd.getpwnam(name)
    except (KeyError, ValueError):
        return None
    return entry.pw_name, entry.pw_uid
