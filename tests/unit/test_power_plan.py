"""`board power apply`'s plan (app.cli.power.plan): per card, the steps that bring it to the [power] policy."""

from __future__ import annotations

import pytest

from app.cli.power import plan
from app.errors import BadInput


def card(index: int, *, limit_w=575.0, max_w=600.0, policy_w=500.0, persistence=True, drift=True, lost=False):
    return {"index": index, "limit_w": limit_w, "default_w": 575.0, "max_w": max_w, "policy_w": policy_w,
            "persistence": persistence, "drift": drift, "lost": lost}


def test_persistence_mode_is_set_where_it_is_off_or_unknown_and_left_where_it_is_on():
    """NVML that cannot say (None, "n/a") is no proof the mode is on: the step is planned, as for a card with it off.
    Wrong versions: only a card reading False gets the step; a card already on gets it again."""
    found = {"cards": [card(0, persistence=None, drift=False), card(1, persistence=False, drift=False),
                       card(2, persistence=True, drift=False)]}
    assert plan(found) == [(0, [{"persistence": True}]), (1, [{"persistence": True}])]


def test_persistence_comes_before_the_limit_and_a_lost_card_gets_no_step():
    """Wrong versions: the limit before persistence mode (the driver forgets it when the card sleeps); a lost card
    planned; a card with no policy of its own given a limit."""
    found = {"cards": [card(0, persistence=False), card(1, lost=True, persistence=False),
                       card(2, policy_w=None, drift=False, persistence=False)]}
    assert plan(found) == [(0, [{"persistence": True}, {"limit_w": 500, "from_w": 575.0}]),
                           (2, [{"persistence": True}])]


def test_a_policy_at_the_cards_maximum_is_planned_and_a_watt_over_is_refused():
    """Wrong versions: the maximum itself refused (>=); the check dropped."""
    assert plan({"cards": [card(0, policy_w=600.0)]}) == [(0, [{"limit_w": 600, "from_w": 575.0}])]
    with pytest.raises(BadInput, match="card 0: the policy's 601 W is over the card's maximum 600 W"):
        plan({"cards": [card(0, policy_w=601.0)]})
