import pytest

from app.core.slots import best_group, find_slot, is_free, next_free_start, overlaps
from app.gpu.model import LINK_MULTIPLE, LINK_SINGLE, LINK_SYSTEM, Topology

# Two PCIe switches: cards 0-3 and 4-7, as on the real server.
TWO_SWITCHES = Topology({(a, b): LINK_MULTIPLE if a // 4 == b // 4 else LINK_SYSTEM for a in range(8) for b in range(a + 1, 8)})
H = 3600


@pytest.mark.parametrize(
    "a, b, expected",
    [
        ((0, 10), (10, 20), False),  # half-open: touching is not overlapping
        ((0, 10), (9, 20), True),
        ((5, 6), (0, 10), True),
        ((0, 10), (0, 10), True),
        ((10, 20), (0, 10), False),
    ],
)
def test_overlaps_is_half_open(a, b, expected):
    assert overlaps(a, b) is expected


@pytest.mark.parametrize(
    "free, count, expected",
    [
        (range(8), 2, (0, 1)),
        (range(8), 4, (0, 1, 2, 3)),
        ([0, 4, 5, 6], 2, (4, 5)),  # 0 alone on its switch; the pair comes from 4-7
        ([0, 1, 4, 5, 6, 7], 4, (4, 5, 6, 7)),  # one whole switch beats 2+2
        ([0, 1, 2, 4, 5], 4, (0, 1, 2, 4)),  # must straddle; the tie goes to the lowest indexes
        ([3, 7], 2, (3, 7)),
        ([1, 2], 4, None),
    ],
)
def test_best_group_prefers_one_switch(free, count, expected):
    assert best_group(list(free), count, TWO_SWITCHES) == expected


def test_next_free_start_skips_to_the_end_of_the_blocking_booking():
    busy = {0: [(0, 2 * H)], 1: [(H, 3 * H)]}
    assert next_free_start(busy, [0], 0, H) == 2 * H
    assert next_free_start(busy, [0, 1], 0, H) == 3 * H
    assert next_free_start(busy, [2], 0, H) == 0


def test_next_free_start_uses_a_gap_that_fits():
    busy = {0: [(0, H), (2 * H, 3 * H)]}
    assert next_free_start(busy, [0], 0, H) == H  # the one-hour gap fits exactly
    assert next_free_start(busy, [0], 0, 2 * H) == 3 * H


def test_find_slot_takes_the_earliest_start_then_the_best_group():
    busy = {c: [(0, 2 * H)] for c in range(0, 6)}  # only 6 and 7 are free now
    assert find_slot(busy, list(range(8)), 2, 0, H, TWO_SWITCHES) == ((6, 7), 0)
    assert find_slot(busy, list(range(8)), 4, 0, H, TWO_SWITCHES) == ((0, 1, 2, 3), 2 * H)


def test_find_slot_respects_eligible_cards():
    assert find_slot({}, [4, 5], 4, 0, H, TWO_SWITCHES) is None
    assert find_slot({}, [5, 6], 2, 0, H, TWO_SWITCHES) == ((5, 6), 0)


def test_until_limits_the_search_to_the_known_calendar():
    busy = {0: [(0, 2 * H)]}
    assert next_free_start(busy, [0], 0, H, until=2 * H) is None  # a slot at 2h would end past what is known
    assert next_free_start(busy, [0], 0, H, until=3 * H) == 2 * H
    assert find_slot(busy, [0], 1, 0, H, TWO_SWITCHES, until=2 * H) is None
    assert find_slot(busy, [0], 1, 0, H, TWO_SWITCHES, until=3 * H) == ((0,), 2 * H)


@pytest.mark.parametrize(
    "wanted, free",
    [
        ((0, 10), True),  # ends as the booking starts
        ((20, 30), True),  # starts as the booking ends
        ((0, 11), False),  # one second into it
        ((19, 30), False),  # one second before its end
        ((12, 13), False),  # inside
        ((0, 50), False),  # around it
        ((20, 40), True),  # the whole gap between the two bookings, meeting both
        ((19, 40), False),
        ((20, 41), False),
    ],
)
def test_is_free_at_the_edges(wanted, free):
    busy = {0: [(10, 20), (40, 50)], 1: [(30, 40)]}
    assert is_free(busy, [0], wanted) is free
    assert is_free(busy, [2], wanted) is True  # a card nobody booked
    if wanted == (20, 40):
        assert is_free(busy, [0, 1], wanted) is False  # every card must be free


def test_next_free_start_passes_back_to_back_bookings_as_one():
    busy = {0: [(0, H), (H, 2 * H), (3 * H, 4 * H)]}
    assert next_free_start(busy, [0], 0, H) == 2 * H  # the gap between the first two is empty
    assert next_free_start(busy, [0], 0, H + 1) == 4 * H  # the next gap is one second short


def test_best_group_takes_all_the_free_cards_when_that_is_the_count():
    assert best_group([1, 5], 2, TWO_SWITCHES) == (1, 5)
    assert best_group([1, 5], 3, TWO_SWITCHES) is None


def test_best_group_counts_every_pair_on_a_three_level_tree():
    # Pairs share a switch, fours share a bridge, the halves meet across the system: 3+1 has three
    # cross-system pairs, 2+2 has four, so 3+1 wins on the sum of every pair's level.
    tree = Topology({(a, b): LINK_SINGLE if a // 2 == b // 2 else LINK_MULTIPLE if a // 4 == b // 4 else LINK_SYSTEM
                     for a in range(8) for b in range(a + 1, 8)})
    assert best_group([0, 1, 2, 4, 5], 4, tree) == (0, 1, 2, 4)
    assert best_group([0, 1, 2, 6, 7], 4, tree) == (0, 1, 2, 6)
