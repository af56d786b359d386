"""llama-servers on booked cards, end to end: the real CLI, a real llama-server, a tiny real model."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
import urllib.request

import psutil
import pytest

from app.llama.health import health
from app.llama.identity import group_members
from tests.llama.conftest import make_fake_server

pytestmark = pytest.mark.usefixtures("_subreaper")

SERVER_KEYS = {"id", "booking_id", "user", "cards", "model", "port", "pid", "state", "started", "log"}


def get(url: str, timeout: float = 5, key: str | None = None):
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def chat(url: str, key: str, text: str = "hello") -> dict:
    body = json.dumps({"messages": [{"role": "user", "content": text}], "max_tokens": 4}).encode()
    request = urllib.request.Request(f"{url}/v1/chat/completions", data=body,
                                     headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200
        return json.loads(response.read())


def events(board, action: str) -> list[dict]:
    return [e for e in board.json("log", "--limit", "200")["events"] if e["action"] == action]


def group_alive(pgid: int) -> list[int]:
    """psutil's view: live (non-zombie) processes in the group."""
    alive = []
    for process in psutil.process_iter(["pid", "status"]):
        try:
            if os.getpgid(process.pid) == pgid and process.info["status"] != psutil.STATUS_ZOMBIE:
                alive.append(process.pid)
        except (ProcessLookupError, psutil.Error):
            continue
    return alive


class TestStartAnswerStop:
    def test_start_serves_chat_on_the_booked_cards_and_stop_leaves_nothing(self, board, tiny_model):
        booking = board.book("7,3,4")  # two switches: 3 under one, 4 and 7 under the other
        started = time.monotonic()
        result = board.ok("serve", "start", str(booking), "--model", str(tiny_model), "--ctx", "256",
                          "--parallel", "2", "--metrics")
        took = time.monotonic() - started
        assert "ready" in result.stdout and f"http://127.0.0.1:{board.port_min}" in result.stdout
        assert "starting server 1" in result.stderr  # progress goes to stderr
        assert took < 30

        [server] = board.json("serve", "list")["servers"]
        assert SERVER_KEYS <= set(server)
        assert server["state"] == "ready" and server["booking_id"] == booking and server["port"] == board.port_min
        assert server["cards"] == [3, 4, 7]  # topology order: the closest cards sit next to each other
        url = server["url"]
        assert get(f"{url}/health")[0] == 200
        # Its own key: nothing but /health answers without it; the holder reads it with `serve key`.
        assert "api_key" not in server
        key = board.ok("serve", "key", str(server["id"])).stdout.strip()
        assert len(key) >= 32 and key not in board.ok("serve", "list", "--json").stdout + json.dumps(server)
        assert get(f"{url}/metrics")[0] == 401 and get(f"{url}/v1/models", key="wrong")[0] == 401
        answer = chat(url, key)
        assert answer["choices"][0]["message"]["role"] == "assistant"
        assert answer["usage"]["completion_tokens"] >= 1
        status, metrics = get(f"{url}/metrics", key=key)
        assert status == 200 and b"llamacpp:tokens_predicted_total" in metrics
        # through a pipe, in no file: llama-server's --api-key-file is its own descriptor of that pipe
        *_, flag, key_file = psutil.Process(server["pid"]).cmdline()
        assert (flag, key_file.rsplit("/", 1)[0]) == ("--api-key-file", "/dev/fd")
        assert stat.S_ISFIFO(os.stat(f"/proc/{server['pid']}/fd/{key_file.rsplit('/', 1)[1]}").st_mode)
        assert [f for f in board.tmp_path.rglob("*") if f.is_file() and not f.name.startswith("board.db")
                and key.encode() in f.read_bytes()] == []  # (the user's own database keeps it, as the service's)

        # The recipe: pinned to the booked cards' UUIDs, loopback only, the leased port.
        process = psutil.Process(server["pid"])
        env = process.environ()
        uuids = [f"GPU-5090sim-0000-0000-0000-{i:012d}" for i in (3, 4, 7)]
        assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
        assert env["CUDA_VISIBLE_DEVICES"] == ",".join(uuids)
        cmdline = process.cmdline()
        assert cmdline == server["cmdline"]
        for flag, value in (("--host", "127.0.0.1"), ("--port", str(server["port"])), ("-c", "256"), ("-np", "2"),
                            ("-ngl", "999"), ("--split-mode", "layer"), ("-m", str(tiny_model))):
            assert cmdline[cmdline.index(flag) + 1] == value
        assert "--metrics" in cmdline
        # Its own session and process group, led by the supervisor: it survives the CLI and the SSH session.
        assert os.getpgid(server["pid"]) == server["pgid"] == server["supervisor_pid"]
        assert os.getsid(server["pid"]) == server["pgid"] != os.getsid(0)

        # Demo mode: the simulated fleet shows the server as a process on each booked card.
        cards = {c["index"]: c for c in board.json("status")["cards"]}
        for index in (3, 4, 7):
            assert server["pid"] in [p["pid"] for p in cards[index]["processes"]]
            assert cards[index]["state"] == "IN USE"
        assert server["pid"] not in [p["pid"] for p in cards[2]["processes"]]

        stopped = board.ok("serve", "stop", str(server["id"]))
        assert "stopped server 1" in stopped.stdout
        after = board.server(server["id"])
        assert after["state"] == "stopped" and after["exit_code"] == 0
        assert board.gone(after), "a process of the server's group is still there"
        assert group_alive(server["pgid"]) == [] and group_members(server["pgid"]) == []
        assert health(server["host"], server["port"], timeout=0.5) is None  # nothing listens any more
        assert [e["ok"] for e in events(board, "server-start")] == [True]
        assert [e["details"]["server"] for e in events(board, "server-stop")] == [1]
        log = board.ok("serve", "logs", "1").stdout
        assert "llama_server: model loaded" in log or "listening" in log
        assert "board: llama-server" in log and "exit code 0" in log

    def test_no_wait_returns_at_launch_and_the_supervisor_marks_ready(self, board, tiny_model):
        booking = board.book("2")
        result = board.ok("serve", "start", str(booking), "--model", str(tiny_model), "--ctx", "256", "--no-wait")
        assert "starting server 1" in result.stdout
        server = board.wait_state(1, ("ready",))
        assert server["state"] == "ready"  # nobody waited: the supervisor saw /health 200 itself
        board.ok("serve", "stop", "1")
        assert board.gone(board.server(1))

    def test_two_servers_on_one_booking_lease_different_ports(self, board, tiny_model):
        import socket

        booking = board.book("3")
        squatter = socket.socket()  # someone else's program holds the first port of the range
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", board.port_min))
        squatter.listen()
        try:
            first = board.start(booking, tiny_model)
            second = board.start(booking, tiny_model)
        finally:
            squatter.close()
        assert first["port"] == board.port_min + 1 and second["port"] == board.port_min + 2
        taken = board.run("serve", "start", str(booking), "--model", str(tiny_model), "--port", str(first["port"]))
        assert taken.returncode == 3 and "leased to another server" in taken.stderr
        for server in (first, second):
            board.ok("serve", "stop", str(server["id"]))
            assert board.gone(board.server(server["id"]))


@pytest.fixture(scope="module")
def mid_model(tmp_path_factory):
    """About 91 MiB of F16 weights (tests/fit/shapes.py): figures well above rounding."""
    from tests.fit.shapes import write_model

    return write_model(tmp_path_factory.mktemp("mid") / "mid.gguf", "mid")


class TestMemory:
    def test_the_servers_own_figures_are_recorded_beside_the_estimate(self, board, mid_model):
        from app.config import Config
        from app.fit.estimate import Settings, cpu_totals
        from app.fit.gguf_model import read_model
        from app.fit.request import for_server, limits
        from app.llama.memory import Measured, read_memory

        # An earlier server's log under the same name (ids restart with a new database): a load cut short,
        # whose buffer lines must not count for this server.
        (board.tmp_path / "servers").mkdir()
        (board.tmp_path / "servers" / "1.log").write_text(
            "load_tensors:        CUDA0 model buffer size =  5000.00 MiB\n")
        started = board.start(board.book("2"), mid_model)  # waits for ready
        # Recorded with the ready report: the start's own answer has them.
        assert started["state"] == "ready" and started["measured"] is not None
        with open(started["log"]) as log:
            earlier, *own = log.readlines()
        assert "CUDA0" in read_memory([earlier, *own]).devices  # read whole, the earlier lines would count
        assert started["measured"] == read_memory(own).to_json()
        measured = Measured.from_json(started["measured"])
        settings = Settings(ctx=256, parallel=1)
        predicted = cpu_totals(read_model(str(mid_model)), settings)
        assert measured.weights_mib == pytest.approx(predicted["weights_mib"], abs=0.01) and measured.weights_mib > 90
        assert measured.kv_mib == pytest.approx(predicted["kv_mib"], abs=0.01)
        assert measured.compute_mib > 0 and measured.kv_cells == 256
        # The estimate the start was checked against (what the CLI computed in the member's process).
        estimate = for_server(read_model(str(mid_model)), settings, limits(Config()), 1, force=False)
        assert started["estimate"] == estimate and estimate["per_card_mib"][0] > measured.total_mib

        [listed] = board.json("serve", "list")["servers"]
        assert (listed["measured"], listed["estimate"]) == (started["measured"], started["estimate"])
        table = board.ok("serve", "list").stdout.splitlines()
        assert table[0].split()[8] == "MEM"
        assert table[1].split()[8] == f"{measured.total_mib:.0f}/{estimate['per_card_mib'][0]}M"
        # A later fit of the same model and settings names the measurement (this CPU build has no CUDA device
        # to map onto a card, so the figure is the total); other settings do not match it.
        later = board.json("fit", str(mid_model), "--ctx", "256", "--for", "1h")
        assert later["measured"]["server"] == 1
        assert later["measured"]["total_mib"] == pytest.approx(measured.total_mib, abs=0.1)
        assert "measured on this server on " in board.ok("fit", str(mid_model), "--ctx", "256", "--for", "1h").stdout
        assert "measured" not in board.json("fit", str(mid_model), "--ctx", "512", "--for", "1h")
        board.ok("serve", "stop", "1")
        assert board.gone(board.server(1))

    def test_a_server_that_logs_no_figures_is_ready_all_the_same(self, fake_board, tiny_model):
        fake_board.env["BOARD_LLAMA_SERVER"] = str(make_fake_server(fake_board.tmp_path, status=200))
        server = fake_board.start(fake_board.book("4"), tiny_model)
        assert server["state"] == "ready" and server["measured"] is None
        [planned] = server["estimate"]["per_card_mib"]
        assert fake_board.ok("serve", "list").stdout.splitlines()[1].split()[8] == f"-/{planned}M"
        fake_board.ok("serve", "stop", str(server["id"]))
        assert fake_board.gone(fake_board.server(server["id"]))


class TestCrash:
    def test_kill_9_of_llama_server_is_recorded_as_crashed_with_exit_info(self, board, tiny_model):
        server = board.start(board.book("0"), tiny_model)
        os.kill(server["pid"], signal.SIGKILL)
        crashed = board.wait_state(server["id"], ("crashed",))
        assert crashed["state"] == "crashed"
        assert crashed["exit_signal"] == 9 and crashed["exit_code"] is None
        assert crashed["exit"] == "killed by signal 9 (SIGKILL)"
        assert 0 < len(crashed["log_tail"]) <= 20
        assert any("listening" in line or "model loaded" in line for line in crashed["log_tail"])
        assert board.gone(crashed)
        [event] = events(board, "server-crash")
        assert event["details"]["exit"] == "killed by signal 9 (SIGKILL)"
        listed = board.ok("serve", "list").stdout
        assert "crashed" in listed and "SIGKILL" in listed
        # Stopping a crashed server is harmless and says so.
        again = board.ok("serve", "stop", str(server["id"]))
        assert "already ended: crashed" in again.stdout

    def test_kill_9_of_the_supervisor_takes_the_server_along_and_board_notices(self, board, tiny_model):
        server = board.start(board.book("1"), tiny_model)
        os.kill(server["supervisor_pid"], signal.SIGKILL)
        assert board.gone(server, timeout=10), "llama-server outlived its supervisor"
        found = board.server(server["id"])  # `serve list` reconciles
        assert found["state"] == "crashed"
        assert "exit status unknown" in found["reason"]


class TestIdentity:
    def test_a_reused_pid_is_never_signalled(self, board, tiny_model):
        booking = board.book("5")
        server = board.start(booking, tiny_model)
        board.ok("serve", "stop", str(server["id"]))
        assert board.gone(board.server(server["id"]))
        # An unrelated process now sits at the PIDs the row points to (as after PID reuse).
        bystander = subprocess.Popen(["sleep", "60"], start_new_session=True)
        try:
            with board.raw() as conn:
                conn.execute(
                    "UPDATE servers SET state = 'ready', pid = ?, pgid = ?, supervisor_pid = ?, ended_at = NULL,"
                    " exit_code = NULL WHERE id = ?",
                    (bystander.pid, bystander.pid, bystander.pid, server["id"]),
                )
            # Same PID, wrong start time and command line: stop, the agent and list must leave it alone.
            board.ok("release", str(booking))
            board.ok("agent", "--once")
            result = board.ok("serve", "stop", str(server["id"]))
            assert bystander.poll() is None, "board signalled a process that is not its server"
            assert "already ended: crashed" in result.stdout
            found = board.server(server["id"])
            assert found["state"] == "crashed" and "exit status unknown" in found["reason"]
        finally:
            bystander.kill()
            bystander.wait()

    def test_same_pid_and_start_time_but_another_command_line_is_not_ours(self):
        from app.llama.identity import ProcessIdentity, capture, check

        me = capture(os.getpid())
        assert check(me) == "match"
        assert check(ProcessIdentity(me.pid, me.started, me.cmdline + ("--other",))) == "other"
        assert check(ProcessIdentity(me.pid, me.started + 1.0, me.cmdline)) == "other"
        child = subprocess.Popen(["true"])
        child.wait()
        assert check(ProcessIdentity(child.pid, me.started, ("true",))) == "gone"


class TestRefusals:
    def test_no_active_booking_exits_4_and_is_audited(self, fake_board, tiny_model):
        fake_board.env["BOARD_LLAMA_SERVER"] = str(make_fake_server(fake_board.tmp_path, status=200))
        later = fake_board.json("book", "--cards", "0", "--start", "+2h", "--for", "1h")["id"]
        result = fake_board.run("serve", "start", str(later), "--model", str(tiny_model))
        assert result.returncode == 4
        assert f"booking {later} is not active now (starts " in result.stderr and ", in 2 h); " in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
        released = fake_board.book("1")
        fake_board.ok("release", str(released))
        ended = fake_board.run("serve", "start", str(released), "--model", str(tiny_model))
        assert ended.returncode == 4 and ("ended" in ended.stderr or "cancelled" in ended.stderr)
        refusals = [e for e in events(fake_board, "server-start") if not e["ok"]]
        assert len(refusals) == 2 and any("not active" in e["details"]["refused"] for e in refusals)
        assert fake_board.json("serve", "list", "--all")["servers"] == []

    def test_someone_elses_booking_exits_4(self, fake_board, tiny_model):
        fake_board.env["BOARD_LLAMA_SERVER"] = str(make_fake_server(fake_board.tmp_path, status=200))
        fake_board.ok("status")  # creates the database
        from app.config import Config
        from app.service.rules.bookings import BookingService
        from app.core.identity import Identity
        from app.gpu import open_source
        from app.store.db import connect

        fleet = open_source(True).read()
        conn = connect(fake_board.db)
        now = int(time.time())
        alice = BookingService(conn, Identity("alice", 1001, False), Config(), fleet.cards, fleet.topology)
        theirs = alice.create(cards=[6], start=now, end=now + 3600).id
        conn.close()
        result = fake_board.run("serve", "start", str(theirs), "--model", str(tiny_model))
        assert result.returncode == 4 and "belongs to alice" in result.stderr

    def test_force_starts_settings_that_do_not_fit_and_the_audit_says_so(self, fake_board, tiny_model):
        """`serve start --force`, the documented override: refused without it (exit 4, audited), started with it,
        and the start's audit event and the server row both carry the estimate marked forced."""
        fake_board.env["BOARD_LLAMA_SERVER"] = str(make_fake_server(fake_board.tmp_path, status=200))
        booking = fake_board.book("4")
        too_big = ("serve", "start", str(booking), "--model", str(tiny_model), "--ctx", "999999999", "--parallel", "64")
        refused = fake_board.run(*too_big)
        assert refused.returncode == 4 and "does not fit" in refused.stderr
        assert fake_board.servers() == []
        started = json.loads(fake_board.ok(*too_big, "--force", "--json").stdout)
        estimate = started["estimate"]
        assert (estimate["fits"], estimate["forced"]) == (False, True)
        assert estimate["per_card_mib"][0] > estimate["limit_mib"]
        (event,) = [e for e in events(fake_board, "server-start") if e["ok"]]
        assert (event["booking_id"], event["details"]["server"], event["details"]["fit"]) == (
            booking, started["id"], estimate)
        fake_board.ok("serve", "stop", str(started["id"]))
        assert fake_board.gone(fake_board.server(started["id"]))

    def test_bad_input_exits_2(self, fake_board, tiny_model, tmp_path):
        fake_board.env["BOARD_LLAMA_SERVER"] = str(make_fake_server(fake_board.tmp_path, status=200))
        booking = fake_board.book("0")
        not_gguf = tmp_path / "model.bin"
        not_gguf.write_bytes(b"PK\x03\x04")
        cases = [
            (["--model", str(tmp_path / "missing.gguf")], "no model file"),
            (["--model", str(not_gguf)], "not a GGUF file"),
            (["--model", str(tiny_model), "--ctx", "0"], "--ctx must be at least 1"),
            (["--model", str(tiny_model), "--port", "80"], "outside the server range"),
            (["--model", str(tiny_model), "--", "--port", "9999"], "extra argument --port is set by board"),
            (["--model", str(tiny_model), "--", "--host=0.0.0.0"], "extra argument --host is set by board"),
            (["--model", str(tiny_model), "--", "--log-file", str(tmp_path / "x")],
             "extra argument --log-file is not one board passes to llama-server"),
            (["--model", str(tiny_model), "--", "--chat-template-file", str(tmp_path / "t.jinja")],
             "extra argument --chat-template-file takes a file under [llama] model_dirs, and none is configured"),
        ]
        for args, message in cases:
            result = fake_board.run("serve", "start", str(booking), *args)
            assert result.returncode == 2, (args, result.stderr)
            assert message in result.stderr, (args, result.stderr)
        other_host = fake_board.run("serve", "start", str(booking), "--model", str(tiny_model), "--host", "0.0.0.0")
        assert other_host.returncode == 4 and "host 0.0.0.0 is not allowed" in other_host.stderr
        missing = fake_board.run("serve", "start", str(booking), "--model", str(tiny_model),
                                 env={"BOARD_LLAMA_SERVER": str(tmp_path / "nope")})
        assert missing.returncode == 2 and "make llama-server" in missing.stderr

    def test_only_the_holder_or_an_admin_stops(self, fake_board, tiny_model):
        fake_board.env["BOARD_LLAMA_SERVER"] = str(make_fake_server(fake_board.tmp_path, status=200))
        server = fake_board.start(fake_board.book("0"), tiny_model)
        with fake_board.raw() as conn:  # as if alice had started it
            conn.execute("UPDATE servers SET user = 'alice', uid = 1001 WHERE id = ?", (server["id"],))
        from app.config import Config
        from app.errors import NotPermitted
        from app.core.identity import Identity
        from app.llama.service import ServerService
        from app.store.db import connect

        conn = connect(fake_board.db)
        bob = ServerService(conn, Identity("bob", 1002, False), Config(db_path=fake_board.db))
        with pytest.raises(NotPermitted, match="belongs to alice"):
            bob.stop(server["id"])
        conn.close()
        assert fake_board.server(server["id"])["state"] == "ready"
        fake_board.ok("serve", "stop", str(server["id"]))  # root: an admin
        assert fake_board.gone(fake_board.server(server["id"]))


class TestBookingEnd:
    def test_agent_once_stops_a_server_whose_booking_ended(self, board, tiny_model):
        booking = board.book("6")
        server = board.start(booking, tiny_model)
        quiet = board.ok("agent", "--once", "--json")  # booking still active: nothing to do
        assert json.loads(quiet.stdout)["stopped"] == []
        board.ok("release", str(booking))
        done = json.loads(board.ok("agent", "--once", "--json").stdout)
        assert done["stopped"] == [server["id"]]
        after = board.server(server["id"])
        assert after["state"] == "stopped" and after["reason"] == f"booking {booking} ended"
        assert board.gone(after)
        [event] = events(board, "server-stop")
        assert event["details"]["reason"] == f"booking {booking} ended"

    def test_without_an_agent_the_supervisor_stops_it_as_a_backstop(self, board, tiny_model):
        booking = board.book("7")
        server = board.start(booking, tiny_model, env={"BOARD_LLAMA_BACKSTOP_S": "0"})
        board.ok("release", str(booking))
        after = board.wait_state(server["id"], ("stopped",), timeout=15)
        assert after["state"] == "stopped" and after["reason"] == f"booking {booking} ended"
        assert board.gone(after)


class TestSupervision:
    def test_not_ready_in_time_is_failed_and_stopped(self, tmp_path, tiny_model):
        from tests.llama.conftest import Board

        fake_board = Board(tmp_path, str(make_fake_server(tmp_path, status=503)), ready_timeout_s=1.5)
        booking = fake_board.book("0")
        result = fake_board.run("serve", "start", str(booking), "--model", str(tiny_model))
        assert result.returncode == 1
        assert "server 1 failed: not ready within 1.5 s" in result.stderr
        found = fake_board.server(1)
        assert found["state"] == "failed"
        assert any("fake llama-server" in line or "board: llama-server" in line for line in found["log_tail"])
        assert fake_board.gone(found)
        fake_board.cleanup()

    def test_a_server_that_ignores_sigterm_is_killed_after_10_s(self, fake_board, tiny_model):
        fake_board.env["BOARD_LLAMA_SERVER"] = str(make_fake_server(fake_board.tmp_path, status=200,
                                                                    ignore_term=True))
        server = fake_board.start(fake_board.book("0"), tiny_model)
        started = time.monotonic()
        fake_board.ok("serve", "stop", str(server["id"]))
        took = time.monotonic() - started
        assert 9.5 <= took < 30
        after = fake_board.server(server["id"])
        assert after["state"] == "stopped" and after["exit_signal"] == 9
        assert fake_board.gone(after)

    def test_logs_follow_ends_when_the_server_does(self, fake_board, tiny_model):
        fake_board.env["BOARD_LLAMA_SERVER"] = str(make_fake_server(fake_board.tmp_path, status=200))
        server = fake_board.start(fake_board.book("0"), tiny_model)
        follower = subprocess.Popen(
            [sys.executable, "-m", "app", "serve", "logs", str(server["id"]), "-f"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **fake_board.env},
        )
        time.sleep(0.5)
        fake_board.ok("serve", "stop", str(server["id"]))
        out, err = follower.communicate(timeout=10)
        assert follower.returncode == 0, err
        assert "fake llama-server on" in out and "board: llama-server" in out and "ended" in out


class TestDemo:
    def test_the_services_fleet_shows_a_demo_server_on_its_simulated_card(self, fake_board, tiny_model):
        """The service owns the simulated fleet: every board's fleet events (and `status`) show a demo server's
        process on its booked card, the way NVML would; no board reaches into the service to put it there."""
        from app.client.local import LocalClient
        from app.config import Config
        from app.core.identity import current_identity
        from app.gpu import open_source

        fake_board.env["BOARD_LLAMA_SERVER"] = str(make_fake_server(fake_board.tmp_path, status=200))
        server = fake_board.start(fake_board.book("3"), tiny_model)
        config = Config(db_path=fake_board.db)
        client = LocalClient.on(config, open_source(True), current_identity(config.admin_group))
        events = client.subscribe(("fleet",))
        try:
            fleet = next(event for event in events if event.get("event") == "fleet")["snapshot"]
            assert server["pid"] in [p["pid"] for p in fleet["cards"][3]["processes"]]
            assert [c["index"] for c in fleet["cards"] if any(p["pid"] == server["pid"] for p in c["processes"])] == [3]
        finally:
            events.close()
            client.close()


class TestAgent:
    def test_agent_warns_about_a_server_whose_booking_ends_within_10_minutes(self, fake_board, tiny_model):
        fake_board.env["BOARD_LLAMA_SERVER"] = str(make_fake_server(fake_board.tmp_path, status=200))
        soon = fake_board.json("book", "--cards", "0", "--for", "5m")["id"]
        later = fake_board.book("1")
        ending = fake_board.start(soon, tiny_model)
        fake_board.start(later, tiny_model)
        result = fake_board.ok("agent", "--once", "--json")
        assert json.loads(result.stdout) == {"crashed": [], "stopped": [], "warned": [ending["id"]]}
        assert f"server {ending['id']}" in result.stderr and "stops in 5 min" in result.stderr

    def test_agent_rejects_a_bad_interval(self, fake_board):
        result = fake_board.run("agent", "--interval", "0")
        assert result.returncode == 2 and "--interval" in result.stderr


class TestWaiting:
    def test_the_waiting_cli_notices_a_supervisor_that_died_and_does_not_wait_for_the_timeout(self, tmp_path,
                                                                                              tiny_model):
        from tests.llama.conftest import Board

        board = Board(tmp_path, str(make_fake_server(tmp_path, status=503)), ready_timeout_s=120)
        try:
            booking = board.book("0")
            waiting = subprocess.Popen(
                [sys.executable, "-m", "app", "serve", "start", str(booking), "--model", str(tiny_model)],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **board.env},
            )
            deadline = time.monotonic() + 10
            while True:
                with board.raw() as conn:
                    row = conn.execute("SELECT supervisor_pid, pid FROM servers").fetchone()
                if row and row[0] and row[1]:
                    break
                assert time.monotonic() < deadline
                time.sleep(0.05)
            os.kill(row[0], signal.SIGKILL)
            started = time.monotonic()
            out, err = waiting.communicate(timeout=30)
            assert waiting.returncode == 1 and time.monotonic() - started < 5
            assert "server 1 crashed" in err and "exit status unknown" in err
            assert board.gone(board.server(1))
        finally:
            board.cleanup()
