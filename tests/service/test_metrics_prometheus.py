"""/metrics of the real agent, as the unit runs it, checked by the real promtool and scraped by a real Prometheus.

Both come from Debian's `prometheus` package: `make test` unpacks it once (scripts/fetch_prometheus.sh) and
names the folder in BOARD_PROMETHEUS_DIR; run alone, the `prometheus_bin` fixture (tests/conftest.py) calls the same
script.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

MIB = 1024 * 1024


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read()


def wait_for(what: str, check, timeout: float = 60.0, log: str = ""):
    """Poll `check` until it returns something true; an AssertionError naming `what` if it never does."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            if found := check():
                return found
        except (OSError, ValueError, KeyError, IndexError) as error:
            last = error
        time.sleep(0.2)
    raise AssertionError(f"{what} within {timeout:g} s (last error: {last})\n{log}")


@pytest.fixture
def agent_with_metrics(make_agent):
    agent = make_agent(start=False)
    agent.port = free_port()
    with open(agent.config, "a") as config:
        config.write(f'\n[[pools]]\nname = "prod"\ncards = [0, 1, 2, 3]\n\n[metrics]\nlisten = "127.0.0.1:{agent.port}"\n')
    agent.start()
    agent.url = f"http://127.0.0.1:{agent.port}/metrics"
    wait_for("the agent's /metrics answers", lambda: get(agent.url), 30, agent.log_text())
    return agent


class Prometheus:
    """A real Prometheus server on a free port, scraping `target` every second, with its data in a scratch folder."""

    def __init__(self, folder: Path, target: str) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="board-prometheus-"))
        self.port = free_port()
        config = self.root / "prometheus.yml"
        config.write_text(f"global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  - job_name: board\n"
                          f"    static_configs:\n      - targets: ['{target}']\n")
        self.log = self.root / "prometheus.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [str(folder / "prometheus"), f"--config.file={config}", f"--storage.tsdb.path={self.root / 'data'}",
                 f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, cwd=self.root)

    def api(self, path: str, **params) -> dict:
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
        answer = json.loads(get(url))
        assert answer["status"] == "success", answer
        return answer["data"]

    def query(self, promql: str) -> list[dict]:
        return self.api("query", query=promql)["result"]

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        shutil.rmtree(self.root, ignore_errors=True)


def test_promtool_passes_the_exposition(agent_with_metrics, prometheus_bin):
    agent_with_metrics.client().call("book", start=int(time.time()), end=int(time.time()) + 3600, cards=[3])
    text = get(agent_with_metrics.url)
    checked = subprocess.run([str(prometheus_bin / "promtool"), "check", "metrics"], input=text, capture_output=True,
                             timeout=60)
    assert (checked.returncode, checked.stdout + checked.stderr) == (0, b""), text.decode()[:2000]
    assert b'board_gpu_state{booking_id="1",class="experiment",holder="root",index="3"' in text


def test_a_real_prometheus_scrapes_the_cards_and_counters_across_a_restart(agent_with_metrics, prometheus_bin):
    agent = agent_with_metrics
    now = int(time.time())
    booked = agent.client().call("book", start=now, end=now + 3600, cards=[3], **{"class": "batch"})
    server = Prometheus(prometheus_bin, f"127.0.0.1:{agent.port}")
    try:
        def target_up():
            targets = server.api("targets")["activeTargets"]
            return targets and targets[0]["health"] == "up" and targets[0]

        target = wait_for("Prometheus reports the agent's target up", target_up, log=server.log_text())
        assert target["scrapeUrl"] == agent.url

        series = wait_for("the card series in Prometheus", lambda: server.query('board_gpu_state{index="3",state="booked"}'))
        assert len(series) == 1 and series[0]["value"][1] == "1"
        labels = series[0]["metric"]
        assert {k: labels[k] for k in ("uuid", "index", "name", "pool", "holder", "class", "booking_id")} == {
            "uuid": "GPU-5090sim-0000-0000-0000-000000000003", "index": "3", "name": "NVIDIA GeForce RTX 5090",
            "pool": "prod", "holder": "root", "class": "batch", "booking_id": str(booked["id"])}
        total = server.query('board_gpu_memory_total_bytes{index="3"}')
        assert [float(s["value"][1]) for s in total] == [32607 * MIB]
        assert [(s["metric"]["class"], s["value"][1]) for s in server.query("board_bookings_created_total")] == [("batch", "1")]

        # A restart: the totals come back from the audit log, so Prometheus sees the counter go on, not reset.
        assert agent.stop() == 0
        agent.start()
        agent.client().call("book", start=now, end=now + 3600, cards=[4], **{"class": "batch"})

        def created_twice():
            return [s["value"][1] for s in server.query("board_bookings_created_total")] == ["2"]

        wait_for("Prometheus scrapes the restarted agent", created_twice, log=server.log_text() + agent.log_text())
        assert [s["value"][1] for s in server.query("resets(board_bookings_created_total[10m])")] == ["0"]
    finally:
        server.stop()


def test_a_taken_port_stops_the_agent_with_one_line(make_agent):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        agent = make_agent(start=False)
        with open(agent.config, "a") as config:
            config.write(f'\n[metrics]\nlisten = "127.0.0.1:{port}"\n')
        agent.spawn()
        assert agent.proc.wait(30) == 1
    log = agent.log_text()
    assert f"can't serve /metrics on 127.0.0.1:{port} (Address already in use); free the port or change [metrics] listen" in log
    assert "Traceback" not in log
