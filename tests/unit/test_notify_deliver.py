"""The delivery thread's loop and the url's redaction at their edges: what `make mutation` found untold apart."""

from __future__ import annotations

import sqlite3
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from msgspec import structs

from app.config import Config, NotifySettings, NotifyTarget
from app.notify import outbox
from app.notify.deliver import IDLE_WAIT_S, Deliverer, Outcome, describe, redact, send
from app.notify.formats import Message
from app.store.db import connect, write

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
    config = Config(notify=settings)
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


class Answers:
    """A local HTTP receiver answering each path with its (status, body); '/stall' sends 200 and the first
    4096 bytes of a longer body, then holds the connection open until `release` is set. Keeps each request."""

    def __init__(self, routes: dict[str, tuple[int, bytes]]) -> None:
        self.requests, self.release = [], threading.Event()
        answers = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                answers.requests.append((self.command, dict(self.headers),
                                         self.rfile.read(int(self.headers["Content-Length"]))))
                if self.path == "/stall":
                    self.send_response(200)
                    self.send_header("Content-Length", "8192")
                    self.end_headers()
                    self.wfile.write(b"k" * 4096)
                    self.wfile.flush()
                    answers.release.wait(30)
                    return
                status, reply = routes[self.path]
                self.send_response(status)
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def target(self, kind: str, route: str) -> NotifyTarget:
        return NotifyTarget("t", kind, f"http://127.0.0.1:{self.server.server_address[1]}{route}")

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def answers():
    made = Answers({"/ok": (200, b"ok"), "/bad-request": (400, b"no"), "/unauthorized": (401, b"no"),
                    "/wecom-empty": (200, b"{}"), "/wecom-text": (200, b"ok"), "/wecom-list": (200, b"[1]"),
                    "/wecom-93000": (200, b'{"errcode": 93000}'), "/wecom-45009": (200, b'{"errcode": 45009}'),
                    "/wecom-minus1": (200, b'{"errcode": -1}'), "/wecom-odd": (200, b'{"errcode": "bad"}')})
    yield made
    made.close()


def test_a_push_is_a_json_post_that_names_board(answers):
    assert send(answers.target("webhook", "/ok"), b'{"a": 1}', 5) == Outcome(200, None, retry=False)
    method, headers, data = answers.requests[-1]
    assert (method, headers["Content-Type"], headers["User-Agent"], data) == \
        ("POST", "application/json; charset=utf-8", "board-notify", b'{"a": 1}')


def test_a_400_is_given_up_like_any_refusal_but_408_and_429(answers):
    assert send(answers.target("webhook", "/bad-request"), b"{}", 5) == \
        Outcome(400, "HTTP 400 Bad Request", retry=False)
    assert send(answers.target("webhook", "/unauthorized"), b"{}", 5) == \
        Outcome(401, "HTTP 401 Unauthorized", retry=False)


@pytest.mark.parametrize(("route", "outcome"), [
    ("/wecom-empty", Outcome(200, None, retry=False)),  # no errcode: taken
    ("/wecom-text", Outcome(200, None, retry=False)),  # not JSON: the 200 stands
    ("/wecom-list", Outcome(200, None, retry=False)),
    ("/wecom-93000", Outcome(200, "WeCom errcode 93000", retry=False)),  # a bad key: retrying cannot cure it
    ("/wecom-45009", Outcome(200, "WeCom errcode 45009", retry=True)),  # rate limited
    ("/wecom-minus1", Outcome(200, "WeCom errcode -1", retry=True)),  # busy
    ("/wecom-odd", Outcome(200, "WeCom errcode ?", retry=False)),  # not a number: shown as ?, never a crash
])
def test_wecom_answers_are_read_for_their_errcode(answers, route, outcome):
    assert send(answers.target("wecom", route), b"{}", 5) == outcome


def test_the_answer_is_read_no_further_than_its_first_4096_bytes(answers):
    """A receiver that answers 200 and then trickles or stalls its body does not hold the push to its timeout."""
    assert send(answers.target("webhook", "/stall"), b"{}", 5) == Outcome(200, None, retry=False)


def test_a_url_file_without_a_web_address_is_retried_and_says_why(tmp_path):
    (tmp_path / "url").write_text("ftp://files.example/hook\n")
    target = NotifyTarget("t", "webhook", url_file=str(tmp_path / "url"))
    assert send(target, b"{}", 5) == \
        Outcome(None, "its url_file does not hold an http:// or https:// address", retry=True)


def test_describe_names_the_host_and_a_port_only_when_the_url_has_one(tmp_path):
    assert describe(NotifyTarget("team", "wecom", "https://qyapi.example/cgi?key=K")) == "team (wecom, qyapi.example)"
    assert describe(NotifyTarget("ops", "slack", "http://u:p@hooks.example:8080/x")) == "ops (slack, hooks.example:8080)"
    assert describe(NotifyTarget("ops", "slack", url_file=str(tmp_path / "missing"))) == \
        "ops (slack, url_file unreadable)"


def test_redaction_takes_a_query_value_whole_and_secrets_from_four_characters():
    target = NotifyTarget("ops", "webhook", "https://hooks.example/p?key=ab=cdef&k=wxyz&j=abc")
    assert redact("ab=cdef wxyz abc", target) == "<secret> <secret> abc"


def test_a_pass_reads_the_outbox_twenty_rows_at_a_time(tmp_path):
    """Each read is a job on the database thread: a long outbox goes in batches, oldest first."""
    conn = connect(tmp_path / "board.db")
    settings = NotifySettings(targets=(TARGET,))
    ids = [i for n in range(21) for i in outbox.enqueue(conn, settings, Message("test", n, f"t{n}"), now=100)]
    assert [row.id for row in outbox.due(conn, 100)] == ids[:20]
    conn.close()


def test_a_row_for_a_target_no_longer_configured_is_given_up_and_says_why(tmp_path):
    conn = connect(tmp_path / "board.db")
    (row_id,) = outbox.enqueue(conn, NotifySettings(targets=(TARGET,)), Message("alert.firing", 1, "hot"), now=100)
    sent, lines = [], []
    deliverer = Deliverer(Config(), lambda: 100.0, lambda fn: fn(), lambda: conn, log=lines.append,
                          send=lambda *a: sent.append(a))
    assert deliverer.pass_once() == 1
    ((state, attempts, error),) = [(r.state, r.attempts, r.last_error) for r in outbox.rows(conn, [row_id])]
    assert (state, attempts, error, sent, lines, deliverer.counts) == \
        ("failed", 1, "no such target in [[notify.targets]] any more", [], [],
         {"sent": 0, "failed_tries": 1, "given_up": 1})
    conn.close()


def test_an_enqueue_to_every_target_commits_whole_or_not_at_all(tmp_path):
    conn = connect(tmp_path / "board.db")
    conn.execute("CREATE TRIGGER refuse_b BEFORE INSERT ON outbox WHEN NEW.target = 'b'"
                  " BEGIN SELECT RAISE(ABORT, 'refused'); END")
    settings = NotifySettings(targets=(structs.replace(TARGET, name="a"), structs.replace(TARGET, name="b")))
    with pytest.raises(sqlite3.IntegrityError, match="refused"):
        outbox.enqueue(conn, settings, Message("alert.firing", 1, "hot"), now=100)
    assert conn.execute("SELECT count(*) FROM outbox").fetchone()[0] == 0
    conn.close()


def test_a_key_pushes_once_also_inside_the_callers_transaction(tmp_path):
    conn = connect(tmp_path / "board.db")
    settings = NotifySettings(targets=(TARGET,))
    with write(conn):
        first = outbox.enqueue(conn, settings, Message("alert.firing", 1, "hot"), now=100, key="rule-1")
        again = outbox.enqueue(conn, settings, Message("alert.firing", 2, "hot"), now=101, key="rule-1")
    assert (len(first), again, conn.execute("SELECT count(*) FROM outbox").fetchone()[0]) == (1, [], 1)
    conn.close()
