"""Who may serve an alias: the pure part of "an alias belongs to its holder" (app.llama.aliases checks the rows).

An alias has one holder at a time, unless the config declares it a team alias ([gateway.team_aliases]), which
the users and @groups listed there serve together. A group's members are its listed members and the users whose
primary group it is, as the system's group database says.
"""

from __future__ import annotations

import grp
import pwd
from collections.abc import Iterable


def listed(owners: Iterable[str], user: str) -> bool:
    """Whether `user` is among `owners`: by name, or as a member of an "@group" there."""
    for owner in owners:
        if not owner.startswith("@"):
            if owner == user:
                return True
            continue
        try:
            group = grp.getgrnam(owner[1:])
        except KeyError:  # a group the system does not have has no members
            continue
        if user in group.gr_mem:
            return True
        try:
            if pwd.getpwnam(user).pw_gid == group.gr_gid:
                return True
        except KeyError:
            pass
    return False

