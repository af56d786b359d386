"""`board doctor` on a PostgreSQL store, and the fleet's roles as docs/fleet.md sets them up: the real CLI against a
throwaway cluster (tests/postgres.py; the `postgresql` tier). The clock's FIX is shown with an injected offset (no
faketime here); the real run shows it ok."""

from __future__ import annotations

import itertools
import json
from datetime import datetime, timedelta, timezone

import pytest

from app.store.pg_doctor import clock_check
from app.store.pg_schema import PG_LATEST
from tests.conftest import run_board

_roles = itertools.count(1)


def doctor(url: str, tmp_path, admin_group: str = "root"):
    config = tmp_path / "board.toml"
    config.write_text(f'[access]\nadmin_group = "{admin_group}"\n')
    env = {"BOARD_CONFIG": str(config), "BOARD_DB_URL": url, "BOARD_SIMULATE": "1", "BOARD_DB": str(tmp_path / "x.db")}
    result = run_board("doctor", env=env)
    assert "Traceback" not in result.stderr, result.stderr
    return result, [(line[:6].strip(), line[6:]) for line in result.stdout.splitlines()]


def said(lines: list, start: str) -> tuple[str, str]:
    """(the mark, the line) of the one line that starts with `start`."""
    found = [(mark, line) for mark, line in lines if line.startswith(start)]
    assert len(found) == 1, (start, lines)
    return found[0]


@pytest.fixture
def database(pg_cluster):
    url = pg_cluster.fresh_database()
    yield url
    pg_cluster.drop(url)


def test_a_healthy_store_is_all_ok_and_a_superuser_role_is_a_warning(database, tmp_path):
    result, lines = doctor(database, tmp_path)
    assert said(lines, "the database answers at")[0] == "ok"
    assert said(lines, f"schema version {PG_LATEST}")[0] == "ok"
    assert said(lines, "extension btree_gist")[0] == "ok"
    assert said(lines, "clock: this host and the database agree within")[0] == "ok"  # the real clocks: one machine
    assert said(lines, "audit chain intact (0 events)")[0] == "ok"
    mark, line = said(lines, "this host connects as role postgres")  # the cluster's superuser
    assert mark == "WARN" and "a superuser" in line
    assert not [line for mark, line in lines if mark == "FIX"], result.stdout
    assert "sqlite" not in result.stdout.lower() and "mode 600" not in result.stdout  # SQLite's file checks stay there


@pytest.mark.parametrize("offset, mark, words", [
    (0.25, True, "agree within 0.250 s"),
    (-0.9, True, "agree within 0.900 s"),
    (2.5, False, "this host is 2.5 s ahead of the database's (db1:5432/board), more than 1 s"),
    (-1.5, False, "this host is 1.5 s behind the database's"),
])
def test_the_clock_is_a_fix_beyond_a_second(offset, mark, words):
    ok, line = clock_check(offset, "db1:5432/board")
    assert ok is mark and words in line
    assert ok or "NTP" in line


def test_a_chain_edited_by_hand_is_a_fix(database, pg_cluster, tmp_path):
    booked = run_board("book", "--cards", "1", "--start", "tomorrow 9:00", "--for", "1h",
                       env={"BOARD_DB_URL": database, "BOARD_SIMULATE": "1", "BOARD_DB": str(tmp_path / "x.db")})
    assert booked.returncode == 0, booked.stderr
    import psycopg

    with psycopg.connect(database, autocommit=True) as conn:  # a superuser editing history by hand
        conn.execute("ALTER TABLE events DISABLE TRIGGER events_no_update")
        conn.execute("UPDATE events SET actor = 'mallory' WHERE id = 1")
    result, lines = doctor(database, tmp_path)
    assert result.returncode == 1
    assert said(lines, "trigger(s) events_no_update missing or disabled")[0] == "FIX"
    assert said(lines, "audit event 1 was altered or removed by hand")[0] == "FIX"


def test_an_unreachable_store_is_one_fix_line(tmp_path):
    result, lines = doctor(f"postgresql:///board?host={tmp_path}/nowhere", tmp_path)
    assert result.returncode == 1
    mark, line = said(lines, "the board database is unreachable")
    assert mark == "FIX" and "pg_hba.conf" in line


def test_each_host_its_own_role_on_the_schema_the_first_made(pg_cluster, tmp_path):
    """docs/fleet.md's roles: a group role owns the database; each host's LOGIN role is a member that acts as it, so
    the schema the first host's service makes is usable by the second's; a role outside the group is told the GRANT."""
    n = next(_roles)
    group, gpu1, gpu2, stray, db = f"board{n}", f"board{n}_gpu1", f"board{n}_gpu2", f"stray{n}", f"fleet{n}"
    for sql in (f"CREATE ROLE {group} NOLOGIN", f"CREATE ROLE {gpu1} LOGIN IN ROLE {group}",
                f"CREATE ROLE {gpu2} LOGIN IN ROLE {group}", f"CREATE ROLE {stray} LOGIN",
                f"CREATE DATABASE {db} OWNER {group}",
                f"ALTER ROLE {gpu1} IN DATABASE {db} SET role = '{group}'",
                f"ALTER ROLE {gpu2} IN DATABASE {db} SET role = '{group}'"):
        pg_cluster.admin(sql)
    url = f"postgresql:///{db}?host={pg_cluster.sockets}&user="
    try:
        host1 = {"BOARD_DB_URL": url + gpu1, "BOARD_SIMULATE": "1", "BOARD_DB": str(tmp_path / "1.db"), "TZ": "UTC"}
        host2 = {**host1, "BOARD_DB_URL": url + gpu2, "BOARD_DB": str(tmp_path / "2.db")}
        start = (datetime.now(timezone.utc) + timedelta(days=1)).strftime("%Y-%m-%dT09:00")
        first = run_board("book", "--cards", "0", "--start", start, "--for", "1h", "--json", env=host1)
        assert first.returncode == 0, first.stderr  # the first start made the schema, as the group
        second = run_board("book", "--cards", "1", "--start", start, "--for", "1h", "--json", env=host2)
        assert second.returncode == 0, second.stderr
        listed = json.loads(run_board("list", "--json", env=host2).stdout)
        assert [b["id"] for b in listed["bookings"]] == [json.loads(first.stdout)["id"], json.loads(second.stdout)["id"]]

        result, lines = doctor(url + gpu2, tmp_path)
        assert said(lines, f"this host connects as role {gpu2} (acting as {group}), not a superuser")[0] == "ok"
        assert said(lines, f"role {group} may read and write the board's tables (owned by {group})")[0] == "ok"
        assert said(lines, "audit chain intact (2 events)")[0] == "ok"

        result, lines = doctor(url + stray, tmp_path)
        mark, line = said(lines, f"role {stray} may not read and write")
        assert mark == "FIX" and f"GRANT {group} TO {stray}" in line and result.returncode == 1
    finally:
        pg_cluster.admin(f"DROP DATABASE {db} WITH (FORCE)")
        for role in (gpu1, gpu2, stray, group):
            pg_cluster.admin(f"DROP ROLE {role}")


def test_hosts_with_only_the_grants_cannot_touch_the_audit_triggers(pg_cluster, tmp_path):
    """docs/threat-model.md's stricter setup: an owner role the admin keeps makes the schema; the hosts' group gets
    only SELECT, INSERT, UPDATE, DELETE (events: SELECT, INSERT), so a host's role books as usual but can neither
    disable the append-only triggers nor rewrite an event."""
    import psycopg

    n = next(_roles)
    owner, hosts, gpu1, db = f"owner{n}", f"hosts{n}", f"hosts{n}_gpu1", f"strict{n}"
    for sql in (f"CREATE ROLE {owner} LOGIN", f"CREATE ROLE {hosts} NOLOGIN", f"CREATE ROLE {gpu1} LOGIN IN ROLE {hosts}",
                f"CREATE DATABASE {db} OWNER {owner}"):
        pg_cluster.admin(sql)
    url = f"postgresql:///{db}?host={pg_cluster.sockets}&user="
    env = {"BOARD_SIMULATE": "1", "BOARD_DB": str(tmp_path / "1.db"), "TZ": "UTC"}
    try:
        made = run_board("list", env={**env, "BOARD_DB_URL": url + owner})  # any command's first open makes the schema
        assert made.returncode == 0, made.stderr
        with psycopg.connect(url + owner, autocommit=True) as conn:
            conn.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {hosts}")
            conn.execute(f"REVOKE UPDATE, DELETE ON events, board_schema FROM {hosts}")
            conn.execute(f"REVOKE INSERT ON board_schema FROM {hosts}")
        booked = run_board("book", "--cards", "0", "--start", "tomorrow 9:00", "--for", "1h",
                           env={**env, "BOARD_DB_URL": url + gpu1})
        assert booked.returncode == 0, booked.stderr
        result, lines = doctor(url + gpu1, tmp_path)
        assert said(lines, f"role {gpu1} may read and write the board's tables (owned by {owner})")[0] == "ok"
        assert said(lines, "audit chain intact (1 events)")[0] == "ok" and result.returncode == 0, result.stdout
        with psycopg.connect(url + gpu1, autocommit=True) as conn:
            for sql in ("ALTER TABLE events DISABLE TRIGGER events_no_update", "UPDATE events SET actor = 'x'",
                        "DROP TABLE events CASCADE"):
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    conn.execute(sql)
    finally:
        pg_cluster.admin(f"DROP DATABASE {db} WITH (FORCE)")
        for role in (gpu1, hosts, owner):
            pg_cluster.admin(f"DROP ROLE {role}")
