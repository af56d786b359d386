"""`board doctor` on a PostgreSQL store, and the fleet's roles as docs/fleet.md sets them up: the real CLI against a
throwaway cluster (tests/postgres.py; the `postgresql` tier). The clock's FIX is shown with an injected offset (no
faketime here); the real run shows it ok."""

from __future__ import annotations

import re

import pytest

from app.store.pg_doctor import clock_check
from app.store.pg_schema import PG_LATEST
from tests.conftest import run_board

def doctor(url: str, tmp_path, admin_group: str = "root", host: str = "gpu1"):
    config = tmp_path / "board.toml"
    config.write_text(f'[access]\nadmin_group = "{admin_group}"\n[fleet]\nhost = "{host}"\n')
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
    assert said(lines, "ids: every numbered row's id is one the database gave")[0] == "ok"
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


@pytest.mark.parametrize("guard, undo", [
    ("events_no_update", "ALTER TABLE events DISABLE TRIGGER events_no_update"),
    ("events_no_truncate", "DROP TRIGGER events_no_truncate ON events"),
    ("events_no_replace", "ALTER TABLE events DISABLE TRIGGER events_no_replace"),
    ("booking_cards_span", "DROP TRIGGER booking_cards_span ON booking_cards"),
    ("bookings_span", "ALTER TABLE bookings DISABLE TRIGGER bookings_span"),
    ("booking_cards_no_overlap", "ALTER TABLE booking_cards DROP CONSTRAINT booking_cards_no_overlap"),
])
def test_each_guard_of_the_schema_dropped_or_disabled_is_a_fix(database, tmp_path, guard, undo):
    """Each trigger and the no-overlap constraint, named here and not read from the doctor's own list.
    Wrong versions: one guard left out of the list checked; a disabled trigger counted as present."""
    import psycopg

    with psycopg.connect(database, autocommit=True) as conn:  # a superuser editing the schema by hand
        conn.execute(undo)
    result, lines = doctor(database, tmp_path)
    assert result.returncode == 1, result.stdout
    assert said(lines, f"trigger(s) {guard} missing or disabled")[0] == "FIX"


@pytest.mark.parametrize("version, mark, words", [
    (PG_LATEST - 1, "WARN", f"; this board's is {PG_LATEST}: the tables' owner brings it up"),
    (PG_LATEST + 1, "FIX", f" is newer than this board's ({PG_LATEST}): upgrade board on this host"),
])
def test_a_schema_a_version_behind_is_a_warning_and_one_ahead_a_fix(database, tmp_path, version, mark, words):
    """Wrong versions: a schema one behind reported ok (the comparison off by one); behind and ahead swapped."""
    import psycopg

    with psycopg.connect(database, autocommit=True) as conn:
        conn.execute("UPDATE board_schema SET version = %s WHERE version = %s", (version, PG_LATEST))
    result, lines = doctor(database, tmp_path)
    assert said(lines, f"schema version {version}") == (mark, f"schema version {version}{words}" + (
        " (board migrate --schema-only --to URL as the owner; a service connecting as the owner does it at its start)"
        if mark == "WARN" else ""))


def test_an_unreachable_store_is_one_fix_line(tmp_path):
    result, lines = doctor(f"postgresql:///board?host={tmp_path}/nowhere", tmp_path)
    assert result.returncode == 1
    mark, line = said(lines, "the board database is unreachable")
    assert mark == "FIX" and "pg_hba.conf" in line


def test_each_host_its_own_role_bound_to_its_host_and_the_fix_lines_sql_works(pg_cluster, tmp_path):
    """docs/fleet.md's roles (tests/postgres.py's fleet_roles): an owner the admin keeps made the schema, each host's
    LOGIN role is in the group that holds the tables' grants and is bound to its host. Each host books; doctor says
    row-level security binds it. A role bound to no host, a table with RLS lifted, a role acting as the owner (the
    setup before row-level security) and a role outside the group each get a FIX line whose SQL, run as it says,
    makes the line ok. A host's role can neither disable the audit triggers nor rewrite an event."""
    import psycopg

    roles = pg_cluster.fleet_roles()
    gpu1, gpu2 = roles.roles["gpu1"], roles.roles["gpu2"]
    legacy, stray = f"{roles.owner}_legacy", f"{roles.owner}_stray"
    pg_cluster.admin(f"CREATE ROLE {legacy} LOGIN IN ROLE {roles.owner}")
    pg_cluster.admin(f"ALTER ROLE {legacy} IN DATABASE {roles.database} SET role = '{roles.owner}'")
    pg_cluster.admin(f"CREATE ROLE {stray} LOGIN")
    try:
        for n, host in enumerate(("gpu1", "gpu2")):
            config = tmp_path / f"{host}.toml"
            config.write_text(f'[fleet]\nhost = "{host}"\n')
            env = {"BOARD_DB_URL": roles.url(roles.roles[host]), "BOARD_SIMULATE": "1", "BOARD_CONFIG": str(config),
                   "BOARD_DB": str(tmp_path / f"{host}.db"), "TZ": "UTC"}
            booked = run_board("book", "--cards", str(n), "--start", "tomorrow 9:00", "--for", "1h", env=env)
            assert booked.returncode == 0, booked.stderr

        result, lines = doctor(roles.url(gpu2), tmp_path, host="gpu2")
        assert said(lines, f"this host connects as role {gpu2}, not a superuser")[0] == "ok"
        assert said(lines, f"role {gpu2} may read and write the board's tables (owned by {roles.owner})")[0] == "ok"
        assert said(lines, f"row-level security: role {gpu2} writes only host gpu2's rows (hosts, cards, jobs,")[0] \
            == "ok"
        assert said(lines, "audit chain intact (2 events)")[0] == "ok" and result.returncode == 0, result.stdout

        def fixed(url: str, host: str, start: str) -> None:
            """doctor's one FIX line starting `start`; its SQL run as it says (as a superuser, as the tables' owner),
            the FIX lines are gone."""
            result, lines = doctor(url, tmp_path, host=host)
            mark, line = said(lines, start)
            assert mark == "FIX" and result.returncode == 1, lines
            for who, text in re.findall(r"as (a superuser|the tables' owner), (.*?)(?=; and as | \(docs/fleet.md\)|$)",
                                        line):
                for sql in text.split("; "):
                    roles.as_owner(sql) if who == "the tables' owner" else pg_cluster.admin(sql, roles.database)
            result, lines = doctor(url, tmp_path, host=host)
            assert not [line for mark, line in lines if mark == "FIX"], result.stdout

        roles.as_owner(f"DELETE FROM fleet_roles WHERE role = '{gpu1}'")
        fixed(roles.url(gpu1), "gpu1", f"role {gpu1} is bound to no host")
        roles.as_owner("ALTER TABLE jobs DISABLE ROW LEVEL SECURITY")
        fixed(roles.url(gpu2), "gpu2", "row-level security is off on jobs")
        fixed(roles.url(legacy), "gpu3", f"row-level security does not bind this host: role {legacy} acts as"
              f" {roles.owner}, the tables' owner,")
        result, lines = doctor(roles.url(stray), tmp_path, host="gpu4")
        mark, line = said(lines, f"role {stray} may not read and write")
        assert mark == "FIX" and f"GRANT {roles.group} TO {stray}," in line and result.returncode == 1

        with psycopg.connect(roles.url(gpu2), autocommit=True) as conn:
            for sql, refusal in (("ALTER TABLE events DISABLE TRIGGER events_no_update",
                                  psycopg.errors.InsufficientPrivilege),
                                 ("UPDATE events SET actor = 'x'", psycopg.errors.RaiseException),
                                 ("DROP TABLE events CASCADE", psycopg.errors.InsufficientPrivilege)):
                with pytest.raises(refusal):
                    conn.execute(sql)
    finally:
        roles.drop()
        for role in (legacy, stray):
            pg_cluster.admin(f"DROP ROLE {role}")
