"""Fair share in the queue (app.core.fairshare): a project's decayed use, its standing against its share, and the
backfill's order by it, on the real BookingService over a real store with a pinned clock (FROZEN_NOW, UTC)."""

from __future__ import annotations

import math

import pytest

from app.config import Config, Policy, Project
from app.core import fairshare
from app.model import Booking

H = 3600
DAY = 86400
NOW = 1795966200  # tests.conftest.FROZEN_NOW


def booking(project: str, start: int, end: int, id: int = 1, klass: str = "batch") -> Booking:
    return Booking(id=id, user="u", uid=1, cards=(0,), card_uuids=(), start=start, end=end, klass=klass, note="",
                   status="booked", project=project)


def two(share_a: float = 1.0, share_b: float = 1.0, half_life_days: float = 7.0) -> Config:
    return Config(policy=Policy(fair_share_half_life_days=half_life_days),
                  projects=(Project("A", ("alice",), share=share_a), Project("B", ("bob", "carol"), share=share_b)))


class TestDecayedUse:
    def test_a_hand_computed_case_with_a_one_day_half_life(self):
        """Two cards from 2 days ago to 1 day ago, half-life 1 day: the weight runs from 1/4 to 1/2, and integrates
        to 86400 / ln 2 * (1/2 - 1/4) a card, 62324.4 card-seconds for the two. One card from a day ago on, still
        running: only the day up to now counts, 86400 / ln 2 * (1 - 1/2) = 62324.4. Wrong versions: usage not
        decayed (2 * 86400 + 86400 = 259200), the rate 1/half-life instead of ln 2/half-life (48320.4 a card-day),
        the future part counted."""
        use = fairshare.decayed_use([("A", NOW - 2 * DAY, NOW - DAY, 2), ("B", NOW - DAY, NOW + DAY, 1)], NOW, DAY)
        assert use == {"A": pytest.approx(62324.43, abs=0.01), "B": pytest.approx(62324.43, abs=0.01)}
        assert use["A"] == pytest.approx(DAY / (2 * math.log(2)), rel=1e-12)

    def test_an_old_booking_weighs_by_its_age_in_half_lives(self):
        """One card-hour ending now weighs 168 / ln 2 * (1 - 2 ** (-1/168)) = 0.997940 card-hours (the hour itself
        decays a little), the same 7 days (one default half-life) earlier half that, 14 days a quarter. Wrong
        version: a half-life off by a factor (days read as hours, 24 for 7, a factor 2)."""
        config = two()
        assert fairshare.half_life_s(config) == 7 * DAY
        now, end = NOW, NOW
        hours = [fairshare.decayed_use([("A", end - k * 7 * DAY - H, end - k * 7 * DAY, 1)], now,
                                       fairshare.half_life_s(config))["A"] / H for k in range(3)]
        assert hours == [pytest.approx(0.997940, abs=1e-6), pytest.approx(0.498970, abs=1e-6),
                         pytest.approx(0.249485, abs=1e-6)]

    def test_a_short_span_stays_exact(self):
        """One card-second a half-life ago weighs 1/2 (expm1: the difference of two near-equal powers loses it)."""
        use = fairshare.decayed_use([("A", NOW - 7 * DAY - 1, NOW - 7 * DAY, 1)], NOW, 7 * DAY)["A"]
        assert use == pytest.approx(0.5, rel=1e-6)


class TestStandings:
    def test_standing_is_use_over_share(self):
        """A: 2 card-days a week ago, share 4; B: 1 card-day a week ago, share 1. A used twice B's but has four
        times its share: it stands at half B's. Wrong version: the share multiplied (A at 8 times B's), ignored."""
        past = [("A", NOW - 8 * DAY, NOW - 7 * DAY, 2), ("B", NOW - 8 * DAY, NOW - 7 * DAY, 1)]
        stood = fairshare.standings(two(share_a=4), past, NOW)
        b = fairshare.decayed_use(past, NOW, 7 * DAY)["B"]
        assert stood == {"A": pytest.approx(b / 2), "B": pytest.approx(b)}
        assert b / H == pytest.approx(24 * 7 / math.log(2) * (2 ** -1 - 2 ** (-8 / 7)), rel=1e-12)

    def test_a_board_without_projects_has_no_standings(self):
        """Bookings still carry the projects of a config that had them; without [[projects]] now, all stand equal."""
        assert fairshare.standings(Config(), [("A", NOW - DAY, NOW, 8)], NOW) == {}

    def test_a_project_no_longer_configured_weighs_one(self):
        stood = fairshare.standings(two(share_a=2), [("gone", NOW - 7 * DAY - H, NOW - 7 * DAY, 1)], NOW)
        assert stood["gone"] == pytest.approx(0.498970 * H, abs=0.01)


class TestPlace:
    def test_the_words_name_each_project_use_and_share_in_order(self):
        """Used hours are the decayed use (standing times share), in the queue's order of projects."""
        config = two(share_a=2)
        standing = {"A": 96.0 * H / 2, "B": 12.0 * H}
        waiting = [booking("", NOW + H, NOW + 2 * H, id=9, klass="online"),
                   booking("B", NOW + H, NOW + 2 * H, id=3), booking("B", NOW + H, NOW + 2 * H, id=4),
                   booking("A", NOW + H, NOW + 2 * H, id=1)]
        assert fairshare.place(waiting[2], waiting, standing, config) == (
            "2nd of 3 in the batch queue: project B (used 12.0 h against share 1, decayed) goes before project A"
            " (96.0 h against share 2); then first come; 1 waiting online booking goes first")
        assert fairshare.place(waiting[0], waiting, standing, config) == "1st of 1 in the online queue: first come"

    @pytest.mark.parametrize(("n", "said"), [(1, "1st"), (2, "2nd"), (3, "3rd"), (4, "4th"), (11, "11th"),
                                             (12, "12th"), (13, "13th"), (21, "21st"), (102, "102nd"), (111, "111th")])
    def test_ordinal(self, n, said):
        assert fairshare.ordinal(n) == said


class TestBackfillOrder:
    """The real BookingService's backfill over a real store: the queue for card 0 is freed by cancelling a blocker,
    and the order the waiting bookings move up in is exact."""

    def past(self, make_service, user, project, config, cards, days_ago, hours, first=0):
        """`hours` of `cards` cards (from card `first` on) that `user` booked for `project` `days_ago` days ago, done
        by now."""
        then = NOW - days_ago * DAY
        return make_service(user, uid(user), config=config, now=then).create(
            cards=range(first, first + cards), start=then, end=then + hours * H, project=project)

    def queue(self, make_service, config, *who):
        """Bob blocks card 0 for two hours; each of `who` ((user, project, class)) then asks for it for an hour, the
        first from a minute from now, the next from two (first come: the earlier asked start), and joins the queue
        behind it; bob cancels. Returns the backfill's moves as (user, new start), in the order it made them: the
        first asker first is [(first, NOW + 60), (second, NOW + 60 + H)], the second first is [(second, NOW + 120),
        (first, NOW + 120 + H)] (the freed two hours fit one at its asked start, then the other after it)."""
        bob = make_service("bob", uid("bob"), config=config)
        blocker = bob.create(cards=[0], start=NOW, end=NOW + 2 * H, project="B" if config.projects else None)
        queued = {}
        for n, (user, project, klass) in enumerate(who, 1):
            made = make_service(user, uid(user), config=config).create(
                cards=[0], start=NOW + 60 * n, end=NOW + 60 * n + H, klass=klass, or_later=True, project=project)
            assert made.queued == "time" and made.start >= NOW + 2 * H
            queued[made.id] = user
        bob.cancel(blocker.id)
        moved = make_service("root", 0, admin=True, config=config).backfill()
        return [(queued[after.id], after.start) for _, after in moved]

    def race(self, make_service, config, a, b, first):
        """A's and B's past use (cards, days ago, hours, first card), then alice for A and carol for B ask for card 0,
        `first` of them first (queue)."""
        self.past(make_service, "alice", "A", config, *a)
        self.past(make_service, "bob", "B", config, *b)
        asks = {"alice": ("alice", "A", "batch"), "carol": ("carol", "B", "batch")}
        return self.queue(make_service, config, asks[first], *(ask for user, ask in asks.items() if user != first))

    def test_the_project_far_over_its_share_waits_behind_the_one_under_it(self, make_service):
        """The issue's case: A used 96 card-hours yesterday, B 12 the day before (and cancelled 192 more a week ago,
        which count nothing); A asked first. B's booking goes first, A's after it. Wrong versions: first come before
        the standing (A first), standings left out, a cancelled booking counted."""
        bob = make_service("bob", uid("bob"), config=two(), now=NOW - 8 * DAY)
        bob.cancel(bob.create(cards=range(8), start=NOW - 7 * DAY, end=NOW - 6 * DAY, project="B").id)
        assert self.race(make_service, two(), (8, 1, 12), (1, 2, 12), first="alice") == [
            ("carol", NOW + 120), ("alice", NOW + 120 + H)]

    @pytest.mark.parametrize(("half_life_days", "order"), [(7, [("alice", NOW + 120), ("carol", NOW + 120 + H)]),
                                                            (60, [("carol", NOW + 60), ("alice", NOW + 60 + H)])])
    def test_use_decays_by_the_configured_half_life(self, make_service, half_life_days, order):
        """A used 192 card-hours five weeks ago, B 10 card-hours two days ago; B asked first. With the default 7-day
        half-life A's is five half-lives old (about 6 h now against B's 8.2): A goes first. With a 60-day half-life
        A's weighs about 128 h: B goes first. Wrong versions: use not decayed (192 against 10: B first), the half-life
        fixed at 7 days or read in other units."""
        assert self.race(make_service, two(half_life_days=half_life_days), (8, 35, 24), (1, 2, 10),
                         first="carol") == order

    def test_a_bigger_share_lets_more_use_go_first(self, make_service):
        """A used 30 card-hours with share 4 (7.5 against its share), B 12 with share 1; B asked first. A goes first.
        Wrong versions: the share multiplied (120 against 12) or ignored (30 against 12): B first."""
        assert self.race(make_service, two(share_a=4), (5, 1, 6), (1, 1, 12, 5), first="carol") == [
            ("alice", NOW + 120), ("carol", NOW + 120 + H)]

    @pytest.mark.parametrize("first", ["alice", "carol"])
    def test_equal_standings_go_first_come(self, make_service, first):
        """Neither project used anything: the first to ask goes first, whichever project. Wrong version: the
        project's name before the request time, first come left out."""
        asks = {"alice": ("alice", "A", "batch"), "carol": ("carol", "B", "batch")}
        other = "carol" if first == "alice" else "alice"
        assert self.queue(make_service, two(), asks[first], asks[other]) == [(first, NOW + 60), (other, NOW + 60 + H)]

    def test_class_order_comes_before_fair_share(self, make_service):
        """A far over its share asks for an online booking after B's batch one: online still goes first. Wrong
        version: the standing before the class."""
        config = two()
        self.past(make_service, "alice", "A", config, cards=8, days_ago=1, hours=12)
        assert self.queue(make_service, config, ("carol", "B", "batch"), ("alice", "A", "online")) == [
            ("alice", NOW + 120), ("carol", NOW + 120 + H)]

    def test_without_projects_the_order_is_first_come_though_the_bookings_name_projects(self, make_service, conn):
        """Bookings made for A and B, then [[projects]] taken out of the config: A's huge past use counts for
        nothing, the queue is first come as before. Wrong version: standings read whatever the config."""
        config = two()
        self.past(make_service, "alice", "A", config, cards=8, days_ago=1, hours=12)
        blocker = make_service("bob", uid("bob"), config=config).create(cards=[0], start=NOW, end=NOW + 2 * H,
                                                                          project="B")
        first = make_service("alice", uid("alice"), config=config).create(
            cards=[0], start=NOW + 60, end=NOW + 60 + H, or_later=True, project="A")
        second = make_service("carol", uid("carol"), config=config).create(
            cards=[0], start=NOW + 60, end=NOW + 60 + H, or_later=True, project="B")
        make_service("bob", uid("bob"), config=config).cancel(blocker.id)
        moved = make_service("root", 0, admin=True, config=Config()).backfill()
        assert [(after.id, after.start) for _, after in moved] == [(first.id, NOW + 60), (second.id, NOW + 60 + H)]

    def test_wait_words_say_the_place_and_why(self, make_service):
        """What `board wait` prints for each waiting booking (BookingService.queue_places: the place in the `get` and
        `list` replies); the blocker waits for nothing."""
        config = two(share_a=2)
        self.past(make_service, "alice", "A", config, cards=8, days_ago=1, hours=12)
        bob = make_service("bob", uid("bob"), config=config)
        blocker = bob.create(cards=[0], start=NOW, end=NOW + 2 * H, project="B")
        a = make_service("alice", uid("alice"), config=config).create(
            cards=[0], start=NOW + 60, end=NOW + 60 + H, klass="batch", or_later=True, project="A")
        b = make_service("carol", uid("carol"), config=config).create(
            cards=[0], start=NOW + 60, end=NOW + 60 + H, klass="batch", or_later=True, project="B")
        # A: 8 cards from a day ago for 12 h, 8 * 168 / ln 2 * (2 ** (-0.5/7) - 2 ** (-1/7)) = 89.1 h, over share 2
        assert bob.queue_places([bob.get(b.id)])[b.id] == (
            "1st of 2 in the batch queue: project B (used 0.0 h against share 1, decayed) goes before project A"
            " (89.1 h against share 2); then first come")
        places = bob.queue_places([bob.get(a.id), bob.get(b.id), bob.get(blocker.id)])
        assert sorted(places) == [a.id, b.id] and places[a.id].startswith("2nd of 2 in the batch queue: ")


USERS = {"alice": 1001, "bob": 1002, "carol": 1003}


def uid(user: str) -> int:
    return USERS[user]
