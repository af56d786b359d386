"""Who is asking (app.core.identity): the real UID's account and the admin group, read while the test process
really runs as that user with those groups, never from $USER.

The groups are Debian's standard ones (adm, tape, nogroup), so no account is created here."""

from __future__ import annotations

import grp
import os
import pwd
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from app.core.identity import Identity, current_identity, lookup_user

ADM = grp.getgrnam("adm").gr_gid
TAPE = grp.getgrnam("tape").gr_gid
NOBODY = pwd.getpwnam("nobody")
STRANGER_UID = 4_000_123  # no passwd entry

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="becoming another user needs root")


@contextmanager
def running_as(uid: int, gid: int, groups: list[int]) -> Iterator[None]:
    """This very process runs as uid with primary gid and supplementary groups, its saved ids still root's."""
    uids, gids, root_groups = os.getresuid(), os.getresgid(), os.getgroups()
    os.setgroups(groups)
    os.setresgid(gid, gid, gids[2])
    os.setresuid(uid, uid, 0)
    try:
        yield
    finally:  # the saved UID 0 is what lets it become root again
        os.setresuid(*uids)
        os.setresgid(*gids)
        os.setgroups(root_groups)


def identity_as(uid: int, gid: int, groups: list[int], admin_group: str) -> Identity:
    with running_as(uid, gid, groups):
        return current_identity(admin_group)


@root_only
def test_root_is_admin_whatever_the_admin_group():
    assert current_identity("no-such-group-here") == Identity("root", 0, True)
    assert identity_as(0, NOBODY.pw_gid, [], "adm") == Identity("root", 0, True)


@root_only
@pytest.mark.parametrize("gid, groups, admin_group, is_admin", [
    (NOBODY.pw_gid, [TAPE], "tape", True),  # a supplementary group
    (ADM, [], "adm", True),  # the primary group alone
    (NOBODY.pw_gid, [TAPE], "adm", False),
    (ADM, [ADM], "tape", False),
    (NOBODY.pw_gid, [TAPE], "no-such-group-here", False),
])
def test_admin_is_membership_of_the_admin_group(gid, groups, admin_group, is_admin):
    assert identity_as(NOBODY.pw_uid, gid, groups, admin_group) == Identity("nobody", NOBODY.pw_uid, is_admin)


@root_only
def test_a_uid_without_an_account_is_named_by_its_number():
    assert identity_as(STRANGER_UID, NOBODY.pw_gid, [], "adm") == Identity(f"uid{STRANGER_UID}", STRANGER_UID, False)


def test_the_environment_does_not_say_who_is_asking(monkeypatch):
    for name in ("USER", "LOGNAME", "SUDO_USER"):
        monkeypatch.setenv(name, "mallory")
    assert current_identity("adm").name == pwd.getpwuid(os.getuid()).pw_name != "mallory"


@pytest.mark.parametrize("name, found", [
    ("root", ("root", 0)),
    ("nobody", ("nobody", NOBODY.pw_uid)),
    ("no-such-user-here", None),
    ("ro\x00ot", None),  # pwd refuses a NUL with ValueError: still no such account
])
def test_lookup_user(name, found):
    assert lookup_user(name) == found
