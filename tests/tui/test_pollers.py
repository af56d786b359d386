"""The board's update threads (app.tui.pollers), running as `board` runs them, on a real service in this process."""

from __future__ import annotations

import threading

from tests.tui.conftest import wait_for

CARD = "GPU-5090sim-0000-0000-0000-000000000002"


async def test_the_cards_show_before_the_history_arrives_and_the_sparklines_fill_with_it_after(make_app):
    """The first screen waits for no history (issue 37: first paint): while the service's `history` answer is held,
    the fleet is already on the board with one sample a card; once it comes, the card's sparkline holds the ten minutes
    before that sample too (121 at 5 s). Nearest wrong versions: the first fleet event posted only with its history
    (the cards wait for it), and the history merged after the snapshot's sample as before (every older sample dropped:
    the sparkline stays at one)."""
    app = make_app(live=True)
    held = threading.Event()
    answer = app.client.call

    def call(op, **args):
        if op == "history":
            held.wait(30)
        return answer(op, **args)

    app.client.call = call
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, lambda: app.fleet is not None)
            assert len(app.history[CARD]) == 1
            held.set()
            await wait_for(pilot, lambda: len(app.history[CARD]) > 1)
            samples = list(app.history[CARD])
            assert len(samples) == 121 and samples[-1][0] == app.fleet.taken_at
            assert [s[0] for s in samples] == sorted(s[0] for s in samples)
    finally:
        held.set()


async def test_the_history_is_read_once_the_first_fleet_is_painted(make_app):
    """The history's read (a big one: ten minutes of every card) waits until the first fleet snapshot is on the
    screen, so it takes none of the CPU the first paint needs (issue 37). Nearest wrong versions: the history read
    right after the first snapshot is posted (the card table is still empty then); the wait never released (the
    sparklines stay at one sample until the wait's 5 s have passed, past this test's)."""
    app = make_app(live=True)
    rows_when_asked: list[int] = []
    answer = app.client.call

    def call(op, **args):
        if op == "history":
            rows_when_asked.append(app.board.card_table.row_count)
        return answer(op, **args)

    app.client.call = call
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: len(app.history[CARD]) > 1, timeout=4.0)
        assert rows_when_asked == [8]
