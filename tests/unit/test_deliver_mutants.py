"""The delivery thread's loop and the url's redaction at their edges: what `make mutation` found untold apart."""

from __future__ import annotations

import threading
from dataclasses import replace

from app.config import Config, NotifySettings, NotifyTarget
from app.notify import outbox
from app.notify.deliver import IDLE_WAIT_S, Deliverer, redact
from app.notify.formats import Message
from app.store.db import connect

TARGET = NotifyTarget("ops", "webhook", "https://hooks.example/T0/B1?key=SEKRITKEY&x=1")


class Turns(threading.Event):
    """The deliverer's wake event: notes each wait and stops the loop after `n` of them, without sleeping."""

    def __init__(self, stopping: threading.Event, n: int = 1):
        super().__init__()
        self.stopping, self.n, self.waits = stopping, n, []

    def wait(self, timeout=None):
        self.waits.append(timeout)
        if len(self.waits) >= self.n:
            self.stopping.set()
        return False


def waits_with(tmp_path, now: float, next_at: int | None, run_db=None, log=None) -> list:
    tmp_path.mkdir(exist_ok=True)
    conn = connect(tmp_path / "board.db")
    settings = NotifySettings(targets=(TARGET,))
    if next_at is not None:
        outbox.enqueue(conn, settings, Message("test", 1, "t"), now=next_at)
    config = replace(Config(), notify=settings)
    stopping = threading.Event()
    deliverer = Deliverer(config, lambda: now, run_db or (lambda fn: fn()), lambda: conn, log=log or print,
                          send=lambda *a: None)
    deliverer.wake = Turns(stopping)
    deliverer.run(stopping)
    conn.close()
    return deliverer.wake.waits


def test_the_loop_sleeps_until_the_next_row_is_due_and_no_longer_than_the_idle_wait(tmp_path):
    assert waits_with(tmp_path / "a", 100.0, None) == [IDLE_WAIT_S]  # nothing pending
    assert waits_with(tmp_path / "b", 100.0, 130) == [30.0]
    assert waits_with(tmp_path / "c", 129.99, 130) == [0.05]  # due in a moment: a short floor, not a busy loop
    assert waits_with(tmp_path / "d", 100.0, 100 + 10 * int(IDLE_WAIT_S)) == [IDLE_WAIT_S]


def test_a_failed_pass_is_logged_and_waits_the_idle_time(tmp_path):
    def broken(fn):
        raise OSError("database is locked")

    lines = []
    assert waits_with(tmp_path, 100.0, None, run_db=broken, log=lines.append) == [IDLE_WAIT_S]
    assert lines == ["notify: delivery pass failed: OSError"]


def test_redaction_removes_user_info_and_each_query_value():
    target = NotifyTarget("ops", "webhook", "https://robot:PASSWORD@hooks.example/p?key=SEKRITKEY&token=TOKENVAL")
    text = redact("robot PASSWORD key=SEKRITKEY TOKENVAL XXXX", target)
    assert text == "<secret> <secret> <secret> <secret> XXXX"


def test_an_unreadable_url_file_redacts_nothing_and_does_not_fail(tmp_path):
    target = NotifyTarget("ops", "webhook", url_file=str(tmp_path / "missing"))
    assert redact("HTTP 500 XXXX None", target) == "HTTP 500 XXXX None"
