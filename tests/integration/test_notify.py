"""Pushes against a real HTTP receiver on 127.0.0.1: what arrives, failures and retries, restarts, and a
service that keeps answering while a receiver hangs. The target urls carry secrets ("SEKRIT") that must
never reach a log line, the outbox's errors, the audit log or the CLI's output."""

from __future__ import annotations

import json
import os
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from app.config import Config, NotifySettings, NotifyTarget, Policy, PostgresStore
from app.core.identity import Identity
from app.errors import BadInput, NotPermitted
from app.gpu import open_source
from app.notify import outbox
from app.notify.formats import Message, body
from app.service import Service
from app.gpu.fleet import Fleet
from app.service.box.notify import deliverer, push
from tests.conftest import Clock, FROZEN_NOW, run_board

ADMIN = Identity("root", 0, True)
MEMBER = Identity("alice", 1001, False)
WAIT_S = 30  # only how long a test waits for something that should happen at once; nothing asserts on time


class Receiver:
    """An HTTP server that records each POST and answers as its path says: /ok, /fail (500), /gone (404),
    /wecom-ok, /wecom-bad (200 with a WeCom errcode), /slow (waits for `gate`, then 200), /garbage (no HTTP),
    /busy (429 Too Many Requests, then 200), /late (408 Request Timeout, then 200)."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict, bytes]] = []
        self.arrived, self.gate, self.answering = threading.Event(), threading.Event(), threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                data = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.requests.append((self.path, dict(self.headers), data))
                receiver.arrived.set()
                route = self.path.split("/")[1]
                if route == "slow":
                    receiver.gate.wait(WAIT_S)
                receiver.answering.set()  # before the answer: a sender that waited for it sees this set
                if route == "garbage":  # not HTTP at all
                    self.wfile.write(b"garbage\r\n\r\n")
                    self.close_connection = True
                    return
                again = any(path.split("/")[1] == route for path, _, _ in receiver.requests[:-1])
                if route in ("busy", "late") and not again:  # the first answer only
                    route = {"busy": "429", "late": "408"}[route]
                status, reply = {"fail": (500, b"oops"), "gone": (404, b"no such hook"),
                                 "429": (429, b"rate limited"), "408": (408, b"too slow"),
                                 "wecom-bad": (200, b'{"errcode": 93000, "errmsg": "invalid webhook url SEKRIT"}'),
                                 "wecom-ok": (200, b'{"errcode": 0, "errmsg": "ok"}')}.get(route, (200, b"ok"))
                try:
                    self.send_response(status)
                    self.send_header("Content-Length", str(len(reply)))
                    self.end_headers()
                    self.wfile.write(reply)
                except OSError:
                    pass  # the client gave up (a timeout test)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def url(self, route: str) -> str:
        return f"http://127.0.0.1:{self.port}/{route}/T0/SEKRIT-PATH?key=SEKRIT-KEY"

    def bodies(self, route: str) -> list[dict]:
        return [json.loads(data) for path, _, data in self.requests if path.split("/")[1] == route]

    def close(self) -> None:
        self.gate.set()
        self.server.shutdown()
        self.server.server_close()


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


def make_service(tmp_path, targets, clock, **notify) -> Service:
    config = Config(db_path=tmp_path / "board.db", storage_url=os.environ.get("BOARD_DB_URL"),
                    notify=NotifySettings(targets=tuple(targets), **notify), policy=Policy(timezone="UTC"))
    return Service(config, Fleet(open_source(True, clock=clock), config.refresh_seconds), clock=clock)


def rows_of(service) -> list[outbox.Row]:
    ids = [r[0] for r in service.conn.execute("SELECT id FROM outbox")]
    return outbox.rows(service.conn, ids)


def no_secret(*texts) -> None:
    for text in texts:
        assert "SEKRIT" not in str(text)


class TestDelivery:
    def test_each_type_gets_its_exact_payload(self, tmp_path, receiver):
        targets = [NotifyTarget("chat", "wecom", receiver.url("wecom-ok")), NotifyTarget("ops", "slack", receiver.url("ok")),
                   NotifyTarget("hook", "webhook", receiver.url("ok"))]
        service = make_service(tmp_path, targets, Clock())
        ids = push(service, "alert.firing", "GPU 3 at 92 °C", lines=("held by <@U1> alice",), fields=(("card", "3"),))
        assert len(ids) == 3
        assert deliverer(service, lambda fn: fn(), print).pass_once() == 3
        message = Message("alert.firing", FROZEN_NOW, "GPU 3 at 92 °C", ("held by <@U1> alice",), (("card", "3"),))
        got = {path.split("?")[0]: data for path, _, data in receiver.requests}
        assert got["/wecom-ok/T0/SEKRIT-PATH"] == body("wecom", message)
        assert sorted(data for path, _, data in receiver.requests if path.startswith("/ok/")) == \
            sorted([body("slack", message), body("webhook", message)])
        assert all(h["Content-Type"] == "application/json; charset=utf-8" for _, h, _ in receiver.requests)
        assert [(r.target, r.state, r.attempts, r.last_status) for r in rows_of(service)] == \
            [("chat", "sent", 1, 200), ("ops", "sent", 1, 200), ("hook", "sent", 1, 200)]

    def test_a_500_is_retried_with_backoff_then_given_up(self, tmp_path, receiver):
        clock, logs = Clock(), []
        service = make_service(tmp_path, [NotifyTarget("ops", "slack", receiver.url("fail"))], clock, max_attempts=3)
        push(service, "alert.firing", "hot")
        send = deliverer(service, lambda fn: fn(), logs.append)
        send.pass_once()
        (row,) = rows_of(service)
        assert (row.state, row.attempts, row.last_status, row.next_at) == ("pending", 1, 500, FROZEN_NOW + 30)
        push(service, "alert.resolved", "cool")
        send.pass_once()  # the first is not due yet, and the second waits behind it: nothing is sent
        assert len(receiver.requests) == 1 and outbox.next_due(service.conn) == FROZEN_NOW + 30
        clock.now += 30
        send.pass_once()
        row, _ = rows_of(service)
        assert (row.attempts, row.next_at, len(receiver.requests)) == (2, FROZEN_NOW + 30 + 60, 2)
        clock.now += 60
        send.pass_once()
        row, _ = rows_of(service)
        assert (row.state, row.attempts, row.last_error, len(receiver.requests)) == \
            ("failed", 3, "HTTP 500 Internal Server Error", 4)  # given up; then the second had its first try
        assert [b["text"] for b in receiver.bodies("fail")] == ["*hot*"] * 3 + ["*cool*"]
        assert logs[-2] == (f"notify: alert.firing #{row.id} to ops (slack, 127.0.0.1:{receiver.port}):"
                            " HTTP 500 Internal Server Error (given up)")
        assert "will retry" in logs[0]
        assert send.counts == {"sent": 0, "failed_tries": 4, "given_up": 1}
        no_secret(*logs)

    @pytest.mark.parametrize("route, status, reason", [("busy", 429, "Too Many Requests"),
                                                       ("late", 408, "Request Timeout")])
    def test_a_rate_limited_or_timed_out_chat_is_retried_and_the_retry_delivers(self, tmp_path, receiver, route,
                                                                                status, reason):
        """429 and 408 are the 4xx answers that trying again can cure: backed off, not given up (a 404 is)."""
        clock, logs = Clock(), []
        service = make_service(tmp_path, [NotifyTarget("chat", "slack", receiver.url(route))], clock)
        push(service, "alert.firing", "hot")
        send = deliverer(service, lambda fn: fn(), logs.append)
        send.pass_once()
        (row,) = rows_of(service)
        assert (row.state, row.attempts, row.last_status, row.last_error, row.next_at) == (
            "pending", 1, status, f"HTTP {status} {reason}", FROZEN_NOW + 30)
        assert logs[-1].endswith(f"HTTP {status} {reason} (will retry)")
        clock.now += 30
        send.pass_once()
        (row,) = rows_of(service)
        assert (row.state, row.attempts, row.last_status) == ("sent", 2, 200)
        assert [b["text"] for b in receiver.bodies(route)] == ["*hot*"] * 2
        assert send.counts == {"sent": 1, "failed_tries": 1, "given_up": 0}
        no_secret(*logs)

    def test_a_test_message_skips_the_line_behind_a_backing_off_push(self, tmp_path, receiver):
        service = make_service(tmp_path, [NotifyTarget("ops", "slack", receiver.url("fail"))], Clock())
        push(service, "alert.firing", "hot")
        send = deliverer(service, lambda fn: fn(), print)
        send.pass_once()  # failed: the alert backs off for 30 s
        outbox.enqueue(service.conn, service.config.notify, Message("test", FROZEN_NOW, "test"), now=FROZEN_NOW,
                       max_attempts=1)
        send.pass_once()
        assert [b["text"] for b in receiver.bodies("fail")] == ["*hot*", "*test*"]
        assert [(r.kind, r.state) for r in rows_of(service)] == [("alert.firing", "pending"), ("test", "failed")]

    def test_a_404_is_given_up_at_once(self, tmp_path, receiver):
        service = make_service(tmp_path, [NotifyTarget("hook", "webhook", receiver.url("gone"))], Clock())
        push(service, "alert.firing", "hot")
        deliverer(service, lambda fn: fn(), print).pass_once()
        assert [(r.state, r.attempts, r.last_status) for r in rows_of(service)] == [("failed", 1, 404)]

    def test_wecom_errcode_is_a_failure_and_its_message_is_not_kept(self, tmp_path, receiver):
        service = make_service(tmp_path, [NotifyTarget("chat", "wecom", receiver.url("wecom-bad"))], Clock())
        push(service, "alert.firing", "hot")
        deliverer(service, lambda fn: fn(), print).pass_once()
        assert [(r.state, r.last_status, r.last_error) for r in rows_of(service)] == \
            [("failed", 200, "WeCom errcode 93000")]

    def test_a_receiver_that_does_not_answer_times_out_and_is_retried(self, tmp_path, receiver):
        service = make_service(tmp_path, [NotifyTarget("ops", "slack", receiver.url("slow"))], Clock(), timeout_s=0.2)
        push(service, "alert.firing", "hot")
        deliverer(service, lambda fn: fn(), print).pass_once()
        assert receiver.arrived.is_set() and not receiver.gate.is_set()  # it was still holding the request
        assert [(r.state, r.attempts, r.last_status, r.last_error) for r in rows_of(service)] == \
            [("pending", 1, None, "no answer within 0.2 s")]

    def test_an_answer_that_is_not_http_is_retried(self, tmp_path, receiver):
        service = make_service(tmp_path, [NotifyTarget("ops", "slack", receiver.url("garbage"))], Clock())
        push(service, "alert.firing", "hot")
        deliverer(service, lambda fn: fn(), print).pass_once()
        (row,) = rows_of(service)
        assert (row.state, row.attempts, row.last_error.split(":")[0]) == ("pending", 1, "BadStatusLine")

    def test_nothing_listening_is_retried(self, tmp_path):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        service = make_service(tmp_path, [NotifyTarget("ops", "slack", f"http://127.0.0.1:{port}/SEKRIT")], Clock())
        push(service, "alert.firing", "hot")
        deliverer(service, lambda fn: fn(), print).pass_once()
        (row,) = rows_of(service)
        assert row.state == "pending" and row.last_error.startswith("could not connect") and row.last_status is None

    def test_the_url_can_live_in_a_file_only_the_service_reads(self, tmp_path, receiver):
        secret = tmp_path / "team.url"
        service = make_service(tmp_path, [NotifyTarget("ops", "slack", url_file=str(secret))], Clock())
        push(service, "alert.firing", "hot")
        send = deliverer(service, lambda fn: fn(), print)
        send.pass_once()  # no file yet: retried later, and the error names no url
        assert [(r.state, r.last_error) for r in rows_of(service)] == \
            [("pending", "cannot read url_file: No such file or directory")]
        secret.write_text(receiver.url("ok") + "\n")
        send.clock = Clock(FROZEN_NOW + 30)
        send.pass_once()
        assert [r.state for r in rows_of(service)] == ["sent"] and receiver.bodies("ok") == [{"text": "*hot*"}]

    def test_an_outbox_survives_a_restart(self, tmp_path, receiver):
        clock = Clock()
        first = make_service(tmp_path, [NotifyTarget("ops", "slack", receiver.url("fail"))], clock)
        push(first, "alert.firing", "one")
        deliverer(first, lambda fn: fn(), print).pass_once()  # failed once, retry in 30 s
        push(first, "alert.resolved", "two")  # never tried
        first.close()
        clock.now += 30
        second = make_service(tmp_path, [NotifyTarget("ops", "slack", receiver.url("ok"))], clock)
        assert deliverer(second, lambda fn: fn(), print).pass_once() == 2
        assert [(r.message.title, r.state, r.attempts) for r in rows_of(second)] == [("one", "sent", 2), ("two", "sent", 1)]
        assert [b["text"] for b in receiver.bodies("ok")] == ["*one*", "*two*"]

    def test_a_target_removed_from_the_config_is_given_up(self, tmp_path, receiver):
        clock = Clock()
        first = make_service(tmp_path, [NotifyTarget("old", "slack", receiver.url("ok"))], clock)
        push(first, "alert.firing", "one")
        first.close()
        second = make_service(tmp_path, [NotifyTarget("new", "slack", receiver.url("ok"))], clock)
        deliverer(second, lambda fn: fn(), print).pass_once()
        assert [(r.target, r.state) for r in rows_of(second)] == [("old", "failed")] and not receiver.requests

    def test_done_rows_are_pruned_after_two_days_and_pending_ones_kept(self, tmp_path, receiver):
        clock = Clock()
        service = make_service(tmp_path, [NotifyTarget("ops", "slack", receiver.url("ok")),
                                          NotifyTarget("down", "slack", receiver.url("fail"))], clock, max_attempts=99)
        push(service, "alert.firing", "one")
        send = deliverer(service, lambda fn: fn(), print)
        send.pass_once()
        clock.now += outbox.KEEP_S + 1
        send.pass_once()
        assert [(r.target, r.state) for r in rows_of(service)] == [("down", "pending")]

    def test_no_targets_means_no_rows(self, tmp_path):
        service = make_service(tmp_path, [], Clock())
        assert push(service, "alert.firing", "hot") == [] and rows_of(service) == []

    def test_a_key_pushes_once(self, tmp_path, receiver):
        service = make_service(tmp_path, [NotifyTarget("ops", "slack", receiver.url("ok"))], Clock())
        assert len(push(service, "alert.firing", "hot", key="alert:7:firing")) == 1
        assert push(service, "alert.firing", "hot", key="alert:7:firing") == []


class TestSummary:
    def test_the_summary_goes_once_at_its_time(self, tmp_path, receiver):
        nine = 1796115600  # 2026-12-01 09:00 UTC
        clock = Clock(nine - 60)
        service = make_service(tmp_path, [NotifyTarget("hook", "webhook", receiver.url("ok"))], clock,
                               summary_at=("09:00",))
        send = deliverer(service, lambda fn: fn(), print)
        send.pass_once()
        assert receiver.requests == []
        clock.now = nine + 5
        send.pass_once()
        clock.now = nine + 600
        send.pass_once()
        (summary,) = receiver.bodies("ok")
        assert summary["kind"] == "summary" and summary["title"].startswith("Board at 09:00 (UTC): ")
        assert summary["text"].count("\n") == 7 and summary["text"].startswith("GPU 0: ")  # the 8 simulated cards
        assert "Free now" in summary["fields"]


class TestNeverBlocks:
    def test_operations_answer_while_a_receiver_hangs(self, tmp_path, receiver):
        """The delivery thread holds a request open at the receiver; meanwhile `status` and a push are answered
        on the database thread, and the push goes out once the receiver lets go."""
        from app.service.door.server import ServiceServer

        service = make_service(tmp_path, [NotifyTarget("ops", "slack", receiver.url("slow"))], Clock(), timeout_s=WAIT_S)
        server = ServiceServer(service, str(tmp_path / "unused.sock"), log=lambda line: None)
        thread = service.start_notifier(lambda fn: server.database.submit(fn).result(), server.log, server.stopping)
        try:
            server.database.submit(lambda: push(service, "alert.firing", "first")).result(WAIT_S)
            assert receiver.arrived.wait(WAIT_S)
            # answered while the receiver still holds the POST (a bound on the wait, so a blocked service fails)
            status = server.database.submit(service.call, ADMIN, "status", None).result(WAIT_S)
            assert len(status["cards"]) == 8 and not receiver.answering.is_set()
            server.database.submit(lambda: push(service, "alert.firing", "second")).result(WAIT_S)
            pending = server.database.submit(lambda: [r.state for r in rows_of(service)]).result()
            assert pending == ["pending", "pending"] and not receiver.answering.is_set()
            receiver.gate.set()
            for _ in range(WAIT_S * 20):
                if server.database.submit(lambda: [r.state for r in rows_of(service)]).result() == ["sent", "sent"]:
                    break
                server.stopping.wait(0.05)
            assert [b["text"] for b in receiver.bodies("slow")] == ["*first*", "*second*"]
        finally:
            server.stopping.set()
            service.notifier.wake.set()
            thread.join(WAIT_S)
            server.database.shutdown(wait=True)


class TestNotifyTest:
    def test_admins_only(self, tmp_path, receiver):
        service = make_service(tmp_path, [NotifyTarget("ops", "slack", receiver.url("ok"))], Clock())
        with pytest.raises(NotPermitted, match="for admins"):
            service.call(MEMBER, "notify_test", {})
        with pytest.raises(NotPermitted):
            service.call(MEMBER, "notify_status", {"ids": [1]})
        assert receiver.requests == [] and rows_of(service) == []

    def test_an_unknown_target_or_none_configured(self, tmp_path, receiver):
        service = make_service(tmp_path, [NotifyTarget("ops", "slack", receiver.url("ok"))], Clock())
        with pytest.raises(BadInput, match="no target 'nope'; the targets are: ops"):
            service.call(ADMIN, "notify_test", {"target": "nope"})
        bare = make_service(tmp_path, [], Clock())
        with pytest.raises(BadInput, match=r"no \[\[notify.targets\]\] in the config; add one"):
            bare.call(ADMIN, "notify_test", {})

    def test_one_try_each_and_audited_without_the_url(self, tmp_path, receiver):
        service = make_service(tmp_path, [NotifyTarget("ops", "slack", receiver.url("ok")),
                                          NotifyTarget("down", "webhook", receiver.url("fail"))], Clock())
        queued = service.call(ADMIN, "notify_test", {})
        result = service.call(ADMIN, "notify_status", {"ids": queued["ids"]})
        where = f"127.0.0.1:{receiver.port}"
        assert [(r["where"], r["state"], r["attempts"], r["status"]) for r in result] == \
            [(f"ops (slack, {where})", "sent", 1, 200), (f"down (webhook, {where})", "failed", 1, 500)]
        (audit,) = service.call(ADMIN, "log", {"limit": 1})
        assert audit["action"] == "notify-test" and audit["details"] == {"targets": ["ops", "down"], "host": service.host}
        no_secret(result, audit, [tuple(r) for r in service.conn.execute("SELECT * FROM events")])
        assert receiver.bodies("fail")[0]["title"] == "board: a test message"


class TestCli:
    def config(self, tmp_path, *targets: tuple[str, str, str]) -> dict:
        path = tmp_path / "board.toml"
        path.write_text("".join(f'[[notify.targets]]\nname = "{n}"\ntype = "{t}"\nurl = "{u}"\n' for n, t, u in targets))
        return {"BOARD_CONFIG": str(path), "BOARD_DB": str(tmp_path / "board.db"), "BOARD_SIMULATE": "1", "TZ": "UTC",
                **({"BOARD_DB_URL": os.environ["BOARD_DB_URL"]} if "BOARD_DB_URL" in os.environ else {})}

    def test_reports_each_status_and_exits_0(self, tmp_path, receiver):
        done = run_board("notify", "test", env=self.config(tmp_path, ("team", "wecom", receiver.url("wecom-ok")),
                                                           ("ops", "slack", receiver.url("ok"))))
        assert (done.returncode, done.stderr) == (0, "")
        assert done.stdout.splitlines() == [f"team (wecom, 127.0.0.1:{receiver.port}): HTTP 200, sent",
                                            f"ops (slack, 127.0.0.1:{receiver.port}): HTTP 200, sent"]
        assert len(receiver.requests) == 2

    def test_a_failing_target_exits_1_and_says_why_without_the_url(self, tmp_path, receiver):
        env = self.config(tmp_path, ("team", "wecom", receiver.url("wecom-bad")), ("ops", "slack", receiver.url("ok")))
        done = run_board("notify", "test", env=env)
        assert done.returncode == 1
        assert done.stdout.splitlines()[0] == f"team (wecom, 127.0.0.1:{receiver.port}): HTTP 200, not sent: WeCom errcode 93000"
        only = run_board("notify", "test", "--target", "ops", "--json", env=env)
        assert only.returncode == 0 and [r["target"] for r in json.loads(only.stdout)["targets"]] == ["ops"]
        no_secret(done.stdout, done.stderr, only.stdout, only.stderr)

    def test_an_unknown_target_exits_2_in_one_line(self, tmp_path, receiver):
        done = run_board("notify", "test", "--target", "nope", env=self.config(tmp_path, ("ops", "slack", receiver.url("ok"))))
        assert (done.returncode, done.stdout) == (2, "")
        assert done.stderr == "board: no target 'nope'; the targets are: ops\n"
        assert receiver.requests == []

    def test_notify_without_an_action_says_which(self, tmp_path):
        done = run_board("notify", env=self.config(tmp_path))
        assert (done.returncode, done.stderr) == (2, "board: say which notify action: board notify test [--target NAME]\n")
