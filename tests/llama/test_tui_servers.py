"""The Servers screen (`s`) with Pilot: the list, the start dialog, stop behind a confirmation, the live log,
demo servers on their simulated cards, and the running board stopping a server whose booking ended."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import pytest

from app.config import Config, LlamaSettings
from app.core.identity import current_identity
from app.gpu import open_source
from tests.llama.conftest import make_fake_server

pytestmark = pytest.mark.usefixtures("_subreaper")

pytest.importorskip("textual")


def make_app(board, server_bin: str, model_dirs: tuple[str, ...] = ()):
    from app.tui.app import BoardApp

    config = Config(db_path=board.db, llama=LlamaSettings(
        server_bin=server_bin, port_min=board.port_min, port_max=board.port_max, model_dirs=model_dirs,
        ready_timeout_s=60))
    from app.client.local import LocalClient

    identity = current_identity(config.admin_group)
    client = LocalClient.on(config, open_source(True), identity)
    return BoardApp(client, identity=identity, config=config, clock=time.time, host="gpu-box")


async def until(pilot, condition, timeout: float = 45.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for the board")
        await pilot.pause(0.1)


def cells(app, server_id: int) -> list[str]:
    table = app.screen.query_one("#servers")
    return [str(c) for c in table.get_row(str(server_id))]


def state_of(app, server_id: int) -> str | None:
    try:
        return cells(app, server_id)[1]
    except Exception:  # noqa: BLE001 - not listed (yet)
        return None


class TestServersScreen:
    async def test_list_log_and_stop_behind_a_confirmation(self, fake_board, tiny_model):
        fake = str(make_fake_server(fake_board.tmp_path, status=200))
        fake_board.env["BOARD_LLAMA_SERVER"] = fake
        booking = fake_board.book("3")
        server = fake_board.start(booking, tiny_model)
        app = make_app(fake_board, fake)
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.press("s")
            from app.tui.screens.servers import ServersScreen

            await until(pilot, lambda: isinstance(app.screen, ServersScreen) and state_of(app, server["id"]) == "ready")
            row = cells(app, server["id"])
            assert row[2] == "tiny" and row[4] == "3" and row[5] == str(server["port"])
            log = app.screen.query_one("#log")
            await until(pilot, lambda: any("fake llama-server on" in line for line in log.lines))
            # Demo: the simulated card shows the server's process, so the card is IN USE.
            await until(pilot, lambda: app.fleet is not None and server["pid"] in
                        [p.pid for p in app.fleet.cards[3].processes])
            await pilot.press("x")
            await until(pilot, lambda: type(app.screen).__name__ == "ConfirmModal")
            await pilot.press("n")  # not yet
            await until(pilot, lambda: isinstance(app.screen, ServersScreen))
            assert fake_board.server(server["id"])["state"] == "ready"
            await pilot.press("x")
            await until(pilot, lambda: type(app.screen).__name__ == "ConfirmModal")
            await pilot.press("y")
            await until(pilot, lambda: state_of(app, server["id"]) == "stopped")
            await until(pilot, lambda: any("board: llama-server" in line and "ended:" in line for line in log.lines))
        assert fake_board.gone(fake_board.server(server["id"]))

    async def test_the_screen_shows_what_the_agent_did_and_enforces_nothing_itself(self, fake_board, tiny_model):
        fake = str(make_fake_server(fake_board.tmp_path, status=200))
        fake_board.env["BOARD_LLAMA_SERVER"] = fake
        booking = fake_board.book("2")
        server = fake_board.start(booking, tiny_model)
        app = make_app(fake_board, fake)
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.press("s")
            await until(pilot, lambda: state_of(app, server["id"]) == "ready")
            fake_board.ok("release", str(booking))
            await pilot.pause(3.0)  # the rules live in the service: an open board stops nothing itself
            assert fake_board.server(server["id"])["state"] == "ready"
            fake_board.ok("agent", "--once")
            # The change reaches the screen as an event (another process committed), then one serve_list.
            await until(pilot, lambda: state_of(app, server["id"]) == "stopped", timeout=10)
        found = fake_board.server(server["id"])
        assert found["reason"] == f"booking {booking} ended"
        assert fake_board.gone(found)

    async def test_the_start_dialog_fills_in_only_what_a_stored_request_holds_well_formed(self, fake_board):
        """A booking stored before the service checked requests (written here straight into SQLite) may carry
        anything: the dialog takes its well-formed fields and leaves the rest to the defaults."""
        import sqlite3

        from app.store import bookings

        fake_board.book("6", "--start", "+3h")  # later on: the service has made the file and its card rows
        uuid = fake_board.json("status")["cards"][4]["uuid"]
        me, now = current_identity(Config().admin_group), int(time.time())
        escapes = "\x1b]0;owned\x07\x1b[2J"
        with sqlite3.connect(fake_board.db) as raw:
            odd = bookings.insert(raw, user=me.name, uid=me.uid, uuids=[uuid], start=now - 60, end=now + 3600,
                                  klass="experiment", note="", request={"model": f"/m/{escapes}.gguf", "ctx": "lots",
                                                                        "parallel": escapes}, now=now, created_by=me.uid)
        app = make_app(fake_board, str(make_fake_server(fake_board.tmp_path, status=200)))
        async with app.run_test(size=(100, 30)) as pilot:
            await until(pilot, lambda: app.view is not None and any(b.id == odd for b in app.view.upcoming))
            await pilot.press("s")
            await until(pilot, lambda: type(app.screen).__name__ == "ServersScreen")
            await pilot.press("n")
            await until(pilot, lambda: type(app.screen).__name__ == "StartServerModal")
            values = [app.screen.query_one(f"#{name}").value for name in ("model", "ctx", "parallel")]
            assert values == ["", "4096", "1"]

    async def test_start_needs_an_active_booking(self, fake_board, tiny_model):
        app = make_app(fake_board, str(make_fake_server(fake_board.tmp_path, status=200)))
        async with app.run_test(size=(100, 30)) as pilot:
            await pilot.press("s")
            await until(pilot, lambda: type(app.screen).__name__ == "ServersScreen")
            await pilot.press("n")
            await until(pilot, lambda: any("no active booking" in str(n.message) for n in app._notifications))
            assert type(app.screen).__name__ == "ServersScreen"  # no dialog without a booking


class TestStartDialog:
    async def test_start_from_the_dialog_then_tokens_per_second(self, board, tiny_model, llama_server):
        booking = board.book("5")
        app = make_app(board, llama_server, model_dirs=(str(Path(tiny_model).parent),))
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: app.view is not None and any(b.id == booking for b in app.view.upcoming))
            await pilot.press("s")
            await until(pilot, lambda: type(app.screen).__name__ == "ServersScreen")
            await pilot.press("n")
            await until(pilot, lambda: type(app.screen).__name__ == "StartServerModal")
            modal = app.screen
            await until(pilot, lambda: modal.models == [str(tiny_model)])  # found in llama.model_dirs
            assert modal.query_one("#model").value == str(tiny_model)
            vram = str(modal.query_one("#vram").render())
            assert "card 5:" in vram and "GiB free" in vram
            modal.query_one("#ctx").value = "256"
            modal.query_one("#model").focus()
            await pilot.press("enter")
            await until(pilot, lambda: type(app.screen).__name__ == "ServersScreen")
            await until(pilot, lambda: state_of(app, 1) == "ready", timeout=90)
            server = board.server(1)
            assert server["cards"] == [5] and server["metrics"] is True and "--metrics" in server["cmdline"]
            # The memory llama.cpp allocated beside board's estimate: on this screen and on the card's own.
            from app.llama.memory import Measured

            measured = Measured.from_json(server["measured"])
            memory = (f"memory: measured {measured.total_mib:.1f} MiB (weights {measured.weights_mib:.1f},"
                      f" KV {measured.kv_mib:.1f}, compute {measured.compute_mib:.1f})"
                      f" · estimated {server['estimate']['per_card_mib'][0]:,} MiB")
            await until(pilot, lambda: memory in str(app.screen.query_one("#detail").render()))
            from app.tui.screens.card_detail import CardDetailScreen

            app.push_screen(CardDetailScreen(server["card_uuids"][0]))
            await until(pilot, lambda: isinstance(app.screen, CardDetailScreen) and app.screen.query("#servers"))
            servers = app.screen.query_one("#servers")
            await until(pilot, lambda: memory in str(servers.render()))
            assert servers.display and str(servers.render()).startswith("#1 tiny · ")
            await pilot.press("escape")
            await until(pilot, lambda: type(app.screen).__name__ == "ServersScreen")
            body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}).encode()
            key = board.ok("serve", "key", "1").stdout.strip()  # the server's own; the board reads /metrics with it

            def generating() -> bool:
                cell = cells(app, 1)[7]
                return cell not in ("-", "off") and float(cell) > 0

            deadline = time.monotonic() + 45
            while not generating():  # tokens/s is a rate between two /metrics reads: keep it busy
                assert time.monotonic() < deadline, "no tokens/s from /metrics"
                request = urllib.request.Request(f"{server['url']}/v1/chat/completions", data=body,
                                                 headers={"Content-Type": "application/json",
                                                          "Authorization": f"Bearer {key}"})
                urllib.request.urlopen(request, timeout=30).read()
                await pilot.pause(0.3)
        board.ok("serve", "stop", "1")
        assert board.gone(board.server(1))
