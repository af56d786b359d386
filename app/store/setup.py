"""`board doctor`: checks the database's files, filesystem and contents, and says how to fix what is wrong.

One owner: the database's directory and SQLite's files in it (the database, -wal, -shm, -journal)
all belong to the directory's owner (the system user board on the shared install, where only the
service opens the file; you, for a database of your own). The directory is 0700 and the files
0600. A symlink, a hard link, something that is not a plain file, or a file of anyone else's is
named with its fix, and the database is not opened through it. No fix line ever names a symlink
as the thing to chmod or chown (those commands follow links): the fix for a link is to remove it.
"""

from __future__ import annotations

import grp
import os
import pwd
import sqlite3
import stat
from pathlib import Path
from typing import Iterable, Iterator

from app.errors import BoardError
from app.store import events
from app.store.db import connect
from app.store.filesystem import network_filesystem

DIR_MODE = 0o700
FILE_MODE = 0o600
SIDE_FILES = ("", "-wal", "-shm", "-journal")  # the database and SQLite's own files beside it


def doctor(db_path: Path, admin_group: str, extra: Iterable[tuple[bool, str]] = ()) -> Iterator[tuple[bool, str]]:
    """(ok, line) for each check, in the order a person would fix them.

    `extra` is more (ok, line) checks to append after the file's own, for example the service's state;
    it is read last, and only then.
    """
    db_path = Path(db_path)
    if kind := network_filesystem(db_path.parent):
        yield False, (f"{db_path.parent} is on {kind}; SQLite's WAL needs a local disk:"
                      " move the database to a local filesystem")
        yield from extra
        return
    yield True, f"{db_path.parent} is on a local filesystem"
    yield from _file_checks(db_path)
    yield admin_group_check(admin_group)
    yield from extra


def admin_group_check(admin_group: str) -> tuple[bool, str]:
    try:
        admin_gid = grp.getgrnam(admin_group).gr_gid
        return True, f"admin group {admin_group} exists (gid {admin_gid})"
    except KeyError:
        return False, f"admin group {admin_group} does not exist, so only root is an admin: groupadd {admin_group}"


def _file_checks(db_path: Path) -> Iterator[tuple[bool, str]]:
    directory = db_path.parent
    try:
        dir_stat = directory.lstat()
    except FileNotFoundError:
        yield False, (f"{directory} does not exist: create it for the database's one owner, mode 0700"
                      f" (on the shared install: install -d -o board -g board -m 0700 {directory})")
        return
    except OSError as error:
        yield False, (f"can't see {directory} ({error.strerror}): run board doctor as root or as the owner of"
                      f" {directory}")
        return
    if stat.S_ISLNK(dir_stat.st_mode):
        yield False, (f"{directory} is a symlink (to {_target(directory)}), not the database's own directory:"
                      f" remove the symlink {directory} and point BOARD_DB or [storage] db into the real directory")
        return
    if not stat.S_ISDIR(dir_stat.st_mode):
        yield False, (f"{directory} is not a directory ({_kind(dir_stat.st_mode)}): point BOARD_DB or [storage] db"
                      " into a directory of the database's owner")
        return
    owner = _user_name(dir_stat.st_uid)
    mode = stat.S_IMODE(dir_stat.st_mode)
    if mode == DIR_MODE:
        yield True, f"{directory} belongs to {owner}, mode 700"
    elif mode & 0o7000:  # setgid left from the old shared 2770 layout: plain `chmod 700` keeps it on a directory
        yield False, f"{directory} has mode {mode:o}, not 700 (only {owner} may enter it): chmod 00700 {directory}"
    else:
        yield False, f"{directory} has mode {mode:o}, not 700 (only {owner} may enter it): chmod 700 {directory}"
    planted = False  # a link, a shared or foreign file where SQLite keeps its own: don't open the database
    for path in (Path(f"{db_path}{suffix}") for suffix in SIDE_FILES):
        try:
            file_stat = path.lstat()
        except FileNotFoundError:
            if path == db_path:
                yield False, (f"{db_path} does not exist: the service creates it when it starts"
                              " (systemctl start board-agent); a database of your own, your first board command")
                return
            continue
        except OSError as error:
            yield False, f"can't see {path} ({error.strerror}): run board doctor as root or as {owner}"
            return
        if stat.S_ISLNK(file_stat.st_mode):
            planted = True
            yield False, (f"{path} is a symlink (to {_target(path)}), not a file of the board's own: remove the"
                          f" symlink {path} (SQLite would write through it)")
            continue
        if not stat.S_ISREG(file_stat.st_mode):
            planted = True
            yield False, f"{path} is not a regular file ({_kind(file_stat.st_mode)}): remove {path}"
            continue
        if file_stat.st_nlink > 1:
            planted = True
            yield False, (f"{path} has {file_stat.st_nlink} hard links, so another path shares the file:"
                          f" find / -xdev -samefile {path} lists them; remove the others")
            continue
        if file_stat.st_uid != dir_stat.st_uid:
            planted = True
            yield False, _foreign(path, file_stat.st_uid, owner)
            continue
        mode = stat.S_IMODE(file_stat.st_mode)
        if mode != FILE_MODE:
            yield False, f"{path} has mode {mode:o}, not 600 (only {owner} may open it): chmod 600 {path}"
        else:
            yield True, f"{path} belongs to {owner}, mode 600"
    if planted:
        yield False, f"{db_path} was not opened (see above); run board doctor again after the fixes"
        return
    yield from _content_checks(db_path)


def _content_checks(db_path: Path) -> Iterator[tuple[bool, str]]:
    """Open the database and check it; a damaged file is one FIX line, never a traceback."""
    try:
        conn = connect(db_path, create=False)
    except BoardError as error:
        yield False, str(error)
        return
    try:
        try:
            rows = [row[0] for row in conn.execute("PRAGMA quick_check(5)")]
        except sqlite3.DatabaseError as error:
            yield False, f"{db_path} is damaged ({error}): restore it from a backup (see docs/service.md, 'Restoring a backup')"
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


# The schema's guards: someone who edits the file by hand has to drop one of these first.
GUARD_TRIGGERS = ("events_no_update", "events_no_delete", "events_no_replace", "booking_cards_no_overlap",
                  "bookings_no_overlap")


def _audit_checks(conn, db_path: Path) -> Iterator[tuple[bool, str]]:
    """The hash chain, the guard triggers, and an audit record for every booking.

    A booking is created by a `create` event, or by an admin's `reassign` that split an active booking
    at now (filed under the original, with the new one's id as details.to_booking).
    """
    try:
        present = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")}
        if missing := [name for name in GUARD_TRIGGERS if name not in present]:
            yield False, (f"trigger(s) {', '.join(missing)} missing: the schema of {db_path} was edited by hand;"
                          " restore it from a backup (board backup, see docs/service.md)")
        yield from chain_checks(conn, str(db_path), "a backup")
    except sqlite3.DatabaseError as error:
        yield False, f"the audit log of {db_path} can't be read ({error}): restore it from a backup"


# A booking made by an admin's reassign (split at now) is filed under the original, with its id as details.to_booking.
_UNAUDITED = {
    "sqlite": "SELECT id FROM bookings WHERE id NOT IN"
              " (SELECT booking_id FROM events WHERE action = 'create' AND ok = 1 AND booking_id IS NOT NULL)"
              " AND id NOT IN (SELECT CASE WHEN json_valid(details) THEN json_extract(details, '$.to_booking') END"
              "  FROM events WHERE action = 'reassign' AND ok = 1)"
              " ORDER BY id LIMIT 6",
    "postgresql": "SELECT id FROM bookings WHERE id NOT IN"
                  " (SELECT booking_id FROM events WHERE action = 'create' AND ok = 1 AND booking_id IS NOT NULL)"
                  " AND CAST(id AS TEXT) NOT IN (SELECT board_json_field(details, 'to_booking') FROM events"
                  "  WHERE action = 'reassign' AND ok = 1 AND board_json_field(details, 'to_booking') IS NOT NULL)"
                  " ORDER BY id LIMIT 6",
}


def chain_checks(conn, where: str, copy: str) -> Iterator[tuple[bool, str]]:
    """The audit chain intact, and an audit record for every booking, on either store: `where` names the database
    for people, `copy` what to compare it with ("a backup", "a dump")."""
    broken = events.first_broken(conn)
    if broken is None:
        count = conn.execute("SELECT count(*) FROM events").fetchone()[0]
        yield True, f"audit chain intact ({count} events)"
    else:
        yield False, f"audit event {broken} was altered or removed by hand: compare with {copy} and ask who edited {where}"
    unaudited = [row[0] for row in conn.execute(_UNAUDITED[getattr(conn, "dialect", "sqlite")])]
    if unaudited:
        shown = ", ".join(str(i) for i in unaudited[:5]) + (", ..." if len(unaudited) > 5 else "")
        yield False, (f"booking(s) {shown} have no audit record of their creation: events were removed or"
                      f" bookings added by hand; compare {where} with {copy}")


def _foreign(path: Path, uid: int, owner: str) -> str:
    """The FIX line for a file beside the database that is not its directory's owner's."""
    try:
        whose = f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        whose = f"uid {uid}, which no user has"
    return (f"{path} is owned by {whose}, not by {owner}, the owner of its directory: if you don't know why,"
            f" remove {path}; otherwise chown -h {owner} {path}")


def _user_name(uid: int) -> str:
    """The user's name, or the number where no user has it (chown takes either)."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)
