"""Many hosts, one board, on SQLite: two services with their own [fleet] host, simulated fleets and history files on
one shared database file stand in for two hosts (in this process with a clock the test moves, and as two real
agents). The lead runs the same tests on PostgreSQL once the store speaks it."""

from __future__ import annotations

import json
import re
import threading

import pytest

from app.client.local import LocalClient
from app.config import Config, FleetSettings, HistorySettings, load_config
from app.core.identity import Identity
from app.errors import BadInput, Conflict
from app.gpu import open_source
from app.core.text import format_time
from app.output import status_text
from app.service.fleet.hosts import BEAT_S, beat, remote_host, remote_hosts, start_heartbeat
from app.store import hosts as host_rows
from app.store.db import connect
from tests.conftest import FROZEN_NOW, Clock, postgresql_only

HOUR = 3600
ALICE = Identity("alice", 50001, False)
BOB = Identity("bob", 50002, False)
TIMEOUT_S = 5.0


@pytest.fixture
def clock():
    return Clock(FROZEN_NOW)


@pytest.fixture
def hosts(tmp_path, clock):
    """make(name, me) -> a LocalClient for `me` on host `name`'s service; every host on one database file."""
    made: list[LocalClient] = []

    def make(name: str, me: Identity = ALICE, **settings) -> LocalClient:
        config = Config(**settings, db_path=tmp_path / "board.db",
                         history=HistorySettings(db=str(tmp_path / f"{name}.history.db")),
                         fleet=FleetSettings(host=name, heartbeat_timeout_s=TIMEOUT_S))
        client = LocalClient.on(config, open_source(True, clock=clock, host=name), me, clock=clock)
        made.append(client)
        return client

    yield make
    for client in made:
        client.service.close()


def test_each_host_has_cards_of_its_own_and_an_unnamed_host_keeps_todays(tmp_path, clock, hosts):
    gpu1, gpu2 = hosts("gpu1"), hosts("gpu2")
    uuids = {name: [c.uuid for c in client.service.fleet.latest().cards] for name, client in (("1", gpu1), ("2", gpu2))}
    assert not set(uuids["1"]) & set(uuids["2"]) and len(set(uuids["1"])) == 8
    assert open_source(True, clock=clock).read().cards[3].uuid == "GPU-5090sim-0000-0000-0000-000000000003"


def test_a_member_on_gpu1_books_gpu2s_card_and_a_member_on_gpu2_is_refused_it(hosts, clock):
    gpu1, gpu2 = hosts("gpu1", ALICE), hosts("gpu2", BOB)
    beat(gpu2.service)
    start = int(clock()) + HOUR
    booked = gpu1.call("book", cards=[3], host="gpu2", start=start, end=start + HOUR)
    gpu2_card3 = gpu2.service.fleet.latest().cards[3].uuid
    assert (booked["host"], booked["cards"], booked["card_uuids"]) == ("gpu2", [3], [gpu2_card3])
    with pytest.raises(Conflict) as refused:
        gpu2.call("book", cards=[3], start=start, end=start + HOUR)
    assert "booked by alice" in str(refused.value) and "\n" not in str(refused.value)
    # gpu1's card 3 is another card: bob takes it on gpu1 at the same time
    assert gpu1.service.host == "gpu1"
    bob_on_gpu1 = hosts("gpu1", BOB)
    assert bob_on_gpu1.call("book", cards=[3], start=start, end=start + HOUR)["host"] == "gpu1"
    # and gpu2 naming its own host is the same as a plain number
    with pytest.raises(Conflict):
        gpu2.call("book", cards=[3], host="gpu2", start=start, end=start + HOUR)
    listed = {b["id"]: b["host"] for b in gpu2.call("list", start=None, end=None, user=None)["bookings"]}
    assert sorted(listed.values()) == ["gpu1", "gpu2"]


def test_an_unknown_host_is_one_line_naming_the_known_ones(hosts, clock):
    gpu1 = hosts("gpu1")
    beat(hosts("gpu2").service)
    start = int(clock()) + HOUR
    with pytest.raises(BadInput) as refused:
        gpu1.call("book", cards=[0], host="gpu9", start=start, end=start + HOUR)
    assert str(refused.value) == "there is no host 'gpu9' on this board; the hosts are gpu1, gpu2"
    with connect(gpu1.service.config.db_path) as conn:
        assert conn.execute("SELECT count(*) FROM bookings").fetchone()[0] == 0


def test_status_on_gpu1_shows_gpu2s_cards_with_their_host_and_host_down_after_the_timeout(hosts, clock):
    gpu1, gpu2 = hosts("gpu1", ALICE), hosts("gpu2", BOB)
    one_host = status_text(gpu1.call("status"), clock())
    assert "HOST" not in one_host  # one host known: today's table
    beat(gpu2.service)
    seen_at = clock()
    start = int(clock())
    gpu2.call("book", cards=[4], start=start, end=start + HOUR, note="on gpu2")
    status = gpu1.call("status")
    assert [(c["host"], c["index"]) for c in status["cards"]] == [("gpu1", i) for i in range(8)] + [
        ("gpu2", i) for i in range(8)]
    card = status["cards"][8 + 4]
    assert card["booking"]["user"] == "bob" and card["state"] == "BOOKED" and "host_down" not in card
    assert status["cards"][4]["booking"] is None  # gpu1's card 4 is another card: free
    text = status_text(status, clock())
    assert text.splitlines()[1].split()[:2] == ["HOST", "#"] and "HOST DOWN" not in text
    # gpu2 falls silent: at the timeout it is still up, past it down since its last beat
    clock.now += TIMEOUT_S
    assert not any(c.get("host_down") for c in gpu1.call("status")["cards"])
    clock.now += 1
    status = gpu1.call("status")
    down = [c for c in status["cards"] if c.get("host_down")]
    assert [c["host"] for c in down] == ["gpu2"] * 8 and {c["down_since"] for c in down} == {seen_at}
    assert down[4]["booking"]["user"] == "bob"  # its bookings stay
    text = status_text(status, clock())
    assert text.count("HOST DOWN (since ") == 8
    # what gpu2 last read is stale: its cards' VRAM, utilisation, temperature, power and users are blank
    lines = text.splitlines()
    held = next(line for line in lines if line.startswith("gpu2") and "bob" in line)
    assert held.split()[:6] == ["gpu2", "4", "HOST", "DOWN", "(since", f"{format_time(int(seen_at), clock())})"]
    assert held.split()[6:] == ["-", "bob", format_time(start + HOUR, clock()), "-"], held  # ASKED, HOLDER, UNTIL, NEXT
    assert all("°C" in line for line in lines[2:10]) and not any("°C" in line for line in lines[10:])
    # it comes back: its cards come back
    beat(gpu2.service)
    assert not any(c.get("host_down") for c in gpu1.call("status")["cards"])


def test_a_booking_on_a_host_that_is_down_is_told_and_one_that_starts_now_needs_its_cards_named_and_forced(hosts,
                                                                                                            clock):
    """Issue 31 §8: gpu2's cards were booked for now with no word while gpu2 showed HOST DOWN. Now a booking there is
    told (a note, as a HOT card's), and one that starts now is refused (exit 3, one line saying what to do) unless its
    cards are named and forced; nothing is written by a refusal. A host at its timeout is not down yet."""
    gpu1, gpu2 = hosts("gpu1", ALICE), hosts("gpu2", BOB)
    beat(gpu2.service)
    seen_at = clock()
    clock.now += TIMEOUT_S  # at the timeout: still up, no word about it
    start = int(clock())
    def down_notes(booked: dict) -> list[str]:
        return [note for note in booked.get("notes", ()) if "is down" in note]

    assert down_notes(gpu1.call("book", cards=[0], host="gpu2", start=start, end=start + HOUR)) == []
    clock.now += 1
    now = int(clock())
    silent = f"host gpu2 is down (no word from its service since {format_time(int(seen_at), now)})"
    before = gpu1.call("list", start=None, end=None, user=None)["bookings"]
    for ask in (dict(cards=[1]), dict(count=1), dict(count=1, force=True), dict(count=1, or_later=True)):
        with pytest.raises(Conflict) as refused:
            gpu1.call("book", **ask, host="gpu2", start=now, end=now + HOUR)
        assert str(refused.value) == (f"{silent}: nobody can see what runs on its cards now; book another host's"
                                      " cards, or name the cards (--cards) and pass --force to book them anyway"), ask
    assert gpu1.call("list", start=None, end=None, user=None)["bookings"] == before
    forced = gpu1.call("book", cards=[1], host="gpu2", start=now, end=now + HOUR, force=True)
    later = gpu1.call("book", count=1, host="gpu2", start=now + HOUR, end=now + 2 * HOUR)
    told = f"{silent}: booked anyway; nobody can see what runs on its cards until it is back"
    assert down_notes(forced) == [told] and down_notes(later) == [told]
    assert down_notes(gpu1.call("book", cards=[1], start=now, end=now + HOUR)) == []  # gpu1's own card 1: up
    beat(gpu2.service)  # back: no word again
    assert down_notes(gpu1.call("book", cards=[2], host="gpu2", start=now, end=now + HOUR)) == []


def test_cli_a_card_on_a_host_that_is_down_is_refused_in_one_line_exit_3_unless_forced_with_a_note(tmp_path):
    import time

    from tests.conftest import run_board  # this checkout's app (python -m app), as a member runs it

    config = tmp_path / "board.toml"
    config.write_text('[fleet]\nhost = "gpu1"\n')
    env = {"BOARD_CONFIG": str(config), "BOARD_DB": str(tmp_path / "board.db"), "BOARD_SIMULATE": "1",
           "HOME": str(tmp_path), "TZ": "UTC"}
    silent = Clock(time.time() - HOUR)  # gpu2's service last beat an hour ago
    gpu2 = LocalClient.on(Config(db_path=tmp_path / "board.db", fleet=FleetSettings(host="gpu2")),
                          open_source(True, clock=silent, host="gpu2"), BOB, clock=silent)
    try:
        beat(gpu2.service)
    finally:
        gpu2.service.close()
    refused = run_board("book", "--cards", "gpu2:0", "--for", "1h", env=env)
    assert (refused.returncode, refused.stdout) == (3, ""), refused.stderr
    assert refused.stderr.count("\n") == 1 and "host gpu2 is down" in refused.stderr and "--force" in refused.stderr
    forced = run_board("book", "--cards", "gpu2:0", "--for", "1h", "--force", "--json", env=env)
    assert forced.returncode == 0 and json.loads(forced.stdout)["host"] == "gpu2", forced.stderr
    assert forced.stderr.startswith("board: note: host gpu2 is down (no word from its service since "), forced.stderr


def test_the_boards_fleet_event_carries_the_other_hosts_cards_and_since_when_one_is_down(hosts, clock):
    from app.service.box.watch import fleet_event

    gpu1 = hosts("gpu1")
    assert (fleet_event(gpu1.service)["host"], fleet_event(gpu1.service)["hosts"]) == ("gpu1", [])
    gpu2 = hosts("gpu2")
    beat(gpu2.service)
    seen_at = clock()
    (other,) = fleet_event(gpu1.service)["hosts"]
    assert (other["host"], other["down_since"]) == ("gpu2", None)
    assert [c["uuid"] for c in other["snapshot"]["cards"]] == [c.uuid for c in gpu2.service.fleet.latest().cards]
    clock.now += TIMEOUT_S + 1
    (other,) = fleet_event(gpu1.service)["hosts"]
    assert other["down_since"] == seen_at


def test_run_and_serve_start_refuse_another_hosts_cards_in_one_line(hosts, clock):
    gpu1 = hosts("gpu1", ALICE)
    beat(hosts("gpu2", BOB).service)
    start = int(clock())
    booked = gpu1.call("book", cards=[1], host="gpu2", start=start, end=start + HOUR)
    for op, args in (("run", {"booking": booked["id"]}), ("run", {}), ("serve_start", {"booking": booked["id"]})):
        with pytest.raises(BadInput) as refused:
            gpu1.call(op, **args)
        assert str(refused.value) == "those cards are on gpu2: run this on gpu2", op


def test_a_series_on_gpu2_booked_from_gpu1_is_read_extended_and_cancelled_on_gpu2s_cards(hosts, clock):
    gpu1, gpu2 = hosts("gpu1", ALICE), hosts("gpu2", BOB)
    beat(gpu2.service)
    on_gpu2 = [c.uuid for c in gpu2.service.fleet.latest().cards[1:3]]
    made = gpu1.call("series_book", cards=[1, 2], host="gpu2", every="day", start="9:00", until="11:00",
                     to="2026-12-02", **{"from": "2026-11-30"})
    series = made["series"]["id"]
    assert [(b["host"], b["card_uuids"]) for b in made["bookings"]] == [("gpu2", on_gpu2)] * 3
    extended = gpu1.call("series_extend", id=series, to="2026-12-04")
    assert [(b["host"], b["card_uuids"]) for b in extended["bookings"]] == [("gpu2", on_gpu2)] * 2
    got = gpu1.call("series_get", id=series)
    assert {(b["host"], tuple(b["card_uuids"])) for b in got["bookings"]} == {("gpu2", tuple(on_gpu2))}
    # gpu1's cards 1 and 2 stayed free at those times
    assert gpu1.call("book", cards=[1, 2], start=extended["bookings"][-1]["start"],
                     end=extended["bookings"][-1]["end"])["host"] == "gpu1"
    cancelled = gpu1.call("series_cancel", id=series)
    assert [b["host"] for b in cancelled["cancelled"]] == ["gpu2"] * 5


MODELS = "/srv/models"


def test_a_plan_for_another_hosts_booking_or_series_is_one_line_and_only_its_hosts_runner_starts_it(hosts, clock,
                                                                                                     tmp_path):
    """gpu1's pass skips gpu2's due plan and goes on to its own, due at the same time after it.
    Wrong versions: the pass stops at the first plan of another host's, and gpu1's own never starts."""
    from types import SimpleNamespace

    from app.config import LlamaSettings
    from app.service.rules.plans import start_due
    from app.store import plans as plan_rows

    binary = tmp_path / "llama-server"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    llama = LlamaSettings(model_dirs=(MODELS,), server_bin=str(binary))
    gpu1, gpu2 = hosts("gpu1", ALICE, llama=llama), hosts("gpu2", ALICE, llama=llama)
    beat(gpu2.service)
    start = int(clock())
    booked = gpu1.call("book", cards=[1], host="gpu2", start=start, end=start + HOUR)
    series = gpu1.call("series_book", cards=[2], host="gpu2", every="day", start="9:00", until="11:00",
                       to="2026-12-02", **{"from": "2026-11-30"})["series"]["id"]
    for which in ({"booking": booked["id"]}, {"series": series}):
        with pytest.raises(BadInput) as refused:
            gpu1.call("serve_plan", **which, model=f"{MODELS}/qwen.gguf")
        assert str(refused.value) == "those cards are on gpu2: plan this on gpu2", which
    assert plan_rows.listing(gpu1.service.conn) == []
    # planned on gpu2, and due now: gpu1's pass leaves it for gpu2's runner
    plan = gpu2.call("serve_plan", booking=booked["id"], model=f"{MODELS}/qwen.gguf")
    sent, logged = [], []
    gpu1.service.runner = SimpleNamespace(gone=False, send=lambda message: sent.append(message) or True)
    assert start_due(SimpleNamespace(service=gpu1.service, log=logged.append)) == [] and sent == []
    assert [(p.id, b) for p, b in plan_rows.due(gpu1.service.conn, start)] == [(plan["id"], booked["id"])]
    # gpu1's own plan, due at the same start after gpu2's: gpu1's pass starts it
    mine = gpu1.call("book", cards=[0], start=start, end=start + HOUR)["id"]
    own = gpu1.call("serve_plan", booking=mine, model=f"{MODELS}/qwen.gguf", alias="own")["id"]
    [started] = start_due(SimpleNamespace(service=gpu1.service, log=logged.append))
    assert [(m["event"], m["server"]["id"], m["server"]["booking_id"]) for m in sent] == [("start", started, mine)]
    assert [(p.id, b) for p, b in plan_rows.due(gpu1.service.conn, start)] == [(plan["id"], booked["id"])]
    assert own != plan["id"]


def test_each_audit_event_names_the_host_that_vouched_for_the_actor_and_the_chain_holds(hosts, clock):
    from app.store.events import first_broken

    gpu1, gpu2 = hosts("gpu1", ALICE), hosts("gpu2", BOB)
    beat(gpu2.service)
    start = int(clock()) + HOUR
    gpu1.call("book", cards=[0], host="gpu2", start=start, end=start + HOUR)
    with pytest.raises(Conflict):
        gpu2.call("book", cards=[0], start=start, end=start + HOUR)
    with connect(gpu1.service.config.db_path) as conn:
        found = [(actor, ok, json.loads(details)["host"])
                 for actor, ok, details in conn.execute("SELECT actor, ok, details FROM events ORDER BY id")]
        assert found == [("alice", 1, "gpu1"), ("bob", 0, "gpu2")]
        assert first_broken(conn) is None


def test_cards_from_before_the_fleet_are_claimed_by_the_first_agent(tmp_path, clock, hosts):
    conn = connect(tmp_path / "board.db")
    with conn:
        conn.execute("INSERT INTO cards (uuid, idx, name, seen_at) VALUES ('GPU-old', 0, 'old', 1)")
    conn.close()
    gpu1 = hosts("gpu1")
    assert gpu1.service.conn.execute("SELECT host FROM cards WHERE uuid = 'GPU-old'").fetchone()[0] == ""
    beat(gpu1.service)  # the agent's first heartbeat
    assert gpu1.service.conn.execute("SELECT host FROM cards WHERE uuid = 'GPU-old'").fetchone()[0] == "gpu1"


def test_a_claim_on_a_connection_without_the_services_calendar_claims_the_cards(tmp_path, hosts):
    """board migrate's and PostgreSQL's connections keep no calendar. Fails on: the calendar read without a default,
    or marked stale only when there is none."""
    hosts("gpu1").service.conn  # noqa: B018 - the file, made
    conn = connect(tmp_path / "board.db")
    with conn:
        conn.execute("INSERT INTO cards (uuid, idx, name, seen_at) VALUES ('GPU-old', 0, 'old', 1)")
    host_rows.claim_cards(conn, "gpu1")
    assert conn.execute("SELECT host FROM cards WHERE uuid = 'GPU-old'").fetchone()[0] == "gpu1"
    conn.close()


def test_a_beat_writes_this_hosts_cards_under_its_host_and_its_row_read_back_by_name(hosts, clock):
    """Fails on: the cards written without their host (claimed only at the next beat), or with the host in the time's
    place; one() finding no row, another's, or a row for a host that never beat."""
    gpu2 = hosts("gpu2")
    started = gpu2.service.started_at
    clock.now += 30
    beat(gpu2.service)
    conn = gpu2.service.conn
    uuids = [c.uuid for c in gpu2.service.fleet.latest().cards]
    assert [tuple(r) for r in conn.execute(
        f"SELECT host, typeof(seen_at) FROM cards WHERE uuid IN ({', '.join('?' * len(uuids))})", uuids)] == [
        ("gpu2", "integer")] * 8
    beat(hosts("gpu3").service)
    row = host_rows.one(conn, "gpu2")
    assert (row.host, row.seen_at, row.started_at) == ("gpu2", clock(), started)
    assert [c["uuid"] for c in json.loads(row.snapshot)["cards"]] == uuids
    assert host_rows.one(conn, "gpu3").host == "gpu3"
    assert host_rows.one(conn, "gpu9") is None


def test_the_other_hosts_are_every_host_but_this_one_less_a_row_that_does_not_decode(tmp_path, hosts):
    """Fails on: the list ending at this host's own row (gpu1 sorts first) or at a row that does not decode."""
    gpu1 = hosts("gpu1")
    for name in ("gpu1", "gpu2", "gpu3", "gpu4"):
        beat(gpu1.service if name == "gpu1" else hosts(name).service)
    assert [r.host for r in remote_hosts(gpu1.service)] == ["gpu2", "gpu3", "gpu4"]
    with connect(tmp_path / "board.db") as conn:
        conn.execute("UPDATE hosts SET snapshot = '{\"cards\": 7' WHERE host = 'gpu2'")
        conn.execute("UPDATE hosts SET snapshot = '{}' WHERE host = 'gpu3'")
    assert [r.host for r in remote_hosts(gpu1.service)] == ["gpu4"]


def test_an_unknown_host_longer_than_63_characters_is_cut_in_the_refusal(hosts):
    """Fails on: the name quoted whole, or cut at 64."""
    gpu1 = hosts("gpu1")
    with pytest.raises(BadInput) as refused:
        remote_host(gpu1.service, "g" * 64)
    assert str(refused.value) == f"there is no host '{'g' * 62}…' on this board; the hosts are gpu1"
    with pytest.raises(BadInput) as refused:
        remote_host(gpu1.service, "g" * 63)
    assert f"'{'g' * 63}'" in str(refused.value)


class Beats(threading.Event):
    """The agent's `stopping` as the heartbeat sees it: each pause between beats is recorded and returns at once."""

    def __init__(self) -> None:
        super().__init__()
        self.pauses: list = []

    def wait(self, timeout=None) -> bool:
        self.pauses.append(timeout)
        return self.is_set()


def heartbeat(service, steps: list) -> tuple[list[str], Beats]:
    """Run the heartbeat's loop over `steps`, one per beat: each gets the beat's work and does it (or raises as the
    database did). Every beat runs on the heartbeat's own thread (the service opens a connection there, as on the
    agent's database thread); after the last step the agent stops, and its database thread with it."""
    log: list[str] = []
    stopping = Beats()
    script = list(steps)

    def run_db(work):
        if not script:
            stopping.set()
            raise RuntimeError("cannot schedule new futures after shutdown")  # the database thread has stopped
        return script.pop(0)(work)

    thread = start_heartbeat(service, run_db, stopping, log.append)
    assert (thread.name, thread.daemon) == ("board-heartbeat", True)
    thread.join(timeout=60)
    assert not thread.is_alive()
    return log, stopping


def test_the_heartbeat_beats_each_second_and_wakes_the_boards_when_another_host_changed_bookings(hosts, clock):
    """On SQLite the audit chain's tail tells this host's boards of another host's booking. Fails on: no wake, a
    wake at the first beat or at a beat where nothing changed, a pause other than BEAT_S, the tail not read on
    SQLite, the database thread's end after stopping logged, or a heartbeat that never runs or never ends."""
    gpu1, gpu2 = hosts("gpu1", ALICE), hosts("gpu2", BOB)
    start = int(clock()) + HOUR
    gpu1.call("book", cards=[0], start=start, end=start + HOUR)  # the chain has a tail
    versions = gpu1.service.hub.versions
    before = versions.get("bookings", 0)
    seen = []

    def gpu2_books(work):
        seen.append(versions.get("bookings", 0) - before)
        gpu2.call("book", cards=[1], start=start, end=start + HOUR)
        return work()

    def beat_at(now):
        def step(work):
            seen.append(versions.get("bookings", 0) - before)
            clock.now = now
            return work()
        return step

    log, stopping = heartbeat(gpu1.service, [beat_at(clock() + 1), gpu2_books, beat_at(clock() + 2)])
    assert seen == [0, 0, 1] and versions.get("bookings", 0) - before == 1  # once, after gpu2's booking
    assert log == [] and stopping.pauses == [BEAT_S] * 4
    assert host_rows.one(gpu2.service.conn, "gpu1").seen_at == clock()  # the beat was written


def test_the_heartbeat_says_a_failure_each_time_and_an_unreachable_database_once_and_its_return_once(hosts):
    """Fails on: a failed beat not said (or without its error), the outage said at every beat or without its
    message, its end not said or said at every beat, the loop stopping at a failure."""
    from app.store.pg import StoreUnreachable

    gpu1 = hosts("gpu1")

    def fails(error):
        def step(work):
            raise error
        return step

    gone = StoreUnreachable("gpu1: the board database at db.example:5432 did not answer; nothing was changed")
    log, stopping = heartbeat(gpu1.service, [
        fails(RuntimeError("disk I/O error")), fails(gone), fails(gone), fails(RuntimeError("disk I/O error")),
        lambda work: work(), lambda work: work(), fails(gone), lambda work: work()])
    failed = "board agent: heartbeat failed: RuntimeError: disk I/O error"
    outage = ("board agent: gpu1: the board database at db.example:5432 did not answer; this host's reads answer"
              " from the bookings last read, its jobs are enforced from them")
    back = "board agent: the board database answers again"
    assert log == [failed, outage, failed, back, outage, back]
    assert stopping.pauses == [BEAT_S] * 9


@pytest.fixture
def pg_hosts(tmp_path, clock, store):
    """make(name, me) -> a LocalClient for `me` on host `name`'s service; every host on one PostgreSQL database."""
    made: list[LocalClient] = []

    def make(name: str, me: Identity = ALICE) -> LocalClient:
        config = Config(db_path=tmp_path / "board.db", storage_url=store.url,
                         history=HistorySettings(db=str(tmp_path / f"{name}.history.db")),
                         fleet=FleetSettings(host=name, heartbeat_timeout_s=TIMEOUT_S))
        client = LocalClient.on(config, open_source(True, clock=clock, host=name), me, clock=clock)
        made.append(client)
        return client

    yield make, store.url
    for client in made:
        client.service.close()


@postgresql_only
def test_on_postgresql_a_held_write_lock_stops_no_beat(pg_hosts, clock):
    """A host holding the store's write lock (a compromised one) stops no other host's heartbeat. Fails on: the beat
    taking the store's write lock (no longer this host's rows alone): it waits, then fails naming the holder."""
    import psycopg

    from app.store.pg import WRITE_LOCK

    make, url = pg_hosts
    gpu1 = make("gpu1")
    beat(gpu1.service)
    gpu1.service.conn.execute("SET lock_timeout = 2000")  # a mistaken beat fails in 2 s rather than 10
    mallory = psycopg.connect(url, autocommit=True, application_name="board gpu2")
    try:
        mallory.execute("SELECT pg_advisory_lock(%s)", (WRITE_LOCK,))
        clock.now += 1
        beat(gpu1.service)
        assert mallory.execute("SELECT seen_at FROM hosts WHERE host = 'gpu1'").fetchone()[0] == clock()
    finally:
        mallory.close()


@postgresql_only
def test_on_postgresql_the_heartbeat_leaves_waking_the_boards_to_the_change_feed(pg_hosts, clock):
    """On PostgreSQL the change feed's NOTIFY wakes this host's boards at another host's booking: the heartbeat does
    not wake them a second time. Fails on: the audit chain's tail read (and followed) on PostgreSQL too."""
    make, _ = pg_hosts
    gpu1, gpu2 = make("gpu1", ALICE), make("gpu2", BOB)
    start = int(clock()) + HOUR
    gpu1.call("book", cards=[0], start=start, end=start + HOUR)
    before = gpu1.service.hub.versions.get("bookings", 0)

    def gpu2_books(work):
        gpu2.call("book", cards=[1], start=start, end=start + HOUR)
        return work()

    log, _ = heartbeat(gpu1.service, [lambda work: work(), gpu2_books, lambda work: work()])
    assert log == [] and gpu1.service.hub.versions.get("bookings", 0) == before


def test_a_config_names_its_host(tmp_path):
    path = tmp_path / "board.toml"
    path.write_text('[fleet]\nhost = "gpu2"\nheartbeat_timeout_s = 10\n')
    config = load_config(environ={"BOARD_CONFIG": str(path)})
    assert (config.fleet_host, config.fleet.heartbeat_timeout_s) == ("gpu2", 10)
    assert Config().fleet_host and "." not in Config().fleet_host  # the short hostname by default
    path.write_text('[fleet]\nhost = "gpu 2:1"\n')
    with pytest.raises(Exception, match=r"\[fleet\] host must be a short host name"):
        load_config(environ={"BOARD_CONFIG": str(path)})


# -- real agents, one per host, on one store -------------------------------------------------------------------

RACERS = 16


class OneStore:
    """Real agents (tests/agent_process.py, as the unit runs them), one per host, all on one store: the first agent's
    SQLite file, or one PostgreSQL database on the throwaway cluster (`store`'s params: each test runs on both)."""

    def __init__(self, store, make_agent) -> None:
        self.url = getattr(store, "url", None)  # None: SQLite (tmp_path's file is out of user board's reach)
        self._make = make_agent
        self.agents: dict[str, object] = {}

    def start(self, name: str):
        first = next(iter(self.agents.values()), None)
        agent = self._make(sections={"fleet": {"host": name, "heartbeat_timeout_s": 3}, "history": {"enabled": False}},
                           storage_url=self.url, shared_db=None if self.url or first is None else first.db)
        self.agents[name] = agent
        return agent

    def env(self, name: str) -> dict:
        """The CLI's environment for a member on host `name`."""
        return {"BOARD_CONFIG": str(self.agents[name].config)}

    def connect(self):
        """The store itself, as a service opens it (for the audit chain)."""
        from app.config import PostgresStore

        return connect(PostgresStore(self.url, host="test") if self.url else next(iter(self.agents.values())).db)


@pytest.fixture
def one_store(store, make_agent) -> OneStore:
    return OneStore(store, make_agent)


def _wait_for(condition, what: str, timeout: float = 60.0):
    """Until condition() answers something true (returned); a failure naming `what` after a generous deadline."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found := condition():
            return found
        time.sleep(0.1)
    raise AssertionError(f"{what} did not happen within {timeout:g} s")


def _status(env: dict) -> dict:
    from tests.service.support import board_cli

    rc, out, err = board_cli("status", "--json", env=env)
    assert rc == 0, err
    return json.loads(out)


def _sees(env: dict, hosts: set[str]):
    """The status from `env`'s host once it lists every host in `hosts`, all up; else None."""
    status = _status(env)
    up = {c["host"] for c in status["cards"] if not c.get("host_down")}
    return up == hosts and status


NEVER_SHOWN = ("Traceback", "40P01", "23P01", "deadlock", "exclusion constraint", "psycopg")


def test_a_member_on_gpu1_books_gpu2s_card_sixteen_race_from_both_hosts_and_a_killed_host_comes_back(one_store,
                                                                                                      tmp_path):
    import subprocess
    import sys

    from app.store.events import first_broken
    from tests.service.support import REPO, board_cli

    one_store.start("gpu1")
    gpu2 = one_store.start("gpu2")
    env1, env2 = one_store.env("gpu1"), one_store.env("gpu2")
    status = _wait_for(lambda: _sees(env1, {"gpu1", "gpu2"}), "gpu2's first heartbeat reaching gpu1")
    _wait_for(lambda: _sees(env2, {"gpu1", "gpu2"}), "gpu1's first heartbeat reaching gpu2")
    assert [(c["host"], c["index"]) for c in status["cards"]] == [("gpu1", i) for i in range(8)] + [
        ("gpu2", i) for i in range(8)]
    uuid = {(c["host"], c["index"]): c["uuid"] for c in status["cards"]}

    # a member on gpu1 books gpu2's card 1; a member on gpu2 is refused it, in one line
    rc, out, err = board_cli("book", "--cards", "gpu2:1", "--start", "+1h", "--for", "2h", "--json", env=env1)
    assert rc == 0, err
    held = json.loads(out)
    assert (held["host"], held["cards"], held["card_uuids"]) == ("gpu2", [1], [uuid["gpu2", 1]])
    rc, out, err = board_cli("book", "--cards", "1", "--start", "+1h", "--for", "2h", env=env2)
    assert (rc, out, err.count("\n")) == (3, "", 1) and err.startswith("board: ") and "booked by" in err, err
    rc, out, err = board_cli("book", "--cards", "1", "--start", "+1h", "--for", "2h", "--json", env=env1)
    assert rc == 0 and json.loads(out)["host"] == "gpu1", err  # gpu1's own card 1 is another card

    # 16 bookers, 8 on each host, for gpu2's card 0 at one time: gpu1's name it gpu2:0, gpu2's say 0
    go = tmp_path / "go"
    script = (
        "import os, sys, time\n"
        "from app.cli import main\n"
        f"while not os.path.exists({str(go)!r}): time.sleep(0.001)\n"
        "sys.exit(main(['book', '--cards', sys.argv[1], '--start', '+1h', '--for', '2h', '--note', sys.argv[2]]))\n"
    )
    racers = [
        subprocess.Popen([sys.executable, "-c", script, "gpu2:0" if n % 2 else "0", f"racer {n}"], cwd=REPO,
                         env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "TZ": "UTC", **(env1 if n % 2 else env2)},
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for n in range(RACERS)
    ]
    go.touch()
    results = [(p.wait(timeout=120), p.stdout.read(), p.stderr.read()) for p in racers]
    assert sorted(code for code, _, _ in results) == [0] + [3] * (RACERS - 1), results
    for code, out, err in results:
        assert not any(word in out + err for word in NEVER_SHOWN), (out, err)
        if code == 3:
            assert err.count("\n") == 1 and err.startswith("board: ") and "booked by" in err, err
    rc, out, err = board_cli("list", "--json", env=env1)
    assert rc == 0, err
    (booking,) = [b for b in json.loads(out)["bookings"] if (b["host"], b["cards"]) == ("gpu2", [0])]
    assert booking["card_uuids"] == [uuid["gpu2", 0]]
    # one audit chain, unbroken; each racer's event names the host whose service vouched for it
    with one_store.connect() as conn:
        events = [(ok, json.loads(details)) for ok, details in conn.execute("SELECT ok, details FROM events ORDER BY id")]
        raced = [(ok, found["host"]) for ok, found in events if "racer " in json.dumps(found)]
        assert sorted(host for _, host in raced) == ["gpu1"] * 8 + ["gpu2"] * 8 and sum(ok for ok, _ in raced) == 1
        assert all(found.get("host") in ("gpu1", "gpu2") for _, found in events), events
        assert first_broken(conn) is None

    # gpu2's service dies (kill -9): after the timeout gpu1 shows its cards HOST DOWN, since its last heartbeat
    gpu2.kill9()

    def down_on_gpu1():
        return [c for c in _status(env1)["cards"] if c.get("host_down")]

    down = _wait_for(down_on_gpu1, "gpu2's cards showing HOST DOWN on gpu1")
    assert [c["host"] for c in down] == ["gpu2"] * 8 and all(c["down_since"] for c in down)
    rc, out, err = board_cli("status", env=env1)
    assert rc == 0 and out.count("HOST DOWN (since ") == 8, out + err
    assert next(c for c in down if c["index"] == 0)["next_booking"]["id"] == booking["id"]  # its bookings stay
    assert next(c for c in down if c["index"] == 1)["next_booking"]["id"] == held["id"]
    # it comes back: its cards come back, on gpu1 and on its own socket
    gpu2.start()
    status = _wait_for(lambda: _sees(env1, {"gpu1", "gpu2"}), "gpu2's cards coming back on gpu1")
    assert [c["uuid"] for c in status["cards"] if c["host"] == "gpu2"] == [uuid["gpu2", i] for i in range(8)]
    assert [c["next_booking"]["id"] for c in status["cards"][8:10]] == [booking["id"], held["id"]]
    _wait_for(lambda: _sees(env2, {"gpu1", "gpu2"}), "gpu2's restarted service seeing gpu1")


def test_a_board_behind_the_socket_hears_a_new_host_and_its_going_down_by_the_fleet_event_alone(one_store):
    """Hosts' beats change no booking: the `fleet` event carries them, so an open board sees a host appear and
    go down without a booking change."""
    import queue
    import threading

    from app.client.socket import SocketClient

    gpu1 = one_store.start("gpu1")
    board = SocketClient(str(gpu1.socket))
    events: queue.Queue = queue.Queue()

    def follow() -> None:
        for event in board.subscribe(("fleet",)):
            events.put(event)

    threading.Thread(target=follow, daemon=True).start()

    def next_hosts(condition, what: str) -> list:
        def found():
            while True:
                try:
                    event = events.get(timeout=0.1)
                except queue.Empty:
                    return None
                if "snapshot" in event and condition(hosts := event.get("hosts", [])):
                    return hosts or True

        return _wait_for(found, what)

    next_hosts(lambda hosts: hosts == [], "gpu1's board seeing gpu1 alone")
    gpu2 = one_store.start("gpu2")
    (up,) = next_hosts(lambda hosts: [h["host"] for h in hosts] == ["gpu2"], "gpu2 appearing on gpu1's board")
    assert up["down_since"] is None and len(up["snapshot"]["cards"]) == 8
    gpu2.kill9()
    (down,) = next_hosts(lambda hosts: hosts and hosts[0]["down_since"] is not None, "gpu2 going down on the board")
    assert down["host"] == "gpu2"
    board.close()


def test_cli_cards_on_two_hosts_or_an_unknown_host_are_one_line_exit_2_writing_nothing(tmp_path):
    from tests.service.support import board_cli

    config = tmp_path / "board.toml"
    config.write_text('[fleet]\nhost = "gpu1"\n')
    env = {"BOARD_CONFIG": str(config), "BOARD_DB": str(tmp_path / "board.db"), "BOARD_SIMULATE": "1",
           "HOME": str(tmp_path)}
    for cards, said in (("gpu2:0,gpu1:1", "names cards on more than one host"),
                        ("gpu9:0", "there is no host 'gpu9' on this board; the hosts are gpu1")):
        rc, out, err = board_cli("book", "--cards", cards, "--for", "1h", env=env)
        assert (rc, out, err.count("\n")) == (2, "", 1) and said in err, err
    rc, out, err = board_cli("book", "--cards", "gpu1:3", "--for", "1h", "--json", env=env)  # this host, by name
    assert rc == 0 and json.loads(out)["host"] == "gpu1", err
    with connect(tmp_path / "board.db") as conn:
        assert conn.execute("SELECT count(*) FROM bookings").fetchone()[0] == 1


def test_cli_serve_plan_for_another_hosts_booking_is_one_line_exit_2_planning_nothing(tmp_path):
    from tests.fit import shapes
    from tests.service.support import board_cli

    models = tmp_path / "models"
    models.mkdir()
    model = shapes.write_model(models / "gqa8.gguf", "gqa8")
    config = tmp_path / "board.toml"
    config.write_text(f'[fleet]\nhost = "gpu1"\n[llama]\nmodel_dirs = ["{models}"]\n')
    env = {"BOARD_CONFIG": str(config), "BOARD_DB": str(tmp_path / "board.db"), "BOARD_SIMULATE": "1",
           "HOME": str(tmp_path)}
    # gpu2's service on the same database file: its heartbeat makes its cards known on gpu1
    gpu2 = LocalClient.on(Config(db_path=tmp_path / "board.db", fleet=FleetSettings(host="gpu2"),
                                  history=HistorySettings(db=str(tmp_path / "gpu2.history.db"))),
                          open_source(True, host="gpu2"), BOB)
    beat(gpu2.service)
    gpu2.service.close()
    rc, out, err = board_cli("book", "--cards", "gpu2:2", "--for", "1h", "--json", env=env)
    assert rc == 0, err
    booking = json.loads(out)["id"]
    rc, out, err = board_cli("serve", "plan", str(booking), "--model", str(model), env=env)
    assert (rc, out, err) == (2, "", "board: those cards are on gpu2: plan this on gpu2\n")
    with connect(tmp_path / "board.db") as conn:
        assert conn.execute("SELECT count(*) FROM server_plans").fetchone()[0] == 0


def test_a_booking_made_on_gpu1_reaches_a_subscriber_on_gpu2_without_waiting_for_a_poll(one_store):
    """An open board on gpu2 (a `subscribe` on its socket, as the TUI holds one) hears of a booking gpu1's service
    made: on PostgreSQL by the NOTIFY gpu2's service LISTENs for, on a shared SQLite file by the audit chain's tail
    its heartbeat reads. The only bound is a generous liveness deadline."""
    import queue
    import threading

    from tests.service.support import board_cli

    one_store.start("gpu1")
    gpu2 = one_store.start("gpu2")
    env1, env2 = one_store.env("gpu1"), one_store.env("gpu2")
    _wait_for(lambda: _sees(env1, {"gpu1", "gpu2"}), "gpu2's first heartbeat reaching gpu1")
    _wait_for(lambda: _sees(env2, {"gpu1", "gpu2"}), "gpu1's first heartbeat reaching gpu2")
    board = gpu2.client()
    # The subscription is in place once the service has replied to it (the first line); events follow.
    sock, reader, _ = board.stream("subscribe", {"kinds": ["bookings"]})
    events: queue.Queue = queue.Queue()

    def read():
        while line := reader.readline():
            events.put(json.loads(line))

    threading.Thread(target=read, daemon=True).start()
    while not events.empty():  # what the service said before the booking
        events.get()
    rc, out, err = board_cli("book", "--cards", "gpu2:5", "--start", "+1h", "--for", "1h", "--json", env=env1)
    assert rc == 0, err
    made = json.loads(out)["id"]
    event = events.get(timeout=5)  # liveness only: a NOTIFY (or the heartbeat's tail) wakes it within a second
    assert event["event"] == "bookings" and "version" in event and "error" not in event, event
    assert made in [b["id"] for b in board.call("list")["bookings"]]
    sock.close()
    board.close()


def test_status_with_24_cards_on_3_hosts_lists_each_card_with_its_host(one_store):
    for name in ("gpu1", "gpu2", "gpu3"):
        one_store.start(name)
    hosts = {"gpu1", "gpu2", "gpu3"}
    for name in sorted(hosts):
        status = _wait_for(lambda: _sees(one_store.env(name), hosts), f"{name} seeing all three hosts")
        order = [name, *sorted(hosts - {name})]  # this host's cards first, the others' after
        assert [(c["host"], c["index"]) for c in status["cards"]] == [(host, i) for host in order for i in range(8)]
        assert len({c["uuid"] for c in status["cards"]}) == 24
        assert sorted(h["host"] for h in status["hosts"]) == sorted(hosts), status["hosts"]


# -- the database stopped and started under load ---------------------------------------------------------------

UNREACHABLE = re.compile(r"board: the board database is unreachable \((gpu[12]) → .+\); nothing was changed\n")


@pytest.fixture
def own_cluster():
    """A throwaway PostgreSQL cluster of the test's own (tests/postgres.py): this test stops and starts it."""
    from tests.postgres import Cluster, missing_reason

    if reason := missing_reason():
        pytest.skip(reason)
    cluster = Cluster()
    yield cluster
    cluster.stop()


@pytest.mark.postgresql
def test_the_database_stopped_and_started_under_load_loses_nothing_acknowledged_and_refuses_in_one_line(
        own_cluster, make_agent):
    """Bookers on both hosts keep booking slots of their own while the database stops and starts: each booking either
    succeeds (and is there afterwards) or is refused in the one line, exit 1; the agents serve again by themselves."""
    import threading

    from tests.service.support import board_cli

    url = own_cluster.fresh_database()
    agents = {name: make_agent(sections={"fleet": {"host": name, "heartbeat_timeout_s": 3},
                                         "history": {"enabled": False}}, storage_url=url) for name in ("gpu1", "gpu2")}
    env = {name: {"BOARD_CONFIG": str(agent.config)} for name, agent in agents.items()}
    _wait_for(lambda: _sees(env["gpu1"], {"gpu1", "gpu2"}), "gpu2's first heartbeat reaching gpu1")
    _wait_for(lambda: _sees(env["gpu2"], {"gpu1", "gpu2"}), "gpu1's first heartbeat reaching gpu2")

    phase = ["before"]  # before, (stopping), paused, (starting), resumed: when each booking was asked
    results: list[tuple[str, str, int, str, str]] = []  # (host, phase, rc, stdout, stderr)
    lock = threading.Lock()
    stop = threading.Event()

    def booker(host: str, card: int) -> None:
        slot = 0
        while not stop.is_set():
            slot += 1  # every try its own slot on its own card: a refusal is never a conflict
            asked = phase[0]
            rc, out, err = board_cli("book", "--cards", str(card), "--start", f"+{2 * slot}h", "--for", "1h",
                                     "--json", env=env[host])
            with lock:
                results.append((host, asked if asked == phase[0] else "during a change", rc, out, err))

    bookers = [threading.Thread(target=booker, args=(host, card), daemon=True)
               for host in ("gpu1", "gpu2") for card in (0, 1)]
    for thread in bookers:
        thread.start()

    def each_host(when: str, ok: bool):
        with lock:
            return {h for h, asked, rc, _, _ in results if asked == when and (rc == 0) == ok} == {"gpu1", "gpu2"}

    try:
        _wait_for(lambda: each_host("before", True), "a booking on each host before the database stops")
        phase[0] = "stopping"  # pg_ctl returns once the server is gone: a command meanwhile is in neither phase
        own_cluster.pause()
        phase[0] = "paused"
        _wait_for(lambda: each_host("paused", False), "a refusal on each host while the database is stopped")
        rc, out, err = board_cli("status", "--json", env=env["gpu1"])
        status_while_down = (rc, out[:200], err)
    finally:
        phase[0] = "starting"
        own_cluster.resume()
    phase[0] = "resumed"
    try:
        # reconnects with backoff (at most 30 s between tries): both agents serve again, with no restart
        _wait_for(lambda: each_host("resumed", True), "a booking on each host after the database came back", 120)
    finally:
        stop.set()
        for thread in bookers:
            thread.join(120)
    print(f"board status --json on gpu1 while the database was stopped: {status_while_down}")
    assert not status_while_down[2].count("Traceback"), status_while_down
    assert all(agent.proc.poll() is None and agent.starts == 1 for agent in agents.values())

    acknowledged = {}
    for host, asked, rc, out, err in results:
        assert not any(word in out + err for word in NEVER_SHOWN), (host, asked, rc, out, err)
        if rc == 0:
            booking = json.loads(out)
            acknowledged[booking["id"]] = (host, booking["cards"], booking["start"])
        else:
            assert rc == 1 and out == "" and UNREACHABLE.fullmatch(err) and UNREACHABLE.match(err)[1] == host, (
                host, asked, rc, out, err)
            assert asked != "before", (host, asked, err)
    rc, out, err = board_cli("list", "--all", "--json", env=env["gpu2"])
    assert rc == 0, err
    listed = {b["id"]: (b["host"], b["cards"], b["start"]) for b in json.loads(out)["bookings"]}
    assert {i: listed.get(i) for i in acknowledged} == acknowledged  # nothing acknowledged is lost
    assert len(listed) == len(acknowledged)  # and nothing refused was written
    refused = sum(rc != 0 for _, _, rc, _, _ in results)
    print(f"{len(acknowledged)} bookings acknowledged, {refused} refused in one line, {len(listed)} listed")
