"""The shared setup: `board init` creates it, `board doctor` checks it and says how to fix what is wrong."""

from __future__ import annotations

import grp
import os
import stat
from pathlib import Path
from typing import Iterator

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


def doctor(db_path: Path, admin_group: str, group: str | None = None) -> Iterator[tuple[bool, str]]:
    """(ok, line) for each check, in the order a person would fix them; `group` is the expected users' group."""
    directory, group_arg = db_path.parent, group
    if kind := network_filesystem(directory):
        yield False, f"{directory} is on {kind}; SQLite's WAL needs a local disk: move the database to a local filesystem"
        return
    yield True, f"{directory} is on a local filesystem"
    try:
        dir_stat = directory.stat()
    except OSError as error:
        yield False, f"can't see {directory} ({error.strerror}); run 'board init --group G' as root"
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
        yield False, f"{directory} has mode {stat.S_IMODE(dir_stat.st_mode):o}; group members need rwx: chmod 2770 {directory}"
    elif stat.S_IMODE(dir_stat.st_mode) & 0o007:
        yield False, f"{directory} has mode {stat.S_IMODE(dir_stat.st_mode):o}; others should have no access: chmod 2770 {directory}"
    else:
        yield True, f"{directory} has mode {stat.S_IMODE(dir_stat.st_mode):o}"
    for path in (db_path, Path(f"{db_path}-wal"), Path(f"{db_path}-shm")):
        try:
            file_stat = path.stat()
        except FileNotFoundError:
            if path == db_path:
                yield False, f"{db_path} does not exist: run 'board init --group {group}' as root"
                return
            continue
        except OSError as error:
            yield False, f"can't see {path} ({error.strerror}); ask an admin to add you to group {group}"
            return
        mode = stat.S_IMODE(file_stat.st_mode)
        if mode != FILE_MODE:
            yield False, f"{path} has mode {mode:o}, not 660: chmod 660 {path}"
        else:
            yield True, f"{path} has mode 660"
        if file_stat.st_gid != dir_stat.st_gid or (group_arg and _name_of_group(file_stat.st_gid) != group_arg):
            yield False, f"{path} has group {_name_of_group(file_stat.st_gid)}, not {group}: chgrp {group} {path}"
    try:
        conn = connect(db_path, create=False)
    except BoardError as error:
        yield False, str(error)
        return
    try:
        check = conn.execute("PRAGMA quick_check").fetchone()[0]
        yield check == "ok", f"integrity: {check}" + ("" if check == "ok" else f"; restore {db_path} from a backup")
        yield from _audit_checks(conn, db_path)
    finally:
        conn.close()
    try:
        admin_gid = grp.getgrnam(admin_group).gr_gid
        yield True, f"admin group {admin_group} exists (gid {admin_gid})"
    except KeyError:
        yield False, f"admin group {admin_group} does not exist, so only root is an admin: groupadd {admin_group}"


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
            yield False, f"audit event {broken} was altered or removed by hand: compare with a backup and ask who edited {db_path}"
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
