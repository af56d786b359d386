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
NEEDS = {"events": ("SELECT", "INSERT"), "board_schema": ("SELECT",),  # append-only; read (made by the owner)
         "fleet_roles": ("SELECT",)}  # written by the owner alone
HOSTS_GROUP = "board_hosts"  # docs/fleet.md's group holding the tables' grants: FIX lines name it when none is found


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
            yield from _row_security_checks(conn, store)
            yield from _audit_checks(conn, place)
            yield from _id_checks(conn)
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
        yield False, (f"no board schema in {place}: the tables' owner makes it (board migrate --schema-only --to URL),"
                      " or board migrate copies an install into it (docs/fleet.md)")
        return False
    if version > PG_LATEST:
        yield False, f"schema version {version} is newer than this board's ({PG_LATEST}): upgrade board on this host"
    elif version < PG_LATEST:
        yield None, (f"schema version {version}; this board's is {PG_LATEST}: the tables' owner brings it up (board"
                     " migrate --schema-only --to URL as the owner; a service connecting as the owner does it at its"
                     " start)")
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
        yield False, (f"role {role} may not read and write {shown} (owned by {owner}): GRANT {_hosts_group(conn)} TO {role},"
                      f" the group that holds the tables' grants (docs/fleet.md)")
        return False
    yield True, f"role {role} may read and write the board's tables (owned by {owner})"
    return True


def _row_security_checks(conn, store: PostgresStore) -> Iterator[tuple[bool | None, str]]:
    """Whether row-level security holds this host's role to this host's rows: the role is bound to this [fleet] host
    in fleet_roles, cannot act as the tables' owner, and every per-host table has RLS on. FIX lines say the SQL."""
    from app.store.pg import binding
    from app.store.pg_schema import PER_HOST

    if not conn.execute("SELECT to_regclass('fleet_roles') IS NOT NULL").fetchone()[0]:
        return  # an older schema: said above
    off = sorted(name for (name,) in conn.execute(
        "SELECT relname FROM pg_class WHERE relnamespace = current_schema()::regnamespace AND relkind = 'r'"
        " AND NOT relrowsecurity AND relname IN (" + ", ".join("?" * len(PER_HOST)) + ")", list(PER_HOST)))
    if off:
        yield False, (f"row-level security is off on {', '.join(off)}, so any host may write every host's rows there:"
                      " as the tables' owner, " + "; ".join(f"ALTER TABLE {name} ENABLE ROW LEVEL SECURITY"
                                                            for name in off))
    bound = binding(conn)
    session, database = conn.execute("SELECT session_user, current_database()").fetchone()
    host = store.host
    bind = f"INSERT INTO fleet_roles (role, host) VALUES ('{session}', '{host}')"
    if bound.unbound_by == "a superuser":
        yield None, (f"row-level security does not bind role {bound.role}, a superuser: this host may write every"
                     f" host's rows; give it a role of its own, bound to {host} (docs/fleet.md)")
    elif bound.unbound_by:
        lift = (f"ALTER ROLE {bound.role} NOBYPASSRLS" if bound.unbound_by == "BYPASSRLS" else
                f"CREATE ROLE {session}_{host} LOGIN IN ROLE {_hosts_group(conn)}, and connect as it"
                if session == _owner(conn) else f"REVOKE {bound.role if bound.role != session else _owner(conn)} FROM {session};"
                f" ALTER ROLE {session} IN DATABASE {database} RESET role; GRANT {_hosts_group(conn)} TO {session}")
        yield False, (f"row-level security does not bind this host: role {session}"
                      f"{f' acts as {bound.role},' if bound.role != session else ' is'} {bound.unbound_by}, so it may"
                      f" write every host's rows and lift the policies: as a superuser, {lift}; and as the tables'"
                      f" owner, {bind} (docs/fleet.md)")
    elif bound.host is None:
        yield False, (f"role {bound.role} is bound to no host, so this host may write none of its rows: as the tables'"
                      f" owner, {bind}")
    elif bound.host != host:
        yield False, (f"role {bound.role} is bound to host {bound.host}, but this host is {host} ([fleet] host): as the"
                      f" tables' owner, UPDATE fleet_roles SET host = '{host}' WHERE role = '{bound.role}'")
    elif not off:
        yield True, (f"row-level security: role {bound.role} writes only host {host}'s rows ({', '.join(PER_HOST)});"
                     " it reads the fleet's")


def _hosts_group(conn) -> str:
    """The one role, not the owner, granted INSERT on cards (docs/fleet.md's board_hosts), else HOSTS_GROUP."""
    found = [name for (name,) in conn.execute(
        "SELECT DISTINCT pg_get_userbyid(a.grantee) FROM pg_class AS c, aclexplode(c.relacl) AS a"
        " WHERE c.oid = 'cards'::regclass AND a.privilege_type = 'INSERT' AND a.grantee NOT IN (0, c.relowner)")]
    return found[0] if len(found) == 1 else HOSTS_GROUP


def _owner(conn) -> str:
    return conn.execute("SELECT pg_get_userbyid(relowner) FROM pg_class WHERE oid = 'cards'::regclass").fetchone()[0]


def _audit_checks(conn, place: str) -> Iterator[tuple[bool, str]]:
    present = {name for (name,) in conn.execute("SELECT tgname FROM pg_trigger WHERE NOT tgisinternal AND"
                                                " tgenabled != 'D'")}
    present |= {name for (name,) in conn.execute("SELECT conname FROM pg_constraint WHERE contype = 'x'")}
    if missing := [name for name in (*GUARD_TRIGGERS, GUARD_CONSTRAINT) if name not in present]:
        yield False, (f"trigger(s) {', '.join(missing)} missing or disabled: the schema in {place} was edited by hand;"
                      " restore it from a dump (pg_restore) and ask who holds a role that owns it")
    yield from chain_checks(conn, f"the database at {place}", "a dump")


def _id_checks(conn) -> Iterator[tuple[bool, str]]:
    """Rows whose id the database never gave (past its sequence's last): planted by a role that chose its own id
    before the schema numbered every row itself (app.store.pg_schema._V_DATABASE_IDS). An event past the sequence
    refuses every later append, so every audited change on every host; any other such row, the insert that the
    numbering reaches it with. Read through board_ids_given (a host's role may not read the sequences)."""
    from app.store.pg_schema import DATABASE_IDS

    if not conn.execute("SELECT to_regprocedure('board_ids_given(regclass, text)') IS NOT NULL").fetchone()[0]:
        return  # an older schema: said above
    whole = True
    for table, column in DATABASE_IDS.items():
        (given,) = conn.execute("SELECT board_ids_given(?, ?)", (table, column)).fetchone()
        count, low, high = conn.execute(f"SELECT count(*), min({column}), max({column}) FROM {table}"
                                        f" WHERE {column} > ?", (given,)).fetchone()
        if not count:
            continue
        whole = False
        ids = f"{column} {low} is" if count == 1 else f"{count} rows' {column}s ({low} to {high}) are"
        harm = ("no event may follow it, so every booking, cancel and other audited change on every host fails"
                if table == "events" else "an insert fails when the numbering reaches it")
        yield False, (f"{table}: {ids} past the last the database gave ({given}), numbered by hand (a host's role"
                      f" could, before schema version 5); {harm}: as the tables' owner, keep it as evidence and"
                      f" remove it (docs/fleet.md, 'An id out of sequence')")
    if whole:
        yield True, "ids: every numbered row's id is one the database gave (no host chooses one)"
    # The sequences themselves: UPDATE on one lets a role setval it to the top, after which that table takes no row.
    # A host's role needs no privilege on them (an identity's default, and the trigger, use them as the owner).
    role, owner_like = conn.execute("SELECT current_user, pg_has_role(current_user, relowner, 'MEMBER') FROM pg_class"
                                    " WHERE oid = 'cards'::regclass").fetchone()
    settable = [sequence for (sequence,) in conn.execute(
        "SELECT s FROM (SELECT pg_get_serial_sequence(t, c) AS s FROM unnest(?::text[], ?::text[]) AS n(t, c)) AS q"
        " WHERE has_sequence_privilege(s, 'UPDATE')", (list(DATABASE_IDS), list(DATABASE_IDS.values())))]
    if settable and not owner_like:
        yield False, (f"role {role} may set where the numbering of {', '.join(settable)} goes on (UPDATE on the"
                      " sequence): set past every id, no row may follow there: as the tables' owner, REVOKE UPDATE ON"
                      f" SEQUENCE {', '.join(settable)} FROM {_hosts_group(conn)}, PUBLIC")
