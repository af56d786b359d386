"""`board migrate --to postgresql://...` as an admin runs it (the real CLI): a SQLite install made through the real CLI
(bookings, a series, cancelled bookings, a key, a planned server, their audit events) copied into a throwaway
PostgreSQL cluster's empty database (tests/postgres.py), and then used there by the same CLI. The `postgresql` tier."""

from __future__ import annotations

import json
import shutil
import socket
import sqlite3

import pytest

from app.config import PostgresStore
from app.store import events
from app.store.pg import PgConnection
from app.store.pg_schema import PG_LATEST
from tests.conftest import day, one_line, run_board
from tests.fit import shapes

TABLES = ("bookings", "booking_cards", "cards", "series", "events", "jobs", "servers", "outbox", "faults", "alerts",
          "api_keys", "gateway_usage", "server_plans", "server_plan_runs", "hosts")


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """An install's SQLite database, made once through the real CLI; each test gets its own copy (`install`)."""
    root = tmp_path_factory.mktemp("made")
    models = root / "models"
    models.mkdir()
    model = shapes.write_model(models / "gqa8.gguf", "gqa8")
    config = root / "board.toml"
    config.write_text(f'[llama]\nmodel_dirs = ["{models}"]\n')
    env = {"BOARD_CONFIG": str(config), "BOARD_DB": str(root / "board.db"), "BOARD_SIMULATE": "1", "TZ": "UTC"}

    def ok(*args):
        result = run_board(*args, env=env)
        assert result.returncode == 0, (args, result.stderr)
        return result

    first = json.loads(ok("book", "--cards", "0", "--start", f"{day(1)}T09:00", "--for", "2h", "--json").stdout)["id"]
    ok("book", "2", "--start", f"{day(1)}T12:00", "--for", "1h", "--note", "eval ünïcode")
    dropped = json.loads(ok("book", "--cards", "3", "--start", f"{day(2)}T09:00", "--for", "1h", "--json").stdout)
    ok("cancel", str(dropped["id"]))
    ok("book", "--cards", "4,5", "--every", "day", "--start", "9-17", "--from", day(3), "--to", day(5))
    ok("key", "new", "--name", "laptop", "--class", "online")
    ok("serve", "plan", str(first), "--model", str(model), "--ctx", "4096", "--alias", "team")
    refused = run_board("book", "--cards", "0", "--start", f"{day(1)}T09:30", "--for", "1h", env=env)
    assert refused.returncode == 3  # a refusal is an audit event too
    return root, env


@pytest.fixture
def install(made, tmp_path):
    """(env for the SQLite install, its database file): a copy of `made`'s, so a test may edit it."""
    root, env = made
    shutil.copytree(root, tmp_path / "install")
    copy = tmp_path / "install"
    env = {**env, "BOARD_CONFIG": str(copy / "board.toml"), "BOARD_DB": str(copy / "board.db")}
    return env, copy / "board.db"


@pytest.fixture
def target(pg_cluster):
    url = pg_cluster.empty_database()
    yield url
    pg_cluster.drop(url)


def counts(conn) -> dict[str, int]:
    return {table: conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0] for table in TABLES}


def on_pg(url: str):
    return PgConnection(PostgresStore(url, host="test"))


def test_migrate_copies_every_table_and_the_board_carries_on_there(install, target):
    env, db = install
    moved = run_board("migrate", "--to", target, env=env)
    assert moved.returncode == 0, moved.stderr
    source = sqlite3.connect(db)
    before = {table: source.execute(f"SELECT count(*) FROM {table}").fetchone()[0] for table in TABLES}
    # One progress line per table on stderr, in the order they were copied; the summary on stdout.
    progress = dict(reversed(line.removeprefix("copied ").split(" ", 1)) for line in moved.stderr.splitlines())
    assert progress.keys() == set(TABLES), moved.stderr
    assert {table: int(n.replace(",", "")) for table, n in progress.items()} == before
    assert "15 tables" in moved.stdout and f"audit chain intact ({before['events']:,} events)" in moved.stdout
    assert before["bookings"] >= 6 and before["series"] == 1 and before["api_keys"] == 1 and before["events"] >= 8

    pg = {**{k: v for k, v in env.items() if k != "BOARD_DB"}, "BOARD_DB_URL": target}
    for args in (("list", "--all", "--json"), ("series", "show", "1", "--json"), ("key", "list", "--all", "--json"),
                 ("serve", "plan", "--list", "--json"), ("log", "--json", "--limit", "1000")):
        there = run_board(*args, env=pg)
        assert there.returncode == 0, (args, there.stderr)
        assert json.loads(there.stdout) == json.loads(run_board(*args, env=env).stdout), args

    conn = on_pg(target)
    try:
        assert counts(conn) == before
        assert events.first_broken(conn) is None
        last_booking = conn.execute("SELECT max(id) FROM bookings").fetchone()[0]
        last_event = conn.execute("SELECT max(id) FROM events").fetchone()[0]
        booked = run_board("book", "--cards", "6", "--start", f"{day(1)}T09:00", "--for", "1h", "--json", env=pg)
        assert booked.returncode == 0, booked.stderr
        assert json.loads(booked.stdout)["id"] == last_booking + 1  # ids go on after the old max
        assert conn.execute("SELECT min(id) FROM events WHERE id > %s" % last_event).fetchone()[0] == last_event + 1
        assert events.first_broken(conn) is None  # the new event continues the copied chain
        card_rows = conn.execute("SELECT uuid, rowid FROM cards ORDER BY rowid").fetchall()
    finally:
        conn.close()
    assert card_rows == [tuple(row) for row in source.execute("SELECT uuid, rowid FROM cards ORDER BY rowid")]
    source.close()


def test_a_second_migrate_is_refused_and_writes_nothing(install, target, pg_cluster):
    env, _ = install
    assert run_board("migrate", "--to", target, env=env).returncode == 0
    conn = on_pg(target)
    try:
        held = counts(conn)
        again = run_board("migrate", "--to", target, env=env)
        assert again.returncode == 2 and f"already holds a board (schema version {PG_LATEST})" in one_line(again)
        assert "nothing was written" in again.stderr and again.stdout == ""
        assert counts(conn) == held
    finally:
        conn.close()
    # A database a service already made its (empty) schema in is a board too: migrate before the first start.
    started = pg_cluster.fresh_database()
    try:
        refused = run_board("migrate", "--to", started, env=env)
        assert refused.returncode == 2 and "already holds a board" in one_line(refused)
    finally:
        pg_cluster.drop(started)


def test_a_chain_broken_by_hand_in_the_source_is_copied_as_it_is_and_said(install, target):
    env, db = install
    edit = sqlite3.connect(db)
    edit.execute("DROP TRIGGER events_no_update")  # as someone editing the file by hand has to
    edit.execute("UPDATE events SET actor = 'mallory' WHERE id = 3")
    edit.commit()
    edit.close()
    moved = run_board("migrate", "--to", target, env=env)
    assert moved.returncode == 1, moved.stderr
    said = moved.stderr.splitlines()
    assert said[-1].startswith("board: copied, but") and "already broken at event 3" in said[-1], moved.stderr
    assert all(line.startswith("copied ") for line in said[:-1]) and "Traceback" not in moved.stderr
    assert "audit chain broken at event 3" in moved.stdout
    conn = on_pg(target)
    try:
        assert events.first_broken(conn) == 3  # the evidence moved with the data
    finally:
        conn.close()


@pytest.mark.parametrize("url, says", [
    ("mysql://db1/board", "--to must be a PostgreSQL URI"),
    ("postgresql://db1:5432", "name the database"),
    ("postgresql://db1/board?colour=red", 'invalid URI query parameter: "colour"'),
    ("postgresql://db1:port/board", "the port must be a number"),
])
def test_a_bad_url_is_one_line_and_exit_2(install, url, says):
    env, _ = install
    refused = run_board("migrate", "--to", url, env=env)
    assert refused.returncode == 2 and says in one_line(refused), refused.stderr


def test_an_unreachable_target_is_the_one_unreachable_line(install, tmp_path):
    env, _ = install
    gone = run_board("migrate", "--to", f"postgresql:///board?host={tmp_path}/nowhere", env=env)
    assert gone.returncode == 1
    assert "the board database is unreachable" in one_line(gone) and "nothing was changed" in gone.stderr


def test_refused_while_the_service_answers_on_its_socket(install, target, tmp_path):
    env, _ = install
    path = tmp_path / "board.sock"
    config = tmp_path / "install" / "board.toml"
    config.write_text(config.read_text() + f'\n[service]\nsocket = "{path}"\n')
    listening = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # stands in for the service: it accepts
    listening.bind(str(path))
    listening.listen()
    try:
        refused = run_board("migrate", "--to", target, env=env)
        assert refused.returncode == 3 and "stop it first" in one_line(refused), refused.stderr
    finally:
        listening.close()
    conn = on_pg(target)
    try:
        assert conn.execute("SELECT to_regclass('board_schema')").fetchone()[0] is None  # nothing written
    finally:
        conn.close()
    # Nobody listening (the service stopped; its socket file may stay): the copy goes ahead.
    assert run_board("migrate", "--to", target, env=env).returncode == 0


def test_a_password_file_others_may_read_is_refused_in_one_line(install, target, tmp_path):
    env, _ = install
    secret = tmp_path / "db-password"
    secret.write_text("hunter2\n")
    secret.chmod(0o644)
    refused = run_board("migrate", "--to", target, "--password-file", str(secret), env=env)
    assert refused.returncode == 2 and "mode 0600 or 0400" in one_line(refused)
    secret.chmod(0o600)  # the cluster trusts its socket: a password is sent and not needed
    assert run_board("migrate", "--to", target, "--password-file", str(secret), env=env).returncode == 0
