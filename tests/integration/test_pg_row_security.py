"""Row-level security per host (issue 21, docs/threat-model.md): on a database set up as docs/fleet.md's roles section
says (tests/postgres.py's fleet_roles), each host's service connects with its own role, bound to its host in
fleet_roles by the tables' owner. A host reads every row but writes only its own host's snapshot, cards, jobs,
servers and rollups; it cannot bind itself, lift the policies or forge its binding; members still book any host's
cards. Two services on one real database (the `postgresql` tier), then each host's own connection used by hand as a
compromised host would. PostgreSQL refuses a new row another host's (SQLSTATE 42501) and leaves another host's
existing rows out of an UPDATE or DELETE (none changed): both are checked."""

from __future__ import annotations

import sqlite3
from dataclasses import replace

import pytest

from app.client.local import LocalClient
from app.config import Config, FleetSettings, HistorySettings, PostgresStore
from app.core.identity import Identity
from app.errors import NotPermitted
from app.gpu import open_source
from app.service.hosts import beat
from app.store import hosts as host_rows
from app.store import jobs
from app.store.db import connect, storage_error, write
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
        config = replace(Config(), db_path=tmp_path / "board.db", storage_url=roles.url(roles.roles[name]),
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
