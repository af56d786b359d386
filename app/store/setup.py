"""The shared setup: `board init` creates it, `board doctor` checks it and says how to fix what is wrong."""

from __future__ import annotations

import grp
import os
import stat
from pathlib import Path
from typing import Iterable, Iterator

from app.errors import BadInput, BoardError, NotPermitted
from app.store import events
from app.store.db import connect
from app.store.filesystem import network_filesystem

DIR_MODE = 0o2770
FILE_MODE = 0o660


def _group_id(group: str) -> int:
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise BadInput(f"no group {group!r}; create it first: groupadd {group}") from None


def init_shared(db_path: Path, group: str) -> list[str]:
    """Create the directory (setgid to `group`, 2770) and the database (0660, WAL). Idempotent."""
    gid = _group_id(group)
    directory = db_path.parent
    if kind := network_filesystem(directory):
        raise BoardError(f"{directory} is on a {kind} filesystem; SQLite's WAL needs a local disk: pick a local --dir")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        os.chown(directory, -1, gid)
        os.chmod(directory, DIR_MODE)
    except PermissionError:
        raise NotPermitted(f"can't set up {directory}; run board init as root (sudo board init --group {group})") from None
    connect(db_path).close()
    for path in (db_path, Path(f"{db_path}-wal"), Path(f"{db_path}-shm")):
        if path.exists():
            os.chown(path, -1, gid)
            os.chmod(path, FILE_MODE)
    return [
        f"created {directory} (group {group}, mode 2770) and {db_path} (mode 0660, WAL)",
        f"next: add users with 'usermod -aG {group} USER' and point BOARD_DB or [storage] db at {db_path}",
    ]


def doctor(db_path: Path, admin_group: str, group: str | None = None,
           extra: Iterable[tuple[bool, str]] = ()) -> Iterator[tuple[bool, str]]:
    """(ok, line) for each check, in the order a person would fix them; `group` is the expected users' group.

    `extra` is more (ok, line) checks to append after the file's own, for example the service's state;
    it is read last, and only then. No fix line ever names a symlink as the thing to chmod or chown:
    those commands follow links, so the fix for a link is to remove it.
    """
    db_path = Path(db_path)
    if kind := network_filesystem(db_path.parent):
        yield False, (f"{db_path.parent} is on {kind}; SQLite's WAL needs a local disk:"
                      " move the database to a local filesystem")
        yield from extra
        return
    yield True, f"{db_path.parent} is on a local filesystem"
    yield from _file_checks(db_path, group)
    try:
        admin_gid = grp.getgrnam(admin_group).gr_gid
        yield True, f"admin group {admin_group} exists (gid {admin_gid})"
    except KeyError:
        yield False, f"admin group {admin_group} does not exist, so only root is an admin: groupadd {admin_group}"
    yield from extra


def _file_checks(db_path: Path, group_arg: str | None) -> Iterator[tuple[bool, str]]:
    directory = db_path.parent
    if directory.is_symlink():
        yield False, (f"{directory} is a symlink (to {_target(directory)}), not the board's directory: remove the"
                      f" symlink {directory} and set BOARD_DB to a path in the real directory")
        return
    try:
        dir_stat = directory.lstat()
    except OSError as error:
        yield False, f"can't see {directory} ({error.strerror}); run 'board init --group G' as root"
        return
    if not stat.S_ISDIR(dir_stat.st_mode):
        yield False, f"{directory} is not a directory; set BOARD_DB to a file in the board's directory"
        return
    group = _name_of_group(dir_stat.st_gid)
    if expected := _group_problem(directory, dir_stat.st_gid, group, wanted=group_arg):
        yield False, expected
        if group_arg or dir_stat.st_gid == 0:
            group = group_arg or "G"  # so that the fixes below name the right group
    if dir_stat.st_mode & stat.S_ISGID:
        yield True, f"{directory} is setgid to group {_name_of_group(dir_stat.st_gid)}"
    else:
        yield False, f"{directory} is not setgid, so new files lose group {group}: chmod g+s {directory}"
    if stat.S_IMODE(dir_stat.st_mode) & 0o070 != 0o070:
        yield False, (f"{directory} has mode {stat.S_IMODE(dir_stat.st_mode):o}; group members need rwx:"
                      f" chmod 2770 {directory}")
    elif stat.S_IMODE(dir_stat.st_mode) & 0o007:
        yield False, (f"{directory} has mode {stat.S_IMODE(dir_stat.st_mode):o}; others should have no access:"
                      f" chmod 2770 {directory}")
    else:
        yield True, f"{directory} has mode {stat.S_IMODE(dir_stat.st_mode):o}"
    planted = False  # a link or a foreign file where SQLite keeps its own: don't open the database through it
    for path in (db_path, Path(f"{db_path}-wal"), Path(f"{db_path}-shm"), Path(f"{db_path}-journal")):
        try:
            file_stat = path.lstat()
        except FileNotFoundError:
            if path == db_path:
                yield False, f"{db_path} does not exist: run 'board init --group {group}' as root"
                return
            continue
        except OSError as error:
            yield False, f"can't see {path} ({error.strerror}); ask an admin to add you to group {group}"
            return
        if stat.S_ISLNK(file_stat.st_mode):
            planted = True
            yield False, (f"{path} is a symlink (to {_target(path)}), not a file of the board's own: remove the symlink"
                          f" {path} (someone who can write {directory} made it; SQLite would write through it)")
            continue
        if not stat.S_ISREG(file_stat.st_mode):
            planted = True
            yield False, f"{path} is not a regular file ({_kind(file_stat.st_mode)}): remove {path}"
            continue
        if file_stat.st_nlink > 1:
            planted = True
            yield False, (f"{path} has {file_stat.st_nlink} hard links, so another path shares the file:"
                          f" find / -xdev -samefile {path} lists them; remove the others")
        if owner_problem := _owner_problem(path, file_stat.st_uid, dir_stat, group):
            yield False, owner_problem  # a plain file, so opening it below is safe
        if path.name.endswith("-journal"):
            continue  # not the board's (it uses WAL); only a link or a stranger's file there matters
        mode = stat.S_IMODE(file_stat.st_mode)
        if mode != FILE_MODE:
            yield False, f"{path} has mode {mode:o}, not 660: chmod 660 {path}"
        else:
            yield True, f"{path} has mode 660"
        if file_stat.st_gid != dir_stat.st_gid or (group_arg and _name_of_group(file_stat.st_gid) != group_arg):
            yield False, f"{path} has group {_name_of_group(file_stat.st_gid)}, not {group}: chgrp -h {group} {path}"
    if planted:
        yield False, f"{db_path} was not opened (see above); run 'board doctor' again after the fixes"
        return
    yield from _content_checks(db_path)


def _content_checks(db_path: Path) -> Iterator[tuple[bool, str]]:
    """Open the database and check it; a damaged file is one FIX line, never a traceback."""
    import sqlite3

    try:
        conn = connect(db_path, create=False)
    except BoardError as error:
        yield False, str(error)
        return
    try:
        try:
            rows = [row[0] for row in conn.execute("PRAGMA quick_check(5)")]
        except sqlite3.DatabaseError as error:
            yield False, f"{db_path} is damaged ({error}): restore it from a backup (see the README, 'Restoring a backup')"
            return
        check = "; ".join(" ".join(str(row).split()) for row in rows)  # one line, whatever SQLite says
        if check != "ok":
            yield False, f"integrity: {check[:300]}; restore {db_path} from a backup"
            return
        yield True, "integrity: ok"
        yield from _audit_checks(conn, db_path)
    finally:
        conn.close()


def _target(link: Path) -> str:
    try:
        return os.readlink(link)
    except OSError:
        return "?"


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a named pipe"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a plain file"


def _owner_problem(path: Path, uid: int, dir_stat: os.stat_result, group: str) -> str | None:
    """Why the owner of `path` is unexpected: root, the directory's owner, you, or a member of its group are fine."""
    if uid in (0, dir_stat.st_uid, os.getuid()):
        return None
    import pwd

    try:
        user = pwd.getpwuid(uid)
    except KeyError:
        return (f"{path} is owned by uid {uid}, which no user has: if you don't know why, remove {path};"
                f" otherwise chown -h root:{group} {path}")
    try:
        members = grp.getgrgid(dir_stat.st_gid).gr_mem
    except KeyError:
        members = []
    if user.pw_gid == dir_stat.st_gid or user.pw_name in members:
        return None
    return (f"{path} is owned by {user.pw_name} (uid {uid}), who is not in group {_name_of_group(dir_stat.st_gid)}:"
            f" if you don't know why, remove {path}; otherwise chown -h root:{group} {path}")


# The schema's guards: someone who edits the file by hand has to drop one of these first.
GUARD_TRIGGERS = ("events_no_update", "events_no_delete", "events_no_replace", "booking_cards_no_overlap",
                  "bookings_no_overlap")


def _audit_checks(conn, db_path: Path) -> Iterator[tuple[bool, str]]:
    """The hash chain, the guard triggers, and an audit record for every booking."""
    import sqlite3

    try:
        present = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")}
        if missing := [name for name in GUARD_TRIGGERS if name not in present]:
            yield False, (f"trigger(s) {', '.join(missing)} missing: the schema of {db_path} was edited by hand;"
                          " restore it from a backup (board backup, see the README)")
        broken = events.first_broken(conn)
        if broken is None:
            count = conn.execute("SELECT count(*) FROM events").fetchone()[0]
            yield True, f"audit chain intact ({count} events)"
        else:
            yield False, (f"audit event {broken} was altered or removed by hand: compare with a backup and ask who"
                          f" edited {db_path}")
        unaudited = [row[0] for row in conn.execute(
            "SELECT id FROM bookings WHERE id NOT IN"
            " (SELECT booking_id FROM events WHERE action = 'create' AND ok = 1 AND booking_id IS NOT NULL)"
            " ORDER BY id LIMIT 6")]
        if unaudited:
            shown = ", ".join(str(i) for i in unaudited[:5]) + (", ..." if len(unaudited) > 5 else "")
            yield False, (f"booking(s) {shown} have no audit record of their creation: events were removed or"
                          f" bookings added by hand; compare {db_path} with a backup")
    except sqlite3.DatabaseError as error:
        yield False, f"the audit log of {db_path} can't be read ({error}): restore it from a backup"


def _group_problem(directory: Path, gid: int, name: str, wanted: str | None) -> str | None:
    """Why the directory's group looks wrong, with the fix; None when it looks right."""
    fix = f"chgrp -R {wanted or 'G'} {directory} (as root; G is the board users' group)"
    if wanted is not None and name != wanted:
        return f"{directory} has group {name}, not {wanted}: chgrp -R {wanted} {directory}"
    if gid == 0:
        return f"{directory} has group root, not the board users' group: {fix}"
    if os.getuid() != 0 and gid != os.getgid() and gid not in os.getgroups():
        me = _my_name()
        return (f"{directory} has group {name}, which you ({me}) are not in: if {name} is the board group,"
                f" ask an admin to run 'usermod -aG {name} {me}'; otherwise {fix}")
    return None


def _my_name() -> str:
    import pwd

    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return f"uid {os.getuid()}"


def _name_of_group(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)
