"""/metrics against scrapers that never finish their request: a crowd of them, and one that trickles a byte at a time.

Each waits out the request deadline (seconds), so these are here rather than in tests/unit/test_metrics.py, which
`make mutation` runs for every metrics mutant; the rest of /metrics' bounds (MAX_SCRAPES workers, the one past them
closed at once, a close that does not wait) are there."""

from __future__ import annotations

import threading

from app.service.box import metrics as metrics_module
from app.service.box.metrics import MAX_SCRAPES
from tests.unit import test_metrics
from tests.unit.test_metrics import close_ended, ended, half_open, scrape

_quick_stop, service, metrics = test_metrics._quick_stop, test_metrics.service, test_metrics.metrics  # its fixtures


class TestBounded:
    """Anyone who reaches the port may connect: /metrics holds at most MAX_SCRAPES of them, each for one deadline."""

    def test_a_crowd_of_half_open_requests_gets_no_more_than_max_scrapes_threads(self, metrics, monkeypatch):
        monkeypatch.setattr(metrics_module, "REQUEST_TIMEOUT_S", 3.0)
        before = threading.active_count()
        crowd = [half_open(metrics) for _ in range(3 * MAX_SCRAPES)]
        held = close_ended(crowd, 2 * MAX_SCRAPES, timeout_s=10)  # those past the cap: closed at once, unread
        assert len(held) <= MAX_SCRAPES, f"{len(held)} connections held"
        assert threading.active_count() - before <= MAX_SCRAPES
        assert close_ended(held, len(held), timeout_s=15) == []  # the others at their deadline, with no answer
        assert len(scrape(metrics)["board_gpu_state"]) == 40  # and then it serves again

    def test_a_request_trickled_a_byte_at_a_time_is_closed_at_its_deadline(self, metrics, monkeypatch):
        monkeypatch.setattr(metrics_module, "REQUEST_TIMEOUT_S", 1.0)
        slow = half_open(metrics)
        for _ in range(20):  # a header byte every 0.2 s: 4 s, four times the deadline, never a whole request
            if ended(slow, 200):
                break
            slow.send(b"X")
        else:
            raise AssertionError("a request trickled a byte at a time was never closed")
        slow.close()
