"""Alerts end to end: the engine's state machine on a real database, pushes caught by a real HTTP receiver,
quiet hours, per-user privacy, the rules fed by the simulated fleet and the history, and `board alerts`."""

from __future__ import annotations

import json
import os

import pytest

from app.alerts.engine import Engine, gather, listing
from app.alerts.rules import Card, Ending, Inputs, evaluate
from app.config import AlertSettings, Config, NotifySettings, NotifyTarget, Policy, PostgresStore
from app.core.identity import Identity
from app.gpu.fleet import Fleet
from app.gpu.simulated import SimulatedSource, parse_scenario
from app.history.store import Sample
from app.service import Service
from app.service.box.alerts import alerts_pass
from app.service.box.notify import deliverer
from tests.conftest import FROZEN_NOW, run_board, sqlite_only
from tests.integration.test_notify import Clock, Receiver

ALICE, BOB = Identity("alice", 1001, False), Identity("bob", 1002, False)
T0 = 1_795_996_800  # 2026-11-30 00:00 UTC
HOT = Inputs(T0, cards=(Card(7, "GPU-7", "FREE", temp_c=93),))
COOL = Inputs(T0, cards=(Card(7, "GPU-7", "FREE", temp_c=60),))


@pytest.fixture
def receiver():
    made = Receiver()
    yield made
    made.close()


@pytest.fixture(autouse=True)
def _on_each_store(store, monkeypatch):
    """Every test here on both stores: BOARD_DB_URL names the PostgreSQL one, for make_service and the CLI alike."""
    if isinstance(store, PostgresStore):
        monkeypatch.setenv("BOARD_DB_URL", store.url)


def make_service(tmp_path, clock, receiver=None, scenario=None, **alerts) -> Service:
    """The service on tmp_path's board.db, or BOARD_DB_URL's database (a second one on the same store is the same
    service restarted). A finding fires on the pass that sees it unless `fire_after_s` says otherwise (TestDebounce)."""
    targets = (NotifyTarget("hook", "webhook", receiver.url("ok")),) if receiver else ()
    config = Config(db_path=tmp_path / "board.db", storage_url=os.environ.get("BOARD_DB_URL"),
                    notify=NotifySettings(targets=targets), policy=Policy(timezone="UTC"),
                    alerts=AlertSettings(**{"fire_after_s": 0, **alerts}))
    source = SimulatedSource(parse_scenario(scenario), clock=clock) if scenario is not None else \
        SimulatedSource(clock=clock)
    return Service(config, Fleet(source, config.refresh_seconds), clock=clock)


def gather_now(service, now: float) -> Inputs:
    """What the rules would read at `now` from this service's database, fleet and history."""
    return gather(service.conn, service.fleet.latest(), service.history, service.config, now)


def pushed(service, receiver) -> list[tuple[str, str]]:
    """Deliver the outbox now; every (kind, title) the receiver has had so far."""
    deliverer(service, lambda fn: fn(), print).pass_once()
    return [(b["kind"], b["title"]) for b in receiver.bodies("ok")]


def at(clock, hhmm: str, day: int = 0) -> None:
    h, m = map(int, hhmm.split(":"))
    clock.now = T0 + day * 86400 + h * 3600 + m * 60


def states(service) -> list[tuple[str, str, str]]:
    return [(r["rule"], r["subject"], r["state"]) for r in reversed(listing(service.conn, ALICE, all=True))]


class TestStateMachine:
    def test_fire_repeat_suppressed_resolve_fire_again(self, tmp_path, receiver):
        clock = Clock(T0 + 12 * 3600)
        service, engine = make_service(tmp_path, clock, receiver, repeat_min=60), Engine()
        fired = alerts_pass(service, engine, HOT)["fired"]
        assert len(fired) == 1 and states(service) == [("hot", "GPU-7", "firing")]
        assert pushed(service, receiver) == [("alert.firing", "GPU 7 at 93 °C (at or over 92 °C)")]
        clock.now += 30
        assert alerts_pass(service, engine, HOT) == {"fired": [], "resolved": [], "pushed": []}  # still firing: no repeat
        assert service.conn.execute("SELECT last_seen FROM alerts").fetchone()[0] == clock.now
        clock.now += 30
        assert alerts_pass(service, engine, COOL)["resolved"] == fired
        assert pushed(service, receiver)[1:] == [("alert.resolved", "resolved: GPU 7 at 93 °C (at or over 92 °C)")]
        clock.now += 600  # fires again within repeat_min: recorded, not pushed, nor is its resolve
        assert alerts_pass(service, engine, HOT)["pushed"] == []
        clock.now += 60
        assert alerts_pass(service, engine, COOL)["pushed"] == []
        assert len(pushed(service, receiver)) == 2
        clock.now += 3600  # past repeat_min since the last push: pushed again
        again = alerts_pass(service, engine, HOT)
        assert again["pushed"] == again["fired"] and len(pushed(service, receiver)) == 3
        assert states(service) == [("hot", "GPU-7", "resolved")] * 2 + [("hot", "GPU-7", "firing")]

    def test_quiet_hours_hold_pushes_until_they_end(self, tmp_path, receiver):
        clock = Clock()
        service, engine = make_service(tmp_path, clock, receiver, quiet="22:00-08:00"), Engine()
        vram = Card(1, "GPU-1", "FREE", vram_used_mib=950, vram_total_mib=1000)
        lost = Card(3, "GPU-3", "LOST")
        at(clock, "21:00")
        alerts_pass(service, engine, Inputs(clock.now, cards=(lost,)))  # pushed before quiet, resolved during it
        assert [k for k, _ in pushed(service, receiver)] == ["alert.firing"]
        at(clock, "23:00")
        quiet = alerts_pass(service, engine, Inputs(clock.now, cards=(vram, Card(7, "GPU-7", "FREE", temp_c=95))))
        assert len(quiet["fired"]) == 2 and len(quiet["resolved"]) == 1 and quiet["pushed"] == []
        at(clock, "02:00", day=1)
        alerts_pass(service, engine, Inputs(clock.now, cards=(vram,)))  # the hot card cooled within quiet hours
        assert len(pushed(service, receiver)) == 1  # nothing pushed in quiet hours
        assert sorted(states(service)) == [("hot", "GPU-7", "resolved"), ("lost", "GPU-3", "resolved"),
                                           ("vram", "GPU-1", "firing")]  # but recorded
        at(clock, "08:00", day=1)
        alerts_pass(service, engine, Inputs(clock.now, cards=(vram,)))
        assert pushed(service, receiver)[1:] == [
            ("alert.firing", "GPU 1 VRAM at 95 % (at or over 90 %)"),
            ("alert.resolved", "resolved: GPU 3 is LOST: the driver no longer sees it")]


class TestDebounce:
    SQUATTED = Inputs(T0, cards=(Card(5, "GPU-5", "SQUATTED", squatters=("bob",)),))
    IN_USE = Inputs(T0, cards=(Card(5, "GPU-5", "IN USE", holder="bob"),))

    def test_a_finding_fires_only_once_it_has_held_fire_after_s(self, tmp_path, receiver):
        """bob releases card 5 and books it again at once: his processes squat it between the two, for a pass."""
        clock = Clock(T0 + 12 * 3600)
        service, engine = make_service(tmp_path, clock, receiver, fire_after_s=60), Engine()
        assert alerts_pass(service, engine, self.SQUATTED)["fired"] == []
        clock.now += 5
        assert alerts_pass(service, engine, self.IN_USE) == {"fired": [], "resolved": [], "pushed": []}
        assert listing(service.conn, ALICE, all=True) == [] and pushed(service, receiver) == []
        clock.now += 5  # squatted again, and this time it stays: the count starts again
        for step in (0, 30, 29):
            clock.now += step
            assert alerts_pass(service, engine, self.SQUATTED)["fired"] == []
        clock.now += 1  # 60 s since it was first seen this time
        fired = alerts_pass(service, engine, self.SQUATTED)
        assert fired["fired"] == fired["pushed"] and len(fired["fired"]) == 1
        assert pushed(service, receiver) == [("alert.firing", "GPU 5 squatted by bob (not booked)")]

    def test_the_default_is_a_minute_and_the_config_sets_it(self, tmp_path):
        from app.config import load_config

        assert AlertSettings().fire_after_s == 60
        path = tmp_path / "board.toml"
        path.write_text("[alerts]\nfire_after_s = 0\n")
        assert load_config(environ={"BOARD_CONFIG": str(path)}).alerts.fire_after_s == 0


class TestRestart:
    """The service stops and starts between passes (a new Service and Engine on the same file): nothing that quiet
    hours held back is lost, and nothing is pushed twice."""

    def restarted(self, tmp_path, clock, receiver, **alerts):
        return make_service(tmp_path, clock, receiver, **alerts), Engine()

    def test_a_fire_held_by_quiet_hours_is_pushed_when_they_end(self, tmp_path, receiver):
        clock = Clock()
        service, engine = make_service(tmp_path, clock, receiver, quiet="22:00-08:00"), Engine()
        at(clock, "23:00")
        assert alerts_pass(service, engine, Inputs(clock.now, cards=HOT.cards))["pushed"] == []
        service.close()
        service, engine = self.restarted(tmp_path, clock, receiver, quiet="22:00-08:00")
        at(clock, "08:00", day=1)
        alerts_pass(service, engine, Inputs(clock.now, cards=HOT.cards))
        assert pushed(service, receiver) == [("alert.firing", "GPU 7 at 93 °C (at or over 92 °C)")]
        clock.now += 60
        assert alerts_pass(service, engine, Inputs(clock.now, cards=HOT.cards))["pushed"] == []  # once

    def test_a_resolve_held_by_quiet_hours_is_pushed_when_they_end(self, tmp_path, receiver):
        clock = Clock()
        service, engine = make_service(tmp_path, clock, receiver, quiet="22:00-08:00"), Engine()
        at(clock, "21:00")
        alerts_pass(service, engine, Inputs(clock.now, cards=HOT.cards))
        at(clock, "23:00")
        alerts_pass(service, engine, Inputs(clock.now, cards=COOL.cards))  # resolved in quiet hours: held
        service.close()
        service, engine = self.restarted(tmp_path, clock, receiver, quiet="22:00-08:00")
        at(clock, "08:00", day=1)
        alerts_pass(service, engine, Inputs(clock.now, cards=COOL.cards))
        assert pushed(service, receiver) == [("alert.firing", "GPU 7 at 93 °C (at or over 92 °C)"),
                                             ("alert.resolved", "resolved: GPU 7 at 93 °C (at or over 92 °C)")]

    def test_a_repeat_stays_unpushed_and_the_repeat_window_holds_across_a_restart(self, tmp_path, receiver):
        clock = Clock(T0 + 12 * 3600)
        service, engine = make_service(tmp_path, clock, receiver, repeat_min=60), Engine()
        alerts_pass(service, engine, HOT)  # pushed
        clock.now += 60
        alerts_pass(service, engine, COOL)  # its resolve pushed
        service.close()
        service, engine = self.restarted(tmp_path, clock, receiver, repeat_min=60)
        clock.now += 600  # fires again within repeat_min of the last push: recorded, not pushed
        assert alerts_pass(service, engine, HOT)["pushed"] == []
        service.close()
        service, engine = self.restarted(tmp_path, clock, receiver, repeat_min=60)
        clock.now += 60
        assert alerts_pass(service, engine, COOL)["pushed"] == []  # nor its resolve, after another restart
        assert [kind for kind, _ in pushed(service, receiver)] == ["alert.firing", "alert.resolved"]

    def test_a_firing_alert_is_not_pushed_again_after_a_restart(self, tmp_path, receiver):
        clock = Clock(T0 + 12 * 3600)
        service, engine = make_service(tmp_path, clock, receiver), Engine()
        alerts_pass(service, engine, HOT)
        service.close()
        service, engine = self.restarted(tmp_path, clock, receiver)
        clock.now += 60
        assert alerts_pass(service, engine, HOT) == {"fired": [], "resolved": [], "pushed": []}
        clock.now += 60
        assert alerts_pass(service, engine, COOL)["pushed"] != []  # it was pushed: so is its resolve
        assert [kind for kind, _ in pushed(service, receiver)] == ["alert.firing", "alert.resolved"]


    @sqlite_only  # a v7 SQLite file, migrated
    def test_a_v7_database_knows_which_alerts_were_pushed_from_the_outbox(self, tmp_path, receiver):
        import sqlite3

        from app.store import schema

        raw = sqlite3.connect(tmp_path / "board.db", isolation_level=None)
        for script in schema.MIGRATIONS[:7]:  # the database as board v7 left it: one alert pushed, one not
            for statement in schema._statements(script):
                raw.execute(statement)
        raw.execute("PRAGMA user_version = 7")
        for id, subject in ((1, "GPU-7"), (2, "GPU-6")):
            raw.execute("INSERT INTO alerts (id, rule, subject, state, fired_at, last_seen, message)"
                        " VALUES (?, 'hot', ?, 'firing', ?, ?, ?)", (id, subject, T0, T0, f"{subject} hot"))
        raw.execute("INSERT INTO outbox (target, kind, key, message, created_at, max_attempts, next_at, state)"
                    " VALUES ('hook', 'alert.firing', 'alert:1:firing', '{}', ?, 8, ?, 'sent')", (T0, T0))
        raw.close()
        clock = Clock(T0 + 60)
        service, engine = make_service(tmp_path, clock, receiver), Engine()
        assert service.conn.execute("SELECT id, pushed_at, held FROM alerts ORDER BY id").fetchall() == [
            (1, T0, None), (2, None, None)]
        alerts_pass(service, engine, Inputs(clock.now))  # both cooled: only the pushed one's resolve goes out
        assert pushed(service, receiver) == [("alert.resolved", "resolved: GPU-7 hot")]


class TestPrivacy:
    def test_a_booking_ending_soon_is_for_its_holder_alone(self, tmp_path, receiver):
        clock = Clock(T0 + 12 * 3600)
        service, engine = make_service(tmp_path, clock, receiver), Engine()
        mine, theirs = service.hub.subscribe(["notice"], ALICE.uid), service.hub.subscribe(["notice"], BOB.uid)
        alerts_pass(service, engine, Inputs(clock.now, ending=(Ending(12, ALICE.uid, clock.now + 300),)))
        assert [a["message"] for a in listing(service.conn, ALICE)] == ["your booking 12 ends in 5 min"]
        assert listing(service.conn, BOB) == [] and listing(service.conn, BOB, all=True) == []
        assert [e["message"] for e in mine.take(timeout=0)] == ["your booking 12 ends in 5 min"]
        assert theirs.take(timeout=0) == []
        assert pushed(service, receiver) == []  # not the team's chat


class TestFromTheFleet:
    def test_the_simulated_fleet_drives_lost_hot_vram_and_squatters(self, tmp_path):
        clock = Clock()
        scenario = {"cards": {"count": 4}, "faults": {"lost": [3], "hot": [2]},
                    "processes": [{"card": 1, "pid": 41001, "used_mib": 31000, "user": "alice"}]}
        service = make_service(tmp_path, clock, scenario=scenario, hot_c=91)  # a hot simulated card runs 91-93 °C
        for ts in range(4):  # four OOM or Xid faults this month, and one throttle (not counted)
            service.conn.execute("INSERT INTO faults (ts, kind, code) VALUES (?, ?, 79)", (FROZEN_NOW - ts, "xid"))
        service.conn.execute("INSERT INTO faults (ts, kind) VALUES (?, 'throttle')", (FROZEN_NOW,))
        found = {(f.rule, f.subject[-1]) for f in evaluate(gather_now(service, clock.now), service.config.alerts)}
        assert found == {("lost", "3"), ("hot", "2"), ("vram", "1"), ("squatter", "1"), ("faults", "t")}

    @pytest.mark.parametrize("xids, throttles, fired", [(3, 1, False), (3, 0, False), (4, 0, True)])
    def test_more_than_three_xids_a_month_fire_and_a_throttle_is_not_a_fault(self, tmp_path, xids, throttles, fired):
        """faults_month = 3: three Xids and a throttle stay at three faults (throttling slows a card, it is no
        fault); a fourth Xid is one more than three."""
        clock = Clock()
        service = make_service(tmp_path, clock, scenario={"cards": {"count": 2}})
        for ts in range(xids):
            service.conn.execute("INSERT INTO faults (ts, kind, code) VALUES (?, 'xid', 79)", (FROZEN_NOW - ts,))
        for ts in range(throttles):
            service.conn.execute("INSERT INTO faults (ts, kind) VALUES (?, 'throttle')", (FROZEN_NOW - ts,))
        found = [f for f in evaluate(gather_now(service, clock.now), service.config.alerts) if f.rule == "faults"]
        assert [f.message for f in found] == (["4 OOM or Xid faults in 30 days (more than 3)"] if fired else [])

    def test_a_squatting_container_is_named_and_a_drifted_power_limit_fires(self, tmp_path):
        """Issue 23: the container comes from the process (its cgroup on NVML, the scenario here); the policy from
        [power], against the simulated card's limit."""
        from msgspec.structs import replace

        from app.config import PowerSettings

        clock = Clock()
        scenario = {"cards": {"count": 2, "override": [{"card": 1, "power_limit_w": 575}]},
                    "processes": [{"card": 0, "pid": 51999, "used_mib": 4096, "user": "root",
                                   "container": "3f4e8a9b2c1d"}]}
        service = make_service(tmp_path, clock, scenario=scenario)
        service.config = replace(service.config, power=PowerSettings(limit_w=500.0, cards={0: 575.0}))
        found = {(f.rule, f.subject[-1], f.message) for f in evaluate(gather_now(service, clock.now),
                                                                      service.config.alerts)}
        assert found == {("squatter", "0", "GPU 0 squatted by root in container 3f4e8a9b2c1d (not booked)"),
                         ("power-drift", "1", "GPU 1 power limit 575 W, not the policy's 500 W"
                                              " (board power apply sets it)")}

    @pytest.mark.parametrize("busy_at, fired", [(None, True), (1500, False)])
    def test_booked_and_idle_for_30_minutes_from_the_history(self, tmp_path, busy_at, fired):
        clock = Clock()
        service = make_service(tmp_path, clock, scenario={"cards": {"count": 2}})
        booking = service.call(ALICE, "book", {"cards": [0], "start": int(clock.now), "end": int(clock.now) + 7200})
        uuid = service.fleet.latest().cards[0].uuid
        start = int(clock.now)
        samples = [Sample(ts, uuid, "IN USE" if ts == start + (busy_at or -1) else "BOOKED", 10, booking=booking["id"])
                   for ts in range(start, start + 1900, 60)]
        service.history.add(samples)
        clock.now = start + 1860  # 31 minutes of samples; the rule fires past 30
        found = {f.rule for f in evaluate(gather_now(service, clock.now), service.config.alerts)}
        assert ("idle-booked" in found) is fired


class TestFromTheDatabase:
    def booking(self, service, start, *, requested=None, queued=None, created=None) -> int:
        return service.conn.execute(
            'INSERT INTO bookings ("user", uid, starts_at, ends_at, created_at, created_by, requested_at, queued)'
            " VALUES ('alice', 1001, ?, ?, ?, 1001, ?, ?)",
            (start, start + 3600, created or start - 7200, requested or start, queued)).lastrowid

    @pytest.mark.parametrize("waited_s, fired", [(1800, False), (1802, True)])
    def test_waits_of_the_bookings_started_in_the_window(self, tmp_path, waited_s, fired):
        clock = Clock()
        service = make_service(tmp_path, clock, scenario={"cards": {"count": 1}})
        now = int(clock.now)
        self.booking(service, now - 600, requested=now - 600)  # no wait
        self.booking(service, now - 60, requested=now - 60 - 2 * waited_s)  # the mean is waited_s
        self.booking(service, now - 4000, requested=now - 90000)  # started before the window: not counted
        inputs = gather_now(service, now)
        assert sorted(inputs.waits_s) == [0, 2 * waited_s]
        assert ("wait" in {f.rule for f in evaluate(inputs, service.config.alerts)}) is fired

    def test_the_queue_now_and_at_the_window_start(self, tmp_path):
        clock = Clock()
        service = make_service(tmp_path, clock, scenario={"cards": {"count": 1}})
        now = int(clock.now)
        self.booking(service, now + 3600, queued="time", created=now - 7200)  # queued then and now
        self.booking(service, now + 3600, queued="cards", created=now - 60)  # queued since
        self.booking(service, now - 60, queued="time", created=now - 7200)  # was queued then; has started
        inputs = gather_now(service, now)
        assert (inputs.queued_before, inputs.queued_now) == (2, 2)

    def test_servers_that_crashed_lately(self, tmp_path):
        clock = Clock()
        service = make_service(tmp_path, clock, scenario={"cards": {"count": 1}})
        now = int(clock.now)
        booking = self.booking(service, now - 600)
        for state, ended in (("crashed", now - 60), ("crashed", now - 3601 - 60), ("stopped", now - 60)):
            service.conn.execute(
                'INSERT INTO servers (booking_id, "user", uid, cards, card_uuids, model, host, port, cmdline, state,'
                " created_at, ended_at) VALUES (?, 'carol', 1003, '0', 'GPU-0', '/models/qwen.gguf', '127.0.0.1',"
                " 8100, 'llama-server', ?, ?, ?)", (booking, state, now - 7200, ended))
        found = [f.message for f in evaluate(gather_now(service, now), service.config.alerts) if f.rule == "crashed"]
        assert found == ["server 1 (qwen.gguf) of carol crashed"]


class TestCli:
    def alerts_db(self, tmp_path):
        clock = Clock(T0 + 12 * 3600)
        service, engine = make_service(tmp_path, clock), Engine()
        alerts_pass(service, engine, Inputs(clock.now, cards=(Card(7, "GPU-7", "FREE", temp_c=93),
                                                     Card(5, "GPU-5", "SQUATTED", squatters=("\x1b[31meve",))),
                                   ending=(Ending(12, os.getuid() + 1, clock.now + 300),)))
        clock.now += 60
        alerts_pass(service, engine, Inputs(clock.now, cards=(Card(7, "GPU-7", "FREE", temp_c=93),)))
        return {"BOARD_DB": str(tmp_path / "board.db"), "TZ": "UTC", "BOARD_SIMULATE": "1",
                **({"BOARD_DB_URL": os.environ["BOARD_DB_URL"]} if "BOARD_DB_URL" in os.environ else {})}

    def test_json_and_table(self, tmp_path):
        env = self.alerts_db(tmp_path)
        firing = json.loads(run_board("alerts", "--json", env=env).stdout)
        assert [(a["rule"], a["state"]) for a in firing] == [("hot", "firing")]  # someone else's alert is not shown
        everything = run_board("alerts", "--all", "--json", env=env)
        assert everything.returncode == 0
        assert sorted((a["rule"], a["state"]) for a in json.loads(everything.stdout)) == \
            [("hot", "firing"), ("squatter", "resolved")]
        table = run_board("alerts", "--all", env=env)
        assert table.returncode == 0 and table.stdout.splitlines()[0].split() == ["STATE", "SINCE", "RULE", "ALERT"]
        assert "GPU 5 squatted by \\x1b[31meve" in table.stdout and "\x1b" not in table.stdout  # inert

    @pytest.mark.parametrize("args", [["--limit", "0"], ["--limit", "x"], ["--bogus"]])
    def test_bad_input_exits_2_with_one_line(self, tmp_path, args):
        result = run_board("alerts", *args, env={"BOARD_DB": str(tmp_path / "board.db"), "BOARD_SIMULATE": "1"})
        assert result.returncode == 2 and "Traceback" not in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1 or args != ["--limit", "0"]


def test_the_enforcer_pass_evaluates_and_pushes(tmp_path, receiver):
    from app.service.door.server import ServiceServer

    clock = Clock()
    service = make_service(tmp_path, clock, receiver, scenario={"cards": {"count": 2}, "faults": {"lost": [1]}})
    server = ServiceServer(service, str(tmp_path / "sock"), log=lambda line: None)
    assert server.enforce_once()["alerts"] != []
    assert [(a["rule"], a["state"]) for a in listing(service.conn, BOB)] == [("lost", "firing")]
    assert pushed(service, receiver) == [("alert.firing", "GPU 1 is LOST: the driver no longer sees it")]
    server.database.shutdown()


def test_alerts_off_means_no_pass(tmp_path):
    from app.service.door.server import ServiceServer

    service = make_service(tmp_path, Clock(), scenario={"cards": {"count": 2}, "faults": {"lost": [1]}}, enabled=False)
    server = ServiceServer(service, str(tmp_path / "sock"), log=lambda line: None)
    assert server.enforce_once()["alerts"] == [] and listing(service.conn, BOB, all=True) == []
    server.database.shutdown()
