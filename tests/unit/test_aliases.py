"""An alias belongs to its holder (issue 31, section 2): the rule `serve start`, the runner's start of a plan and
`serve plan` apply (app.llama.aliases), on a real store; [gateway.team_aliases] as the config reads it, and who a
team alias lists (app.core.identity.listed).

The gateway's own check is tests/unit/test_gateway_routing.py; the attack as the members make it, over the real
socket, is tests/llama/test_gateway.py."""

from __future__ import annotations

import grp
import os
import pwd
from types import SimpleNamespace

import pytest

from app.config import Config, ConfigError, GatewaySettings, LlamaSettings, Policy, load_config
from app.core.identity import listed
from app.core.identity import Identity
from app.errors import BadInput, Conflict, NotPermitted
from app.llama import aliases
from app.llama import rows as server_rows
from app.llama.service import ServerService
from app.service.rules import plans
from app.service.rules.bookings import BookingService
from app.service.rules.series import SeriesService
from app.store import plans as plan_rows
from app.store.db import write
from tests.conftest import FROZEN_NOW, sqlite_only, worded  # Sunday 2026-11-29 15:30 UTC

MODELS = "/srv/models"
HOUR = 3600
ALICE, BOB, CAROL = Identity("alice", 1001, False), Identity("bob", 1002, False), Identity("carol", 1003, False)
TEAMS = {"team-llm": ("alice", "carol")}


@pytest.fixture
def world(tmp_path, conn, fleet):
    """The rules as the service runs them, on the test's store, at a clock the test moves."""
    binary = tmp_path / "llama-server"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    config = Config(db_path=tmp_path / "board.db", policy=Policy(timezone="UTC", max_ahead_days=60),
                    llama=LlamaSettings(server_bin=str(binary), model_dirs=(MODELS,)),
                    gateway=GatewaySettings(team_aliases=TEAMS))
    made = SimpleNamespace(conn=conn, config=config, now=FROZEN_NOW, fleet=fleet)
    made.clock = lambda: made.now

    def book(me: Identity, cards: list[int], start: int, end: int) -> int:
        return BookingService(conn, me, config, fleet.cards, fleet.topology, lambda: made.now).create(
            cards=cards, start=start, end=end).id

    def serve(me: Identity, booking: int, alias: str | None = None, model: str = f"{MODELS}/m.gguf"):
        rules = ServerService(conn, me, config, topology=fleet.topology, clock=made.clock, environ={})
        return rules.prepare(booking, model=model, alias=alias)

    def plan(me: Identity, *, booking: int | None = None, series: int | None = None, alias: str | None = "team",
             model: str = f"{MODELS}/m.gguf"):
        spec = {"model": model, **({"alias": alias} if alias else {})}
        return plans.create(made, me, booking=booking, series=series, spec=spec)

    made.book, made.serve, made.plan = book, serve, plan
    return made


def counts(conn) -> tuple[int, int]:
    return (conn.execute("SELECT count(*) FROM servers").fetchone()[0],
            conn.execute("SELECT count(*) FROM server_plans").fetchone()[0])


def refusals(conn, action: str) -> int:
    return conn.execute("SELECT count(*) FROM events WHERE action = ? AND ok = 0", (action,)).fetchone()[0]


def test_a_live_server_holds_its_alias_against_every_other_member_until_it_stops(world):
    now = FROZEN_NOW
    alices = world.book(ALICE, [0], now, now + 2 * HOUR)
    held = world.serve(ALICE, alices, "team")
    bobs = world.book(BOB, [1], now, now + HOUR)
    before = counts(world.conn)
    with pytest.raises(Conflict) as refused:
        world.serve(BOB, bobs, "team")
    said = worded(refused.value)
    assert refused.value.exit_code == 3 and said.startswith("alias team is alice's")
    assert f"server {held.id} on booking {alices}" in said and "give another --alias" in said
    assert counts(world.conn) == before and refusals(world.conn, "server-start") == 1  # nothing written; audited
    assert world.serve(BOB, bobs, "bobs").alias == "bobs"  # his own alias
    second = world.book(ALICE, [2], now, now + HOUR)
    assert world.serve(ALICE, second, "team").alias == "team"  # one holder may serve it from several servers
    for server in server_rows.live(world.conn):
        if server.user == "alice":
            with write(world.conn):
                server_rows.transition(world.conn, server.id, server_rows.LIVE_STATES, server_rows.STOPPED)
    assert world.serve(BOB, world.book(BOB, [3], now, now + HOUR), "team").user == "bob"  # free again


def test_the_default_alias_is_the_models_name_and_a_clash_on_it_says_to_pass_alias(world):
    now = FROZEN_NOW
    assert world.serve(ALICE, world.book(ALICE, [0], now, now + HOUR), model=f"{MODELS}/qwen.gguf").alias == "qwen"
    bobs = world.book(BOB, [1], now, now + HOUR)
    with pytest.raises(Conflict, match="alias qwen is alice's.*the alias is the model's name unless you give one:"
                                       " pass --alias NAME"):
        world.serve(BOB, bobs, model=f"{MODELS}/qwen.gguf")
    assert world.serve(BOB, bobs, "qwen-bob", model=f"{MODELS}/qwen.gguf").alias == "qwen-bob"
    with pytest.raises(Conflict, match="pass --alias"):  # a plan on the same model alike
        world.plan(BOB, booking=world.book(BOB, [2], now, now + HOUR), alias=None, model=f"{MODELS}/qwen.gguf")


def test_a_planned_server_holds_its_alias_over_its_bookings_time_and_only_then(world):
    now = FROZEN_NOW
    alices = world.book(ALICE, [0], now + HOUR, now + 3 * HOUR)
    plan = world.plan(ALICE, booking=alices)
    # A start now whose booking runs one second into hers is refused; one that ends as hers starts is not.
    late = world.book(BOB, [1], now, now + HOUR + 1)
    with pytest.raises(Conflict) as refused:
        world.serve(BOB, late, "team")
    said = worded(refused.value)
    assert said.startswith("alias team is alice's: their planned server") and f"{plan['id']}" in said
    assert f"on booking {alices} from" in said and refused.value.exit_code == 3
    assert world.serve(BOB, world.book(BOB, [2], now, now + HOUR), "team").user == "bob"
    # Plans alike, at plan time: overlapping hers by a second, refused; touching it, taken.
    before = counts(world.conn)
    with pytest.raises(Conflict, match=f"alias team is alice's: their planned server {plan['id']}"):
        world.plan(BOB, booking=world.book(BOB, [3], now + 3 * HOUR - 1, now + 4 * HOUR))
    assert counts(world.conn) == before and refusals(world.conn, "server-plan") == 1
    assert world.plan(BOB, booking=world.book(BOB, [4], now + 3 * HOUR, now + 4 * HOUR))["user"] == "bob"
    # and a plan cannot take an alias another member's server serves now, for as long as its booking lasts
    with pytest.raises(Conflict, match="alias team is bob's: their server"):
        world.plan(ALICE, booking=world.book(ALICE, [5], now + HOUR - 1, now + HOUR + 60))
    # Her own plan is no clash for her: she serves it on the planned booking herself.
    world.now = now + HOUR
    assert world.serve(ALICE, alices, "team").user == "alice"


def test_a_series_plan_is_checked_over_every_occurrence(world):
    """bob's weekday series against one hour of alice's on the Wednesday: not the series' first occurrence."""
    series = SeriesService(BookingService(world.conn, BOB, world.config, world.fleet.cards, world.fleet.topology,
                                          world.clock)).book(
        cards=[4, 5], klass="online", every="weekday", start="9:00", until="19:00", first="2026-11-30",
        last="2026-12-04").booked
    wednesday = series[2]
    alices = world.book(ALICE, [6], wednesday.start + 3 * HOUR, wednesday.start + 4 * HOUR)
    world.plan(ALICE, booking=alices)
    with pytest.raises(Conflict, match=f"their planned server .* on booking {alices}"):
        world.plan(BOB, series=wednesday.series_id)
    assert world.plan(BOB, series=wednesday.series_id, alias="bobs")["series"] == wednesday.series_id


def test_a_clash_that_arose_later_goes_to_the_older_plan_and_the_later_start_is_refused_with_its_reason(world):
    """alice planned first; bob's plan for the same time came in past the check (as a booking moved later might
    make it). bob's occurrence starts first, but the older plan holds: his start is refused and its reason kept on
    his plan's run; hers starts. (Any other plan blocking: neither starts; the first start winning: bob's.)"""
    now = FROZEN_NOW
    alices, bobs = world.book(ALICE, [0], now, now + HOUR), world.book(BOB, [1], now - 60, now + HOUR)
    alice_plan = world.plan(ALICE, booking=alices)["id"]
    with write(world.conn):
        bob_plan = plan_rows.insert(world.conn, booking_id=bobs, series_id=None, user="bob", uid=BOB.uid,
                                    alias="team", spec={"model": f"{MODELS}/m.gguf", "alias": "team"}, now=now)
    assert [p.id for p, _ in plan_rows.due(world.conn, now)] == [bob_plan, alice_plan]  # bob's is first in line
    sent, logged = [], []
    world.runner = SimpleNamespace(gone=False, send=lambda message: sent.append(message) or True)
    world.supervision = SimpleNamespace(alive=lambda server: None)
    world.hub = SimpleNamespace(changed=lambda kind: None)
    world.host = ""
    world.fleet = None
    started = plans.start_due(SimpleNamespace(service=world, log=logged.append))
    [server] = [server_rows.get(world.conn, i) for i in started]
    assert (server.user, server.alias, server.booking_id) == ("alice", "team", alices)
    error = world.conn.execute("SELECT error FROM server_plan_runs WHERE plan_id = ?", (bob_plan,)).fetchone()[0]
    assert worded(error).startswith(f"alias team is alice's: their planned server {alice_plan}")
    assert [m["server"]["id"] for m in sent] == [server.id]


def test_a_team_alias_is_served_by_those_it_lists_and_refused_to_others(world):
    now = FROZEN_NOW
    world.serve(ALICE, world.book(ALICE, [0], now, now + HOUR), "team-llm")
    assert world.serve(CAROL, world.book(CAROL, [1], now, now + HOUR), "team-llm").user == "carol"  # shared
    bobs = world.book(BOB, [2], now, now + HOUR)
    with pytest.raises(NotPermitted) as refused:
        world.serve(BOB, bobs, "team-llm")
    assert refused.value.exit_code == 4
    assert str(refused.value) == ("team-llm is a team alias that only alice, carol may serve ([gateway.team_aliases]);"
                                  " give another --alias")
    with pytest.raises(NotPermitted, match="only alice, carol may serve"):
        world.plan(BOB, booking=bobs, alias="team-llm")
    assert world.plan(CAROL, booking=world.book(CAROL, [3], now + HOUR, now + 2 * HOUR), alias="team-llm")


def test_gateway_state_carries_each_team_alias_with_its_owners_and_the_servers_holders_it_lists(tmp_path, store,
                                                                                                  fleet):
    """What the gateway routes a team alias by: the config's owners and, of its live servers' holders, those listed
    (a row of bob's under it, written past the start's check, is not among them)."""
    from app.gpu import open_source
    from app.gpu.fleet import Fleet
    from app.service import Service

    config = Config(db_path=tmp_path / "board.db", storage_url=getattr(store, "url", None),
                    gateway=GatewaySettings(team_aliases={"team-llm": ("alice", "@no-such-group-board"),
                                                          "idle": ("bob",)}))
    service = Service(config, Fleet(open_source(True, clock=lambda: FROZEN_NOW), 1.0), clock=lambda: FROZEN_NOW)
    try:
        booking = BookingService(service.conn, ALICE, config, fleet.cards, fleet.topology, lambda: FROZEN_NOW).create(
            cards=[0, 1, 2], start=FROZEN_NOW, end=FROZEN_NOW + HOUR).id
        with write(service.conn):
            for n, (user, uid) in enumerate((("alice", 1001), ("bob", 1002), ("alice", 1001))):
                server_rows.insert(service.conn, booking_id=booking, user=user, uid=uid, cards=[n], card_uuids=[f"u{n}"],
                                   model="/srv/models/m.gguf", alias="team-llm", host="127.0.0.1", port=9000 + n,
                                   ctx=512, parallel=1, split_mode="layer", metrics=False, cmdline=[], now=FROZEN_NOW)
        state = service.call(Identity("board-gateway", 990, False), "gateway_state", {})
    finally:
        service.close()
    assert state["team_aliases"] == {"team-llm": {"owners": ["alice", "@no-such-group-board"], "holders": ["alice"]},
                                     "idle": {"owners": ["bob"], "holders": []}}


# -- who a team alias lists ----------------------------------------------------------------------------------------


def test_listed_by_name_or_as_a_groups_member_and_nobody_else():
    me = pwd.getpwuid(os.getuid())
    primary = grp.getgrgid(me.pw_gid).gr_name
    assert listed(["alice", "bob"], "bob") and not listed(["alice", "bob"], "bo")
    assert listed([f"@{primary}"], me.pw_name)  # the group it is in by its passwd entry
    assert not listed(["@no-such-group-board"], me.pw_name) and not listed([], me.pw_name)
    with_members = next((g for g in grp.getgrall() if g.gr_mem), None)
    if with_members is not None:  # a supplementary member (tests/llama/test_gateway.py has real ones for certain)
        assert listed([f"@{with_members.gr_name}"], with_members.gr_mem[0])


# -- [gateway.team_aliases] ----------------------------------------------------------------------------------------


def test_the_config_reads_team_aliases(tmp_path):
    path = tmp_path / "board.toml"
    path.write_text('[gateway]\nlisten = "127.0.0.1:8080"\n[gateway.team_aliases]\n'
                    'team-llm = ["alice", "@serving", "alice"]\n"qwen 2.5" = ["bob"]\n')
    settings = load_config(environ={"BOARD_CONFIG": str(path)}).gateway
    assert settings.team_aliases == {"team-llm": ("alice", "@serving"), "qwen 2.5": ("bob",)}
    assert load_config(environ={}).gateway.team_aliases == {}  # none by default: every alias has one holder


@pytest.mark.parametrize("text, message", [
    ('[gateway]\nteam_aliases = ["alice"]\n', r'\[gateway\] team_aliases: expected a table, got \["alice"\]$'),
    ('[gateway.team_aliases]\nteam = "alice"\n', r'\[gateway\] team_aliases.team: expected a list, got "alice"$'),
    ('[gateway.team_aliases]\nteam = []\n', r"\[gateway.team_aliases\] 'team' is a list of users and @groups"),
    ('[gateway.team_aliases]\nteam = [1001]\n', r"\[gateway\] team_aliases.team\[0\]: expected a string, got 1001$"),
    ('[gateway.team_aliases]\nteam = ["@"]\n', r"'team' has '@'; give user names and @groups"),
    ('[gateway.team_aliases]\nteam = ["al ice"]\n', r"'team' has 'al ice'"),
    ('[gateway.team_aliases]\n"" = ["alice"]\n', r"an alias is 1 to 200 printable characters"),
])
def test_bad_team_aliases_are_one_line_errors(tmp_path, text, message):
    path = tmp_path / "board.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message) as error:
        load_config(environ={"BOARD_CONFIG": str(path)})
    assert "\n" not in str(error.value) and str(path) in str(error.value)


def test_a_members_start_is_judged_by_the_age_of_their_oldest_plan_for_that_booking(world):
    """bob planned the alias first, alice next, then bob planned it again on the same booking (both of bob's came in
    past the check, as a booking moved later might make it). bob's own start on that booking is judged by his oldest
    plan, which is older than alice's: it starts. Wrong version: judged by his newest plan (max for min): refused as
    alice's."""
    now = FROZEN_NOW
    alices, bobs = world.book(ALICE, [0], now, now + HOUR), world.book(BOB, [1], now - 60, now + HOUR)
    spec = {"model": f"{MODELS}/m.gguf", "alias": "team"}
    with write(world.conn):
        plan_rows.insert(world.conn, booking_id=bobs, series_id=None, user="bob", uid=BOB.uid, alias="team", spec=spec,
                         now=now)
        plan_rows.insert(world.conn, booking_id=alices, series_id=None, user="alice", uid=ALICE.uid, alias="team",
                         spec=spec, now=now)
        plan_rows.insert(world.conn, booking_id=bobs, series_id=None, user="bob", uid=BOB.uid, alias="team", spec=spec,
                         now=now)
    assert world.serve(BOB, bobs, "team").user == "bob"


@pytest.mark.parametrize("left, refused", [(0, True), (1, False)], ids=["ends-now", "a-second-left"])
def test_a_plan_on_a_booking_that_ends_now_is_refused_and_one_with_a_second_left_is_made(world, left, refused):
    """Wrong version: a booking that ends this second taken for one still running (<= moved to <)."""
    booking = world.book(ALICE, [0], FROZEN_NOW, FROZEN_NOW + HOUR)
    world.now = FROZEN_NOW + HOUR - left
    if refused:
        with pytest.raises(BadInput, match=f"^booking {booking} is over$"):
            world.plan(ALICE, booking=booking)
        assert counts(world.conn) == (0, 0)
    else:
        assert world.plan(ALICE, booking=booking)["booking"] == booking


def test_an_alias_refusal_carries_its_times_as_stamps_for_the_members_zone(world):
    """The service words no time itself: the reader's client does, in the reader's zone (app.core.text.localize).
    Wrong version: the alias refusal worded with format_time in the service's zone (a member in Shanghai reads a UTC
    time with no word of it)."""
    now = FROZEN_NOW
    world.serve(ALICE, world.book(ALICE, [0], now, now + HOUR), "solo")
    with pytest.raises(Conflict) as refused:
        world.serve(BOB, world.book(BOB, [1], now, now + HOUR), "solo")
    assert f"serves it until <@time:{now + HOUR}:{now}>" in str(refused.value)
    world.plan(ALICE, booking=world.book(ALICE, [2], now + 2 * HOUR, now + 3 * HOUR), alias="later")
    with pytest.raises(Conflict) as refused:
        world.plan(BOB, booking=world.book(BOB, [3], now + 2 * HOUR, now + 3 * HOUR), alias="later")
    assert f"from <@time:{now + 2 * HOUR}:{now}> to <@time:{now + 3 * HOUR}:{now}>" in str(refused.value)


def test_alias_refusals_are_worded_whole_and_a_long_alias_is_cut_to_80(world):
    """Each refusal a member reads, word for word, under an alias of 100 characters: named by its first 80.
    Wrong versions: another cut; the hint's words changed (either hint)."""
    now, alias = FROZEN_NOW, "a" * 100
    alices = world.book(ALICE, [0], now, now + HOUR)
    held = world.serve(ALICE, alices, alias)
    with pytest.raises(Conflict) as refused:
        world.serve(BOB, world.book(BOB, [1], now, now + HOUR), alias)
    assert str(refused.value) == (f"alias {alias[:80]} is alice's: their server {held.id} on booking {alices} serves it"
                                  f" until <@time:{now + HOUR}:{now}>; give another --alias")
    later = world.book(ALICE, [2], now + 2 * HOUR, now + 3 * HOUR)
    plan = world.plan(ALICE, booking=later, alias=alias)
    with pytest.raises(Conflict) as refused:
        world.plan(BOB, booking=world.book(BOB, [3], now + 2 * HOUR, now + 3 * HOUR), alias=None,
                   model=f"{MODELS}/{alias}.gguf")
    assert str(refused.value) == (
        f"alias {alias[:80]} is alice's: their planned server {plan['id']} serves it on booking {later} from"
        f" <@time:{now + 2 * HOUR}:{now}> to <@time:{now + 3 * HOUR}:{now}>; the alias is the model's name unless you"
        " give one: pass --alias NAME")
    team = "t" * 100
    config = Config(db_path=world.config.db_path, gateway=GatewaySettings(team_aliases={team: ("alice",)}))
    with pytest.raises(NotPermitted) as refused:
        aliases.check(world.conn, config, user="bob", uid=BOB.uid, alias=team, spans=[(now, now + HOUR)], now=now)
    assert str(refused.value) == (f"{team[:80]} is a team alias that only alice may serve ([gateway.team_aliases]);"
                                  " give another --alias")


def test_a_members_own_plan_does_not_hide_another_members_plan_after_it(world):
    """bob's plan (older, the first held row) is his own and passes; alice's later plan, which his start now
    overlaps, still refuses it.
    Wrong version: the scan stopped at the first plan it passes over (break for continue)."""
    now = FROZEN_NOW
    world.plan(BOB, booking=world.book(BOB, [0], now + 2 * HOUR, now + 3 * HOUR))
    alices = world.book(ALICE, [1], now + HOUR, now + 2 * HOUR)
    alice_plan = world.plan(ALICE, booking=alices)
    with pytest.raises(Conflict, match=f"^alias team is alice's: their planned server {alice_plan['id']} "):
        world.serve(BOB, world.book(BOB, [2], now, now + 2 * HOUR), "team")


@sqlite_only  # PRAGMA foreign_keys
def test_a_live_server_whose_booking_row_is_gone_holds_its_alias_this_second_only(world):
    """A server row without its booking (the store's foreign key off, as no code path makes it) is taken as live now,
    holding its alias until now + 1: a plan from now is refused, one from the next second is made.
    Wrong versions: the missing booking read (a crash); held until now - 1 (never) or now + 2."""
    now = FROZEN_NOW
    alices = world.book(ALICE, [0], now, now + HOUR)
    world.serve(ALICE, alices, "team")
    world.book(CAROL, [3], now, now + HOUR)  # a later row, so that the next booking does not take the gone one's id
    world.conn.execute("PRAGMA foreign_keys = OFF")
    with write(world.conn):
        world.conn.execute("DELETE FROM bookings WHERE id = ?", (alices,))
    world.conn.execute("PRAGMA foreign_keys = ON")
    with pytest.raises(Conflict) as refused:
        world.plan(BOB, booking=world.book(BOB, [1], now, now + HOUR))
    assert f"serves it until <@time:{now + 1}:{now}>;" in str(refused.value)
    assert world.plan(BOB, booking=world.book(BOB, [2], now + 1, now + HOUR))["user"] == "bob"
