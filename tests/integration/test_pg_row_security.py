"""Row-level security per host (issue 21, docs/threat-model.md): on a database set up as docs/fleet.md's roles section
says (tests/postgres.py's fleet_roles), each host's service connects with its own role, bound to its host in
fleet_roles by the tables' owner. A host reads every row but writes only its own host's snapshot, cards, jobs,
servers and rollups; it cannot bind itself, lift the policies or forge its binding; members still book any host's
cards. Two services on one real database (the `postgresql` tier), then each host's own connection used by hand as a
compromised host would. PostgreSQL refuses a new row another host's (SQLSTATE 42501) and leaves another host's
existing rows out of an UPDATE or DELETE (none changed): both are checked."""

from __future__ import annotations

import sqlite3

import psycopg
import pytest

from app.client.local import LocalClient
from app.config import Config, FleetSettings, HistorySettings, PostgresStore
from app.core.identity import Identity
from app.errors import BoardError, Conflict, NotPermitted
from app.gpu import open_source
from app.service.fleet.hosts import beat
from app.store import hosts as host_rows
from app.store import jobs
from app.store.db import StoreError, connect, storage_error, write
from tests.conftest import FROZEN_NOW, Clock, run_board

ALICE = Identity("alice", 50001, False)
BOB = Identity("bob", 50002, False)
HOUR = 3600


@pytest.fixture
def roles(pg_cluster):
    made = pg_cluster.fleet_roles()
    yield made
    made.drop()


@pytest.fixture
def hosts(roles, tmp_path):
    """make(name, me) -> a LocalClient on host `name`'s service, connected as that host's role, its beat written."""
    clock = Clock(FROZEN_NOW)
    made: list[LocalClient] = []

    def make(name: str, me: Identity = ALICE) -> LocalClient:
        config = Config(db_path=tmp_path / "board.db", storage_url=roles.url(roles.roles[name]),
                         history=HistorySettings(db=str(tmp_path / f"{name}.history.db")), fleet=FleetSettings(host=name))
        client = LocalClient.on(config, open_source(True, clock=clock, host=name), me, clock=clock)
        made.append(client)
        beat(client.service)
        return client

    yield make
    for client in made:
        client.service.close()


def refused(conn, sql: str, params=()) -> str:
    """Run `sql` in a write transaction as `conn`'s role; it must be refused for row-level security (42501)."""
    with pytest.raises(sqlite3.Error) as caught:
        with write(conn):
            conn.execute(sql, params)
    assert getattr(caught.value, "sqlstate", None) == "42501", caught.value
    return str(caught.value)


def changed(conn, sql: str, params=()) -> int:
    with write(conn):
        return conn.execute(sql, params).rowcount


def add_job(conn, host: str, pid: int) -> None:
    with write(conn):
        jobs.remember(conn, pid=pid, started_ticks=1, booking_id=booked(conn), uid=50001, pgid=pid, cards=("GPU-x",),
                      now=FROZEN_NOW, host=host)


def booked(conn) -> int:
    return conn.execute("SELECT max(id) FROM bookings").fetchone()[0]


SERVER = ('INSERT INTO servers (booking_id, "user", uid, cards, card_uuids, model, host, port, cmdline, created_at,'
          " fleet_host) VALUES (?, 'alice', 50001, '[0]', '[]', 'm.gguf', '127.0.0.1', ?, '[]', 0, ?)")


def test_a_host_writes_its_own_rows_and_not_another_hosts(hosts):
    gpu1, gpu2 = hosts("gpu1"), hosts("gpu2", BOB)
    one, two = gpu1.service.conn, gpu2.service.conn
    start = FROZEN_NOW + HOUR
    gpu1.call("book", cards=[0], start=start, end=start + HOUR)
    seen = host_rows.one(one, "gpu1")
    gpu1_card = gpu1.service.fleet.latest().cards[0].uuid

    # the heartbeat and snapshot: gpu2 cannot write gpu1's, nor take gpu1's cards
    refused(two, "INSERT INTO hosts (host, seen_at, started_at, snapshot) VALUES ('gpu1', 0, 0, '{}')"
                 " ON CONFLICT (host) DO UPDATE SET seen_at = excluded.seen_at, snapshot = excluded.snapshot")
    assert changed(two, "UPDATE hosts SET seen_at = 0, snapshot = '{}' WHERE host = 'gpu1'") == 0
    assert changed(two, "DELETE FROM hosts WHERE host = 'gpu1'") == 0
    assert host_rows.one(one, "gpu1") == seen
    refused(two, "INSERT INTO cards (uuid, idx, seen_at, host) VALUES (?, 0, 0, 'gpu2') ON CONFLICT (uuid)"
                 " DO UPDATE SET host = excluded.host", (gpu1_card,))
    assert changed(two, "UPDATE cards SET host = 'gpu2' WHERE host = 'gpu1'") == 0
    refused(two, "INSERT INTO rollups (host, card_uuid, ts, n, dt, state) VALUES ('gpu1', ?, 0, 1, 1, 0)",
            (gpu1_card,))
    beat(gpu2.service)  # its own: as before
    assert changed(two, "UPDATE hosts SET seen_at = seen_at WHERE host = 'gpu2'") == 1

    # jobs: its own, yes; gpu1's, or its own moved to gpu1, no; and gpu1 cannot remove gpu2's
    with pytest.raises(sqlite3.Error) as caught:
        add_job(two, "gpu1", 4242)
    assert caught.value.sqlstate == "42501"
    add_job(two, "gpu2", 4343)
    refused(two, "UPDATE jobs SET host = 'gpu1' WHERE pid = 4343")
    assert changed(one, "UPDATE jobs SET booking_id = booking_id WHERE pid = 4343") == 0
    assert changed(one, "DELETE FROM jobs WHERE pid = 4343") == 0
    assert [(j["pid"], j["booking_id"]) for j in jobs.remembered(two, "gpu2")] == [(4343, booked(two))]
    assert jobs.remembered(one, "gpu1") == []  # gpu1's service would not adopt gpu2's job either

    # servers: likewise
    refused(two, SERVER, (booked(two), 8801, "gpu1"))
    with write(one):
        one.execute(SERVER, (booked(one), 8802, "gpu1"))
    assert changed(two, "UPDATE servers SET state = 'stopped' WHERE fleet_host = 'gpu1'") == 0
    assert changed(two, "DELETE FROM servers WHERE fleet_host = 'gpu1'") == 0
    assert one.execute("SELECT state FROM servers WHERE port = 8802").fetchone() == ("starting",)

    # what a person would see of such a refusal: one line naming the role and host, not permitted (exit 4)
    shown = storage_error(gpu2.service.config.store, refused_error(two))
    assert isinstance(shown, NotPermitted) and "\n" not in str(shown)
    assert str(shown).startswith(f"the board database refused role {roles_of(gpu2)} (host gpu2): new row violates"
                                 ' row-level security policy for table "hosts"; a host\'s role writes only'), shown


def refused_error(conn) -> sqlite3.Error:
    try:
        with write(conn):
            host_rows.beat(conn, "gpu1", 0, 0, "{}")
    except sqlite3.Error as error:
        return error
    raise AssertionError("gpu2 wrote gpu1's heartbeat")


def roles_of(client: LocalClient) -> str:
    return client.service.conn.execute("SELECT current_user").fetchone()[0]


def test_members_on_each_host_still_book_the_other_hosts_cards(hosts):
    gpu1, gpu2 = hosts("gpu1", ALICE), hosts("gpu2", BOB)
    start = FROZEN_NOW + HOUR
    on_gpu2 = gpu1.call("book", cards=[3], host="gpu2", start=start, end=start + HOUR)
    on_gpu1 = gpu2.call("book", cards=[3], host="gpu1", start=start, end=start + HOUR)
    assert (on_gpu2["host"], on_gpu1["host"]) == ("gpu2", "gpu1")
    listed = {b["id"]: (b["host"], b["user"]) for b in gpu1.call("list", start=None, end=None, user=None)["bookings"]}
    assert listed == {on_gpu2["id"]: ("gpu2", "alice"), on_gpu1["id"]: ("gpu1", "bob")}


def test_a_host_cannot_bind_itself_lift_the_policies_or_forge_its_binding(roles, hosts):
    gpu2 = hosts("gpu2")
    two = gpu2.service.conn
    refused(two, "INSERT INTO fleet_roles (role, host) VALUES ('intruder', 'gpu1')")
    assert changed(two, "UPDATE fleet_roles SET host = 'gpu1' WHERE role = current_user") == 0
    assert changed(two, "DELETE FROM fleet_roles") == 0
    assert dict(two.execute("SELECT role, host FROM fleet_roles").fetchall()) == {r: h for h, r in roles.roles.items()}
    for sql in ("ALTER TABLE jobs DISABLE ROW LEVEL SECURITY", "DROP POLICY jobs_insert ON jobs",
                f"SET ROLE {roles.owner}"):
        with pytest.raises(sqlite3.Error) as caught:
            two.execute(sql)
        assert caught.value.sqlstate == "42501", sql
    # a table of its own named fleet_roles, found first on its search_path, does not fool the policies
    two.execute("CREATE TEMP TABLE fleet_roles (role NAME, host TEXT)")
    two.execute("INSERT INTO fleet_roles VALUES (current_user, 'gpu1')")
    assert two.execute("SELECT host FROM fleet_roles").fetchall() == [("gpu1",)]
    refused(two, "INSERT INTO hosts (host, seen_at, started_at, snapshot) VALUES ('gpu1', 0, 0, '{}')")


def test_a_role_bound_to_another_host_or_none_is_refused_at_start_in_one_line(roles, tmp_path):
    roles.as_owner(f"DELETE FROM fleet_roles WHERE role = '{roles.roles['gpu1']}'")
    env = {"BOARD_SIMULATE": "1", "BOARD_DB": str(tmp_path / "x.db"), "TZ": "UTC"}
    for role, host, words in ((roles.roles["gpu2"], "gpu3", "is bound to host gpu2 in the board database, but this"
                               " host is gpu3 ([fleet] host): as the tables' owner, UPDATE fleet_roles SET host ="
                               f" 'gpu3' WHERE role = '{roles.roles['gpu2']}'"),
                              (roles.roles["gpu1"], "gpu1", "is bound to no host in the board database, but this host"
                               " is gpu1 ([fleet] host): as the tables' owner, INSERT INTO fleet_roles (role, host)"
                               f" VALUES ('{roles.roles['gpu1']}', 'gpu1')")):
        with pytest.raises(NotPermitted) as caught:
            connect(PostgresStore(roles.url(role), host=host))
        assert f"role {role} {words}" in str(caught.value) and "\n" not in str(caught.value)
        config = tmp_path / f"{host}.toml"
        config.write_text(f'[fleet]\nhost = "{host}"\n')
        result = run_board("list", env={**env, "BOARD_CONFIG": str(config), "BOARD_DB_URL": roles.url(role)})
        assert result.returncode == 4 and "Traceback" not in result.stderr, result.stderr
        assert result.stderr.count("\n") == 1 and words in result.stderr


def test_a_hosts_role_cannot_make_the_schema_and_says_who_can(pg_cluster, tmp_path):
    """The tables' owner makes and upgrades the schema (board migrate --schema-only); a host's role that finds none
    is told so in one line (its privilege refused: 42501, exit 4), and once the owner has made it, the host books."""
    roles = pg_cluster.fleet_roles(("gpu1",), schema=False)
    try:
        env = {"BOARD_SIMULATE": "1", "BOARD_DB": str(tmp_path / "x.db"), "TZ": "UTC"}
        host = {**env, "BOARD_DB_URL": roles.url(roles.roles["gpu1"])}
        first = run_board("book", "--cards", "0", "--start", "tomorrow 9:00", "--for", "1h", env=host)
        assert first.returncode == 4 and "Traceback" not in first.stderr and first.stderr.count("\n") == 1
        assert "is not made yet" in first.stderr and "run board migrate --schema-only --to URL as the owner" \
            in first.stderr, first.stderr
        made = run_board("migrate", "--schema-only", "--to", roles.url(roles.owner), env=env)
        assert made.returncode == 0 and "is at version" in made.stdout, made.stderr
        roles.as_owner(f"INSERT INTO fleet_roles (role, host) VALUES ('{roles.roles['gpu1']}', 'gpu1')")
        config = tmp_path / "gpu1.toml"
        config.write_text('[fleet]\nhost = "gpu1"\n')
        again = run_board("book", "--cards", "0", "--start", "tomorrow 9:00", "--for", "1h",
                          env={**host, "BOARD_CONFIG": str(config)})
        assert again.returncode == 0, again.stderr
    finally:
        roles.drop()



def test_a_hosts_own_temporary_table_does_not_fool_the_schemas_triggers(hosts):
    """A session's temporary tables come first in its search_path: a host that shadows booking_cards with its own
    must not leave the real spans, which the EXCLUDE judges, behind a moved booking."""
    gpu1 = hosts("gpu1", ALICE)
    start = FROZEN_NOW + HOUR
    made = gpu1.call("book", cards=[3], start=start, end=start + HOUR)
    conn = gpu1.service.conn
    with write(conn):
        conn.execute("CREATE TEMP TABLE booking_cards (booking_id BIGINT, card_uuid TEXT, span INT8RANGE, live BOOLEAN)"
                     " ON COMMIT DROP")
        conn.execute("UPDATE bookings SET ends_at = ? WHERE id = ?", (start + 2 * HOUR, made["id"]))
    assert conn.execute("SELECT upper(span) FROM booking_cards WHERE booking_id = ?",
                        (made["id"],)).fetchone() == (start + 2 * HOUR,)


# -- one host's role cannot stop the fleet (issue 31, §7) ----------------------------------------------------------

TOP = 2**63 - 1  # the largest id: an event there and no event may follow it (events_no_replace)
PLANT = ("INSERT INTO events (id, ts, uid, actor, action, ok, prev_hash, hash) {overriding}"
         " VALUES (?, 0, 0, 'mallory', 'book', 1, 'x', 'x')")


def test_a_hosts_role_cannot_choose_an_id_and_the_other_hosts_book_on(hosts):
    """Ids are the database's alone: as gpu2's role, an event (or any numbered row) with an id of its choosing is
    refused, however it is written (the id given, OVERRIDING SYSTEM VALUE, COPY, an UPDATE), the next id as well as
    the largest; its own rows, numbered by the database, go in; and gpu1's members book and cancel on."""
    gpu1, gpu2 = hosts("gpu1", ALICE), hosts("gpu2", BOB)
    two = gpu2.service.conn
    start = FROZEN_NOW + HOUR
    first = gpu1.call("book", cards=[0], start=start, end=start + HOUR)
    after = two.execute("SELECT max(id) FROM events").fetchone()[0]
    for overriding in ("", "OVERRIDING SYSTEM VALUE"):
        for chosen in (TOP, after + 1):  # past every id, and the very next one (which the next append would get)
            said = refused(two, PLANT.format(overriding=overriding), (chosen,))
            assert f"events.id is numbered by the database alone, not {chosen}; an INSERT leaves id out" in said
    with pytest.raises(psycopg.errors.InsufficientPrivilege) as caught:  # (psycopg's own: the raw connection)
        with write(two):
            with two.raw.cursor().copy("COPY events (id, ts, uid, actor, action, ok, prev_hash, hash) FROM STDIN") \
                    as copy:
                copy.write_row((TOP, 0, 0, "mallory", "book", 1, "x", "x"))
    assert "numbered by the database alone" in str(caught.value)
    from app.store.pg_schema import DATABASE_IDS

    for table, column in DATABASE_IDS.items():  # every numbered table a host's role may insert into
        said = refused(two, f"INSERT INTO {table} ({column}) OVERRIDING SYSTEM VALUE VALUES (?)", (TOP,))
        assert f"{table}.{column} is numbered by the database alone" in said, said
    refused(two, "UPDATE bookings SET id = ? WHERE id = ?", (TOP, first["id"]))
    # a temporary pg_class, first on its own search_path, saying it owns events, does not make it the owner
    two.execute("CREATE TEMP TABLE pg_class (oid OID, relowner OID)")
    two.execute("INSERT INTO pg_class SELECT 'events'::regclass, oid FROM pg_roles WHERE rolname = current_user")
    refused(two, PLANT.format(overriding="OVERRIDING SYSTEM VALUE"), (TOP,))
    two.execute("DROP TABLE pg_temp.pg_class")
    assert two.execute("SELECT max(id) FROM events").fetchone()[0] == after

    # its own rows, numbered by the database, still go in; and the fleet books, cancels and books again
    mine = gpu2.call("book", cards=[1], start=start, end=start + HOUR)
    assert mine["id"] == first["id"] + 1
    second = gpu1.call("book", cards=[2], start=start, end=start + HOUR)
    gpu1.call("cancel", id=second["id"])
    assert gpu1.call("book", cards=[2], start=start, end=start + HOUR)["id"] == second["id"] + 1


def test_an_append_the_audit_log_refuses_says_so_and_doctor_names_the_row(roles, hosts):
    """An event planted past the ids the database gave (as any host's role could before schema version 5; here by
    the owner, as the attack left an install): a booking then fails saying what failed, not 'just booked by someone
    else', board doctor run on a host names the row (and a planted booking id), and the owner's removal, as
    docs/fleet.md gives it, lets the fleet book again."""
    from app.store.pg_doctor import doctor

    gpu1 = hosts("gpu1", ALICE)
    start = FROZEN_NOW + HOUR
    gpu1.call("book", cards=[0], start=start, end=start + HOUR)
    given = gpu1.service.conn.execute("SELECT max(id) FROM events").fetchone()[0]
    roles.as_owner(PLANT.format(overriding="OVERRIDING SYSTEM VALUE").replace("?", str(TOP)))
    with pytest.raises(BoardError) as caught:
        gpu1.call("book", cards=[1], start=start, end=start + HOUR)
    said = str(caught.value)
    assert not isinstance(caught.value, Conflict) and "just booked" not in said, said
    assert said == (f"the board database failed: events are append-only: event {given + 1} would not follow the last"
                    f" event, {TOP}; board doctor names an event out of sequence"), said
    booked_ids = gpu1.service.conn.execute("SELECT max(id) FROM bookings").fetchone()[0]
    roles.as_owner(f"INSERT INTO bookings (id, \"user\", uid, starts_at, ends_at, created_at, created_by)"
                   f" OVERRIDING SYSTEM VALUE VALUES ({booked_ids + 5}, 'mallory', 1, 0, 1, 0, 0)")

    lines = list(doctor(PostgresStore(roles.url(roles.roles["gpu1"]), host="gpu1")))
    found = [line for ok, line in lines if ok is False and "past the last the database gave" in line]
    assert found == [  # in app.store.pg_schema.DATABASE_IDS's order
        f"bookings: id {booked_ids + 5} is past the last the database gave ({booked_ids + 1}), numbered by hand (a"
        " host's role could, before schema version 5); an insert fails when the numbering reaches it: as the tables'"
        " owner, keep it as evidence and remove it (docs/fleet.md, 'An id out of sequence')",
        f"events: id {TOP} is past the last the database gave ({given + 1}), numbered by hand (a host's role could,"
        " before schema version 5); no event may follow it, so every booking, cancel and other audited change on"
        " every host fails: as the tables' owner, keep it as evidence and remove it (docs/fleet.md, 'An id out of"
        " sequence')"], lines

    roles.as_owner(f"BEGIN; ALTER TABLE events DISABLE TRIGGER events_no_update;"
                   f" DELETE FROM events WHERE id > {given + 1}; ALTER TABLE events ENABLE TRIGGER events_no_update;"
                   f" DELETE FROM bookings WHERE id > {booked_ids + 1}; COMMIT")
    assert gpu1.call("book", cards=[1], start=start, end=start + HOUR)["id"] == booked_ids + 1 + 1
    lines = list(doctor(PostgresStore(roles.url(roles.roles["gpu1"]), host="gpu1")))
    assert (True, "ids: every numbered row's id is one the database gave (no host chooses one)") in lines, lines
    assert not [line for ok, line in lines if "past the last" in line]


@pytest.mark.parametrize("held", ["the store's lock", "the audit chain's lock"])
def test_a_hosts_role_holding_a_lock_is_named_and_stops_no_heartbeat(roles, hosts, monkeypatch, held):
    """gpu2's role takes the store's write lock (or the audit chain's) and keeps it, as a session lock that no
    transaction timeout of its own ends: gpu1's booking and cancel fail once gpu1's own lock timeout passes (which
    gpu2 cannot lift: each service sets it on its own session), naming the role, application and pid that hold it;
    gpu1's heartbeat, which takes no advisory lock, goes on; and once the lock is let go, gpu1 books."""
    from app.store import pg as pg_module

    monkeypatch.setattr(pg_module, "LOCK_TIMEOUT_MS", 300)  # each service's connection sets it when it opens
    monkeypatch.setattr(pg_module, "HELD_LOCK_TIMEOUT_MS", 200)  # and waits this long at most once it stayed taken
    gpu1 = hosts("gpu1", ALICE)
    start = FROZEN_NOW + HOUR
    made = gpu1.call("book", cards=[0], start=start, end=start + HOUR)
    mallory = psycopg.connect(roles.url(roles.roles["gpu2"]), autocommit=True, application_name="board gpu2")
    try:
        mallory.execute("SET lock_timeout = 0; SET statement_timeout = 0; SET idle_session_timeout = 0")
        key = (pg_module.WRITE_LOCK,) if held == "the store's lock" else pg_module.CHAIN_LOCK
        mallory.execute(f"SELECT pg_advisory_lock({', '.join(map(str, key))})")
        pid = mallory.info.backend_pid
        holder = f"role {roles.roles['gpu2']} (board gpu2, pid {pid}) holds the lock it needs"
        # a booking on named cards takes the store's lock shared, its cards' and then the chain's; a cancel and a
        # booking of a count take the store's alone, exclusive (docs/fleet.md)
        ops = [("book", {"cards": [1], "start": start, "end": start + HOUR})]
        if held == "the store's lock":
            ops += [("cancel", {"id": made["id"]}), ("book", {"count": 1, "start": start, "end": start + HOUR})]
        for waited, (op, args) in zip(("0.3", "0.2", "0.2"), ops):  # the first waits the lock timeout, the next less
            with pytest.raises(StoreError) as caught:  # StoreLocked: exit 1, the database answers reads
                gpu1.call(op, **args)
            assert str(caught.value) == (f"the board database stayed locked for {waited} s: {holder}; nothing was changed:"
                                         f" try again; a superuser may end that session: SELECT"
                                         f" pg_terminate_backend({pid})"), (op, str(caught.value))
        gpu1.service.clock.now += 5
        beat(gpu1.service)  # the heartbeat goes on: gpu1 is not HOST DOWN to the fleet
        assert host_rows.one(gpu1.service.conn, "gpu1").seen_at == FROZEN_NOW + 5
        assert [b["id"] for b in gpu1.call("list", start=None, end=None, user=None)["bookings"]] == [made["id"]]
    finally:
        mallory.close()  # its session ends: the lock goes with it
    assert gpu1.call("book", cards=[1], start=start, end=start + HOUR)["cards"] == [1]
    assert gpu1.service.conn.held_until == 0  # a write that took its locks: the next waits the whole lock timeout


def test_an_install_attacked_before_the_upgrade_is_closed_by_it_and_doctor_names_the_row(pg_cluster, monkeypatch):
    """An existing install (schema version 4, before ids were the database's alone): gpu2's role plants an event past
    every id, as the review did. The owner's upgrade (board migrate --schema-only) closes the hole for the next try,
    and board doctor on any host names the row planted before it."""
    from app.migrate import make_schema
    from app.store import pg as pg_module
    from app.store.pg import where
    from app.store.pg_doctor import doctor
    from app.store.pg_schema import PG_LATEST, PG_MIGRATIONS

    with monkeypatch.context() as old:  # the board before this change made the schema
        old.setattr(pg_module, "PG_MIGRATIONS", PG_MIGRATIONS[:4])
        old.setattr(pg_module, "PG_LATEST", 4)
        roles = pg_cluster.fleet_roles()
    try:
        mallory = psycopg.connect(roles.url(roles.roles["gpu2"]), autocommit=True)
        plant = PLANT.format(overriding="OVERRIDING SYSTEM VALUE").replace("?", "%s")
        mallory.execute(plant, (TOP,))  # the attack, on the old schema: it goes in
        make_schema(PostgresStore(roles.url(roles.owner), host="admin"))  # the owner upgrades
        assert mallory.execute("SELECT max(version) FROM board_schema").fetchone() == (PG_LATEST,)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            mallory.execute(plant, (TOP - 1,))
        mallory.close()
        lines = list(doctor(PostgresStore(roles.url(roles.roles["gpu1"]), host="gpu1")))
        assert (False, f"events: id {TOP} is past the last the database gave (0), numbered by hand (a host's role"
                " could, before schema version 5); no event may follow it, so every booking, cancel and other audited"
                " change on every host fails: as the tables' owner, keep it as evidence and remove it (docs/fleet.md,"
                " 'An id out of sequence')") in lines, lines
        assert (False, "audit event 1 was altered or removed by hand: compare with a dump and ask who edited the"
                f" database at {where(roles.url(roles.owner))}") in lines  # its hash made up: the chain says so too
    finally:
        roles.drop()


def test_doctor_says_when_a_hosts_role_may_move_a_sequence(roles):
    """A host's role needs no privilege on the sequences; UPDATE on one (a grant ON ALL SEQUENCES) lets it setval the
    numbering to the top, after which that table takes no row: board doctor on the host says so, with the REVOKE;
    without it (docs/fleet.md's grants), nothing is said; the owner's own UPDATE is not a finding."""
    from app.store.pg_doctor import doctor

    def findings(role: str) -> list[str]:
        return [line for ok, line in doctor(PostgresStore(roles.url(role), host="gpu1"))
                if "may set where the numbering" in line]

    assert findings(roles.roles["gpu1"]) == []
    roles.as_owner(f"GRANT UPDATE ON SEQUENCE events_id_seq TO {roles.group}")
    mallory = psycopg.connect(roles.url(roles.roles["gpu2"]), autocommit=True)
    mallory.execute("SELECT setval('events_id_seq', 9223372036854775807)")  # what it would allow
    mallory.close()
    assert findings(roles.roles["gpu1"]) == [
        f"role {roles.roles['gpu1']} may set where the numbering of public.events_id_seq goes on (UPDATE on the"
        " sequence): set past every id, no row may follow there: as the tables' owner, REVOKE UPDATE ON SEQUENCE"
        f" public.events_id_seq FROM {roles.group}, PUBLIC"]
    assert findings(roles.owner) == []
    roles.as_owner(f"REVOKE UPDATE ON SEQUENCE public.events_id_seq FROM {roles.group}, PUBLIC")
    assert findings(roles.roles["gpu1"]) == []
