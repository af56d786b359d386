"""The report's `tp` lines (app.report.gather.tp_links): a multi-card booking's PCIe traffic over its busy time as a
share of its links' capacity, from a real history file with hand-made samples. The capacity is read from the cards'
readings now, and a card idle now has dropped its link to Gen 1 to save power: its capacity is its maximum, while a
card under load runs at what its link gives it."""

from __future__ import annotations

import pytest

from app.core.cardstate import IN_USE
from app.gpu.model import CardReading, link_capacity_mib_s
from app.history.store import HistoryStore, Sample
from app.model import Booking
from app.report.gather import tp_links

H = 3600
NOW = 1_795_966_200 // 300 * 300
TRAFFIC = 6000  # MiB/s on each card, the busier direction, all the busy hour
BUSY_UTIL = 10


def booking(id: int, user: str, uuids: tuple[str, ...], cards: tuple[int, ...]) -> Booking:
    return Booking(id=id, user=user, uid=1000 + id, cards=cards, card_uuids=uuids, start=NOW - 2 * H, end=NOW + H,
                   klass="batch", note="", status="booked", requested_at=NOW - 2 * H)


@pytest.fixture(params=["raw", "rolled"])
def store(request, tmp_path):
    """Cards a-d busy (80 %) for the last hour at TRAFFIC each: from raw samples, or from the rollups."""
    store = HistoryStore(tmp_path / "board.history.db")
    for index, uuid in enumerate("abcd"):
        store.card_id(uuid, index, "RTX 5090", 32768)
        store.add([Sample(ts=t, uuid=uuid, state=IN_USE, dt=300, util=80, pcie=TRAFFIC)
                   for t in range(NOW - H, NOW, 300)])
    if request.param == "rolled":
        store.roll_up(NOW)
    yield store
    store.close()


def card(index: int, uuid: str, **fields) -> CardReading:
    return CardReading(index, uuid, **{"pcie_width": 16, "pcie_max_width": 16, **fields})


def test_an_idle_cards_capacity_is_its_maximum_and_a_busy_cards_its_link_now(store):
    """alice's a+b are idle now at Gen 1 (a Gen 5 card, and a Gen 4 one whose utilisation is unknown): their
    maxima, averaged. bob's c is under load at Gen 3 of its Gen 5 (its riser), d idle at Gen 1 in a x8 slot (the
    card x16): c at Gen 3 x16, d at Gen 5 x8; bob's share is over 25 %, alice's not.
    Nearest wrong versions:
    - the link now for an idle card (Gen 1): alice's share 7x too high, flagged
    - the maximum for a card under load: bob's Gen 3 card counted at Gen 5, not flagged
    - the card's own max width (x16) for one in a x8 slot: bob's d counted double
    - an unknown utilisation taken as load: b at Gen 1
    - one card's capacity (the first, or the best) for the whole group"""
    now = [card(0, "a", pcie_gen=1, pcie_max_gen=5, utilization_pct=0),
           card(1, "b", pcie_gen=1, pcie_max_gen=4, utilization_pct=None),
           card(2, "c", pcie_gen=3, pcie_max_gen=5, utilization_pct=90),
           card(3, "d", pcie_gen=1, pcie_width=8, pcie_max_gen=5, utilization_pct=0)]
    alice, bob = booking(1, "alice", ("a", "b"), (0, 1)), booking(2, "bob", ("c", "d"), (2, 3))
    found = {g["booking"]: g for g in tp_links(store, [alice, bob], now, NOW - 2 * H, NOW, BUSY_UTIL)}
    ab = (link_capacity_mib_s(5, 16) + link_capacity_mib_s(4, 16)) / 2
    cd = (link_capacity_mib_s(3, 16) + link_capacity_mib_s(5, 8)) / 2
    assert (found[1]["link_util_pct"], found[1]["over"]) == (round(100 * TRAFFIC / ab, 1), False)
    assert (found[2]["link_util_pct"], found[2]["over"]) == (round(100 * TRAFFIC / cd, 1), True)
    assert found[1]["link_util_pct"] == 13.3 and found[2]["link_util_pct"] == 26.6
    assert (found[1]["cards"], found[1]["busy_h"]) == ("0-1", 1.0)


def test_a_card_whose_maximum_is_unknown_counts_at_its_link_now_and_one_with_no_link_leaves_its_group_out(store):
    """Nearest wrong versions:
    - the maximum alone (None where sysfs and NVML did not say it): the group dropped
    - a card with no link reading counted as 0 or skipped from the average: a share over the other card alone"""
    now = [card(0, "a", pcie_gen=2, pcie_max_gen=None, utilization_pct=0),
           card(1, "b", pcie_gen=2, pcie_max_gen=None, utilization_pct=0),
           card(2, "c", pcie_gen=5, pcie_max_gen=5, utilization_pct=90),
           card(3, "d", pcie_gen=None, pcie_width=None, utilization_pct=0)]
    alice, bob = booking(1, "alice", ("a", "b"), (0, 1)), booking(2, "bob", ("c", "d"), (2, 3))
    [group] = tp_links(store, [alice, bob], now, NOW - 2 * H, NOW, BUSY_UTIL)
    assert (group["booking"], group["link_util_pct"]) == (1, round(100 * TRAFFIC / link_capacity_mib_s(2, 16), 1))


@pytest.mark.parametrize("traffic, over", [(15024, False), (15025, True)], ids=["exactly-25", "just-over"])
def test_a_group_at_exactly_the_seeds_25_percent_is_not_over_and_one_just_above_is(tmp_path, traffic, over):
    """Two Gen 5 x16 cards (60,096 MiB/s each): 15,024 MiB/s is 25.0 % exactly. Wrong version: the share at the
    threshold counted over (>= for >), with the advice to narrow a group that is not too wide."""
    store = HistoryStore(tmp_path / "board.history.db")
    for index, uuid in enumerate("ab"):
        store.card_id(uuid, index, "RTX 5090", 32768)
        store.add([Sample(ts=t, uuid=uuid, state=IN_USE, dt=300, util=80, pcie=traffic) for t in range(NOW - H, NOW, 300)])
    now = [card(i, uuid, pcie_gen=5, pcie_max_gen=5, utilization_pct=90) for i, uuid in enumerate("ab")]
    [group] = tp_links(store, [booking(1, "alice", ("a", "b"), (0, 1))], now, NOW - 2 * H, NOW, BUSY_UTIL)
    store.close()
    assert (group["link_util_pct"], group["over"], group["advice"] is not None) == (25.0, over, over)
