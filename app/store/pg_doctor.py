"""`board doctor` on a PostgreSQL store ([storage] url): the database, its schema, this host's role, the clock, the
audit chain. Yields (ok, line) as app.store.setup.doctor does (ok None: a warning); it only reads: the schema is
made by the service's first start or `board migrate`, never by doctor.
"""

from __future__ import annotations

import sqlite3
from typing import Iterable, Iterator

from app.config import PostgresStore
from app.errors import BadInput, BoardError
from app.store.setup import chain_checks

CLOCK_LIMIT_S = 1.0  # bookings are absolute times: two hosts a second apart disagree on when one starts
# The schema's guards (app.store.pg_schema): someone rewriting history has to drop or disable one of these first.
GUARD_TRIGGERS = ("events_no_update", "events_no_truncate", "events_no_replace", "booking_cards_span", "bookings_span")
GUARD_CONSTRAINT = "booking_cards_no_overlap"
NEEDS = {"events": ("SELECT", "INSERT"), "board_schema": ("SELECT",)}  # append-only; read (made by a start)


def doctor(store: PostgresStore, extra: Iterable[tuple[bool | None, str]] = ()) -> Iterator[tuple[bool | None, str]]:
    from app.store.pg import where
    from app.store.pg import PgConnection, StoreUnreachable, clock_offset

    place = where(store.url)
    try:
        conn = PgConnection(store)
    except StoreUnreachable as error:
        yield False, f"{error}: check [storage] url, that PostgreSQL listens there and its pg_hba.conf (docs/fleet.md)"
        yield from extra
        return
    except BadInput as error:  # [storage] password_file is another user's (the service's) or unreadable
        yield None, f"{error}; the database is checked as the service's user: sudo -u board board doctor"
        yield from extra
        return
    try:
        (server,) = conn.execute("SHOW server_version").fetchone()
        yield True, f"the database answers at {place} (PostgreSQL {server.split()[0]})"
        yield from _role_checks(conn, place)
        yield clock_check(clock_offset(conn), place)
        if (yield from _schema_checks(conn, place)):
            yield from _audit_checks(conn, place)
    except BoardError as error:
        yield False, f"the database at {place} stopped answering during the checks ({error})"
    except sqlite3.Error as error:  # app.store.pg's errors: a permission, a table a hand removed
        yield False, f"the board's tables in {place} can't be read: {error}"
    finally:
        conn.close()
    yield from extra


def clock_check(offset_s: float, place: str) -> tuple[bool, str]:
    """This host's clock against the database's (offset: this host's minus the database's), FIX beyond a second."""
    if abs(offset_s) <= CLOCK_LIMIT_S:
        return True, f"clock: this host and the database agree within {max(abs(offset_s), 0.001):.3f} s"
    side = "ahead of" if offset_s > 0 else "behind"
    return False, (f"clock: this host is {abs(offset_s):.1f} s {side} the database's ({place}), more than"
                   f" {CLOCK_LIMIT_S:g} s; bookings are absolute times: keep both in step with NTP"
                   " (timedatectl set-ntp true; chronyc tracking shows the offset)")


def _role_checks(conn, place: str) -> Iterator[tuple[bool | None, str]]:
    session, current, superuser = conn.execute(
        "SELECT session_user, current_user, rolsuper FROM pg_roles WHERE rolname = session_user").fetchone()
    acting = f" (acting as {current})" if current != session else ""
    if superuser:
        yield None, (f"this host connects as role {session}{acting}, a superuser, which may do anything to every"
                     f" database on {place.rsplit('/', 1)[0]}: give each host a LOGIN role of its own (docs/fleet.md)")
    else:
        yield True, f"this host connects as role {session}{acting}, not a superuser"


def _schema_checks(conn, place: str):
    """The schema's version and the extension; returns whether the board's tables are there to check further."""
    from app.store.pg_schema import PG_LATEST

    extension = conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'btree_gist'").fetchone()
    if extension:
        yield True, f"extension btree_gist {extension[0]} (the bookings' no-overlap constraint)"
    else:
        yield False, ("extension btree_gist is missing: as a superuser, CREATE EXTENSION btree_gist in this database"
                      " (Debian's postgresql package ships it)")
    found = conn.execute("SELECT to_regclass('board_schema') IS NOT NULL").fetchone()[0]
    if found and not (yield from _privilege_checks(conn)):
        return False
    version = conn.execute("SELECT max(version) FROM board_schema").fetchone()[0] if found else None
    if version is None:
        yield False, (f"no board schema in {place}: the service's first start makes it (systemctl start board-agent),"
                      " or board migrate copies an install into it (docs/fleet.md)")
        return False
    if version > PG_LATEST:
        yield False, f"schema version {version} is newer than this board's ({PG_LATEST}): upgrade board on this host"
    elif version < PG_LATEST:
        yield None, f"schema version {version}; this board's is {PG_LATEST}: the service brings it up at its next start"
    else:
        yield True, f"schema version {version}"
    return True


def _privilege_checks(conn):
    """Whether this host's role may use every board table (board_schema too); yields the line."""
    from app.store.pg import board_tables

    role = conn.execute("SELECT current_user").fetchone()[0]
    missing, owners = [], set()
    for table in ["board_schema", *board_tables(conn)]:
        wanted = NEEDS.get(table, ("SELECT", "INSERT", "UPDATE", "DELETE"))
        allowed = conn.execute("SELECT " + ", ".join(f"has_table_privilege(?, '{privilege}')" for privilege in wanted)
                               + ", pg_get_userbyid(relowner) FROM pg_class WHERE oid = ?::regclass",
                               (table,) * len(wanted) + (table,)).fetchone()
        owners.add(allowed[-1])
        if not all(allowed[:-1]):
            missing.append(table)
    owner = ", ".join(sorted(owners))
    if missing:
        shown = ", ".join(missing[:4]) + (", ..." if len(missing) > 4 else "")
        yield False, (f"role {role} may not read and write {shown} (owned by {owner}): GRANT {owner} TO {role}"
                      " (docs/fleet.md)")
        return False
    yield True, f"role {role} may read and write the board's tables (owned by {owner})"
    return True


def _audit_checks(conn, place: str) -> Iterator[tuple[bool, str]]:
    present = {name for (name,) in conn.execute("SELECT tgname FROM pg_trigger WHERE NOT tgisinternal AND"
                                                " tgenabled != 'D'")}
    present |= {name for (name,) in conn.execute("SELECT conname FROM pg_constraint WHERE contype = 'x'")}
    if missing := [name for name in (*GUARD_TRIGGERS, GUARD_CONSTRAINT) if name not in present]:
        yield False, (f"trigger(s) {', '.join(missing)} missing or disabled: the schema in {place} was edited by hand;"
                      " restore it from a dump (pg_restore) and ask who holds a role that owns it")
    yield from chain_checks(conn, f"the database at {place}", "a dump")
