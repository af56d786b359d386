"""The fleet's history on PostgreSQL (issue 21): each host's sampler writes its finished 5-minute rollups to the store,
`board report` on any host reads every host's from there, a database that went away is caught up from the history
file, and `board migrate` copies an install's rollups. Two services with their own [fleet] host, simulated fleets and
history files on one real database (tests/postgres.py), their clock moved by hand so buckets finish at once; the
report through the real CLI. The `postgresql` tier."""

from __future__ import annotations

import csv
import io
import json
import time

import pytest
from msgspec import structs

from app.client.local import LocalClient
from app.config import Config, FleetSettings, HistorySettings, PostgresStore
from app.core.identity import Identity
from app.gpu import open_source
from app.history.fleet import prune
from app.history.sampler import Sampler, pusher_of
from app.history.store import BUCKET_S, STATES, HistoryStore
from app.service.fleet.hosts import beat
from app.store.pg import PgConnection
from tests.conftest import Clock, postgresql_only, run_board

ALICE = Identity("alice", 50001, False)
MINUTES = 15  # three finished buckets


@pytest.fixture
def fleet(tmp_path, store):
    """make(name) -> (client, sampler, pusher, env for the CLI) of host `name`'s service on the one database."""
    clock = Clock(time.time() // BUCKET_S * BUCKET_S - 2 * 3600)  # within the report's last day
    made: list[LocalClient] = []

    def make(name: str):
        history = tmp_path / f"{name}.history.db"
        config = Config(db_path=tmp_path / "board.db", storage_url=store.url, refresh_seconds=0,
                         history=HistorySettings(db=str(history), sample_s=10),
                         fleet=FleetSettings(host=name))
        client = LocalClient.on(config, open_source(True, clock=clock, host=name), ALICE, clock=clock)
        made.append(client)
        service = client.service
        beat(service)  # its cards (with their host) and its snapshot in the store, as its agent writes them
        toml = tmp_path / f"{name}.toml"
        toml.write_text(f'[fleet]\nhost = "{name}"\n[history]\ndb = "{history}"\n')
        env = {"BOARD_CONFIG": str(toml), "BOARD_DB_URL": store.url, "BOARD_DB": str(tmp_path / "board.db"),
               "BOARD_SIMULATE": "1", "TZ": "UTC"}
        sampler = Sampler(service.fleet, service.history, config, clock)
        return client, sampler, pusher_of(service.history, config, clock), env

    yield make, clock
    for client in made:
        client.service.close()


def sample(sampler: Sampler, clock: Clock, minutes: int) -> None:
    """Sample every 10 s for `minutes`, then roll up what finished (as the sampler's loop does each minute)."""
    for _ in range(minutes * 6):
        sampler.sample_once()
        clock.now += 10
    sampler.maintain()


def report(env: dict, *args: str):
    result = run_board("report", "--since", "1d", "--by", "card", *args, env=env)
    assert result.returncode == 0, result.stderr
    return result.stdout


def store_rollups(url: str, host: str) -> list[tuple]:
    conn = PgConnection(PostgresStore(url, host="test"))
    try:
        return [tuple(r) for r in conn.execute(
            "SELECT card_uuid, ts, n, state, util_min, util_mean_d, vram_max_d FROM rollups WHERE host = ?"
            " ORDER BY ts, card_uuid", [host])]
    finally:
        conn.close()


def file_rollups(path) -> list[tuple]:
    history = HistoryStore(path)
    try:
        rows = history.rollups(0, 2**40)
        return [(r["uuid"], r["ts"], r["n"], STATES.index(r["state"]), r["util_min"],
                 r["util_mean"] - r["util_min"], r["vram_max"] - r["vram_min"]) for r in rows]
    finally:
        history.close()


@postgresql_only
def test_report_on_either_host_covers_both_hosts_cards_from_the_store(fleet, store):
    make, clock = fleet
    (_, sampler1, pusher1, env1), (_, sampler2, pusher2, env2) = make("gpu1"), make("gpu2")
    sample(sampler1, clock, MINUTES)
    clock.now -= MINUTES * 60  # the same quarter hour on gpu2
    sample(sampler2, clock, MINUTES)
    assert pusher1.step() and pusher2.step()
    assert pusher1.step() == 0  # level: nothing written twice
    for host, pusher in (("gpu1", pusher1), ("gpu2", pusher2)):
        written = store_rollups(store.url, host)
        assert written == file_rollups(pusher.history.path) and len(written) == 3 * 8, host

    for env in (env1, env2):
        doc = json.loads(report(env, "--json"))
        rows = {r["key"]: r for r in doc["rows"]}
        assert set(rows) == {f"gpu{h}:{i}" for h in (1, 2) for i in range(8)}, sorted(rows)
        assert all(r["host"] == r["key"].split(":")[0] for r in rows.values())
        assert all(r["util_mean_pct"] is not None for r in rows.values())  # each card's rollups, gpu2's too
        table = list(csv.DictReader(io.StringIO(report(env, "--csv"))))
        assert {(r["key"], r["host"]) for r in table if r["key"] != "total"} == \
            {(k, r["host"]) for k, r in rows.items()}


@postgresql_only
def test_sampling_goes_on_while_the_database_is_paused_and_the_rollups_catch_up(fleet, store, pg_cluster):
    make, clock = fleet
    _, sampler, pusher, env = make("gpu1")
    sample(sampler, clock, 10)
    assert pusher.step()
    before = len(store_rollups(store.url, "gpu1"))
    pg_cluster.pause()
    try:
        sample(sampler, clock, 20)  # raises on a sampler that needs the bookings' database for each sample
        with pytest.raises(Exception, match="unreachable"):
            pusher.step()
    finally:
        pg_cluster.resume()
    file = file_rollups(pusher.history.path)
    assert len(file) > before  # rolled up in the file meanwhile
    deadline = time.monotonic() + 60  # the pusher's connection comes back after its backoff (at most seconds here)
    while True:
        try:
            pusher.step()
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    assert store_rollups(store.url, "gpu1") == file
    doc = json.loads(report(env, "--json"))
    assert {r["key"] for r in doc["rows"]} == {str(i) for i in range(8)}  # one host: plain card numbers


@pytest.mark.postgresql
def test_migrate_copies_the_history_files_rollups_tagged_with_this_host(tmp_path, pg_cluster):
    clock = Clock(time.time() // BUCKET_S * BUCKET_S - 3600)
    history = tmp_path / "elsewhere.history.db"
    config = Config(db_path=tmp_path / "board.db", refresh_seconds=0,
                     history=HistorySettings(db=str(history)), fleet=FleetSettings(host="gpu7"))
    client = LocalClient.on(config, open_source(True, clock=clock, host="gpu7"), ALICE, clock=clock)
    try:
        client.call("book", cards=[2], start=int(clock.now), end=int(clock.now) + 3600)
        sample(Sampler(client.service.fleet, client.service.history, config, clock), clock, MINUTES)
    finally:
        client.service.close()
    (tmp_path / "board.toml").write_text(f'[fleet]\nhost = "gpu7"\n[history]\ndb = "{history}"\n')
    env = {"BOARD_CONFIG": str(tmp_path / "board.toml"), "BOARD_DB": str(tmp_path / "board.db"),
           "BOARD_SIMULATE": "1", "TZ": "UTC"}
    target = pg_cluster.empty_database()
    try:
        moved = run_board("migrate", "--to", target, env=env)
        assert moved.returncode == 0, moved.stderr
        assert "copied 24 rollups" in moved.stderr.splitlines()
        assert store_rollups(target, "gpu7") == file_rollups(history) and len(file_rollups(history)) == 24
        here = {**env, "BOARD_DB_URL": target}
        rows = {r["key"]: r for r in json.loads(report(here, "--json"))["rows"]}
        assert rows["2"]["booked_h"] > 0 and rows["2"]["host"] == "gpu7"
    finally:
        pg_cluster.drop(target)


@postgresql_only
def test_another_hosts_multi_card_booking_gets_its_link_utilisation_from_the_store(fleet, store):
    """`tp` on gpu1 covers gpu2's two-card booking from gpu2's rollups in the store (their mean PCIe traffic) and the
    links gpu2's snapshot read; named as --cards names them, with the figure gpu2's own report has from its file."""
    make, clock = fleet
    _, sampler1, pusher1, env1 = make("gpu1")
    client2, sampler2, pusher2, env2 = make("gpu2")
    start = int(clock.now)
    booked = client2.call("book", cards=[0, 1], start=start, end=start + 2 * 3600)
    sample(sampler2, clock, MINUTES)
    clock.now -= MINUTES * 60
    sample(sampler1, clock, MINUTES)
    assert pusher1.step() and pusher2.step()
    [there] = json.loads(report(env2, "--json"))["tp"]  # gpu2's own, from its history file
    [here] = json.loads(report(env1, "--json"))["tp"]
    assert (there["booking"], there["cards"]) == (booked["id"], "0-1")
    assert (here["booking"], here["cards"], here["user"]) == (booked["id"], "gpu2:0-1", booked["user"])
    assert here["link_util_pct"] > 0 and here["link_util_pct"] == pytest.approx(there["link_util_pct"], abs=0.5)
    assert (here["busy_h"], here["over"]) == (there["busy_h"], there["over"])
    assert f"#{booked['id']} {booked['user']} cards gpu2:0-1: " in report(env1)


@postgresql_only
def test_pruning_a_hosts_rollups_keeps_the_bucket_at_the_cut_and_every_other_hosts(store):
    """prune(conn, host, before) deletes the host's buckets that start before `before`, rollups and squats alike, as
    its history file prunes its own: the bucket that starts at the cut stays, and so does every other host's.

    Wrong versions it fails on: `ts <= before` (the bucket at the cut goes); `ts < before` for the rollups but not the
    squats; another host's rows deleted with this host's."""
    conn = PgConnection(structs.replace(store, host="gpu1"))
    cut = 1_795_966_200 // BUCKET_S * BUCKET_S
    buckets = (cut - BUCKET_S, cut, cut + BUCKET_S)
    conn.execute("BEGIN")
    for host in ("gpu1", "gpu2"):
        conn.executemany("INSERT INTO rollups (host, card_uuid, ts, n, dt, state) VALUES (?, 'GPU-1', ?, 1, 1, 0)",
                         [(host, ts) for ts in buckets])
        conn.executemany("INSERT INTO rollup_squats (host, card_uuid, ts, \"user\", n) VALUES (?, 'GPU-1', ?, 'eve', 1)",
                         [(host, ts) for ts in buckets])
    conn.execute("COMMIT")
    assert prune(conn, "gpu1", cut) == 1
    for table in ("rollups", "rollup_squats"):
        assert conn.execute(f"SELECT host, ts FROM {table} ORDER BY host, ts").fetchall() == [
            ("gpu1", cut), ("gpu1", cut + BUCKET_S), *(("gpu2", ts) for ts in buckets)], table
    conn.close()
