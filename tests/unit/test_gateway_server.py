"""`board gateway` as its command runs it (app.gateway.server.run_gateway), in this process: its refusals before it
starts, and a start until SIGTERM, with what it logs and the umask it leaves. The service's socket is the relay
tests' FixedState (one gateway_state), made for the path run_gateway names. The relay and the door themselves are
test_gateway_relay.py and test_gateway_door.py."""

from __future__ import annotations

import json
import os
import signal
import threading
import urllib.request

import pytest
from msgspec import structs

import app.gateway.server
from app.config import Config, GatewaySettings, ServiceSettings
from app.errors import BadInput
from app.gateway.server import run_gateway
from tests.unit.test_gateway_relay import FixedState


def test_a_gateway_without_the_services_socket_is_refused_saying_why():
    """Wrong versions: the reason left out or changed (the member reads it at `board gateway`)."""
    with pytest.raises(BadInput) as refused:
        run_gateway(Config())
    assert str(refused.value) == "[service] socket is not set: the gateway reaches the service only through its socket"


@pytest.mark.parametrize("listen", ["8080", "gw:port", ":8080", "127.0.0.1:0"])
def test_a_listen_that_is_not_host_port_is_refused_naming_the_option_and_an_example(listen):
    """Wrong versions: the option or the example left out of the message or changed; the value not checked."""
    with pytest.raises(BadInput) as refused:
        run_gateway(Config(service=ServiceSettings(socket="/nonexistent/board.sock")), listen)
    assert str(refused.value) == f"--listen is {listen!r}; give host:port, such as \"0.0.0.0:8080\""


def serve_once(monkeypatch, config: Config, listen: str | None) -> tuple[int, list[str], dict, int]:
    """run_gateway(config, listen) in the main thread (it installs its SIGTERM handler), until a thread has read a
    200 from its /health and sent SIGTERM: (its return, the listens it was asked to open, that /health, the umask it
    left). The site opens on a free port whatever listen says (the listen asked for is recorded)."""
    opened: list[str | None] = []
    port: list[int] = []
    ready, finished = threading.Event(), threading.Event()
    health: dict = {}
    real_open_site = app.gateway.server.open_site

    async def open_site(gateway, listen):
        opened.append(listen)
        runner, site = await real_open_site(gateway, "127.0.0.1:0")
        port.append(site.port)
        ready.set()
        return runner, site

    def asker():
        while not ready.wait(0.05):
            if finished.is_set():  # run_gateway ended (failed) before it listened
                return
        for _ in range(600):
            if finished.is_set():
                return
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port[0]}/health", timeout=10) as answer:
                    health.update(json.loads(answer.read()))
                    break
            except OSError:  # 503 while it reads the service's state (urllib raises it), or not answering yet
                finished.wait(0.05)
        if not finished.is_set():
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(app.gateway.server, "open_site", open_site)
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    umask = os.umask(0o022)
    thread = threading.Thread(target=asker, daemon=True)
    thread.start()
    try:
        rc = run_gateway(config, listen)
    finally:
        finished.set()
        thread.join(30)
        left = os.umask(umask)
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    return rc, opened, health, left


class Socket(FixedState):
    """The service's socket at `path`: every one made is kept, to see which path run_gateway gave."""
    made: list[Socket] = []

    def __init__(self, path: str) -> None:
        super().__init__("http://127.0.0.1:9")
        self.path = path
        Socket.made.append(self)


def test_the_gateway_serves_on_the_services_socket_until_sigterm_and_says_so(monkeypatch, capsys, tmp_path):
    """On the service's socket ([service] socket): it reads the service's state (/health 200, the service known),
    on the listen given (else the config's), logs where and with which caps, warns that prompts are logged when they
    are and that a renamed setting was read by its old name, and only then (the caps lowered to the open-file limit)
    that LimitNOFILE should be raised; SIGTERM stops it (0) with a last line; it leaves the umask at 077 (its files
    are the gateway user's).
    Wrong versions: the listen given ignored, or the config's ignored when none is given; no client, or one on no
    socket; a log line left out or changed; the LimitNOFILE warning also when the caps are not lowered; the umask
    not set, or another."""
    import app.client.socket

    monkeypatch.setattr(app.client.socket, "SocketClient", Socket)
    Socket.made = []
    path = str(tmp_path / "board.sock")
    config = Config(service=ServiceSettings(socket=path),
                    gateway=GatewaySettings(listen="127.0.0.1:8090", log_bodies=True, max_connections=8,
                                    max_connections_per_address=3))
    rc, opened, health, umask = serve_once(monkeypatch, config, "127.0.0.1:8089")
    err = capsys.readouterr().err
    assert rc == 0 and opened == ["127.0.0.1:8089"] and umask == 0o077
    assert health == {"status": "ok", "service": True, "models": ["m"], "servers": 1}
    assert [made.path for made in Socket.made] == [path] and Socket.made[0].closed.is_set()
    assert "board gateway: [gateway] log_bodies is true: prompts and completions are logged\n" in err
    assert (f"board gateway: listening on 127.0.0.1:8089, for the service at {path}; at most 8 connections,"
            " 3 per address\n") in err
    assert "LimitNOFILE" not in err and "max_concurrent_per_key" not in err and err.endswith("board gateway: stopping\n")

    lowered = structs.replace(config, gateway=structs.replace(config.gateway, log_bodies=False, max_connections=1 << 40,
                                              _renamed=("max_concurrent_per_key",), max_concurrent_per_user=5))
    rc, opened, health, umask = serve_once(monkeypatch, lowered, None)
    err = capsys.readouterr().err
    assert rc == 0 and opened == ["127.0.0.1:8090"] and health["status"] == "ok"
    assert "log_bodies" not in err
    assert ("board gateway: [gateway] max_concurrent_per_key is now max_concurrent_per_user (5), counted across all"
            " of a member's keys; rename it in the config\n") in err
    line = next(line for line in err.splitlines() if "LimitNOFILE" in line)
    assert line.startswith(f"board gateway: [gateway] max_connections is {1 << 40}, but the open-file limit holds ")
    assert line.endswith(" beside their upstreams; raise LimitNOFILE= in the unit")
    held = int(line.split("holds ")[1].split()[0])
    assert 0 < held < 1 << 40 and f"at most {held} connections, 3 per address" in err


def test_a_gateway_that_cannot_listen_fails_and_leaves_no_thread_that_would_keep_the_process_alive(
        monkeypatch, tmp_path):
    """The port is taken: run_gateway raises, having already started following the service (a thread blocked on the
    socket for ever); that thread must not keep `board gateway` from exiting with its error.
    Wrong version: the follower a non-daemon thread (the process hangs at exit instead of failing)."""
    import socket

    import app.client.socket

    monkeypatch.setattr(app.client.socket, "SocketClient", Socket)
    Socket.made = []
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    before = set(threading.enumerate())
    umask = os.umask(0o022)
    try:
        with pytest.raises(OSError):
            run_gateway(Config(service=ServiceSettings(socket=str(tmp_path / "board.sock"))),
                        f"127.0.0.1:{taken.getsockname()[1]}")
        left = [t for t in set(threading.enumerate()) - before if t.is_alive()]
        assert left and all(t.daemon for t in left)
    finally:
        os.umask(umask)
        taken.close()
        for made in Socket.made:
            made.close()


def test_the_caps_follow_the_soft_open_file_limit_the_process_has_now():
    """The connections are capped by the open-file limit in force (the soft one; run_gateway raises it to the hard
    one first, where it can). Wrong version: the hard limit read, which the process cannot use yet."""
    import resource

    from app.gateway.connections import connection_cap
    from app.gateway.server import Gateway

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    low = 1024
    if hard != resource.RLIM_INFINITY and hard <= low:
        pytest.skip(f"the hard open-file limit ({hard}) leaves no lower soft one to try")
    resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard))
    try:
        made = Gateway(Config(gateway=GatewaySettings(max_connections=100_000)), FixedState("http://127.0.0.1:9"))
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert made.max_connections == connection_cap(100_000, low) == 352 == made.connections.cap
