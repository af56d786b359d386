"""The /metrics scrape time (issue 12, sections 6 and 7), against a throwaway agent run as the unit runs it, on the
simulated 8 cards, side by side (interleaved, so machine noise hits both alike) with the baseline: the `status`
operation over the socket on a connection kept open, which is what a board or `board status` asks for the same cards.

    sudo .venv/bin/python bench/bench_metrics.py [--scrapes 200] [--bookings 40] [--threads 8]

Each scrape is a new HTTP connection (GET /metrics, as Prometheus's first scrape and `curl` make), timed from connect
to the last byte. Then --threads scrapers at once, --scrapes each: the median per scrape under that crowd, and how many
times the service read the GPUs meanwhile (its `stats` operation), which must stay at one per refresh period whatever
the number of scrapes. Root only (bench/shared_install.py); about 30 seconds.
"""

from __future__ import annotations

import argparse
import http.client
import socket
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from shared_install import shared_install  # noqa: E402

HOUR = 3600


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def scrape(port: int) -> tuple[float, int]:
    """Seconds for one GET /metrics on a new connection, and the body's size."""
    began = time.perf_counter()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("GET", "/metrics")
        response = connection.getresponse()
        body = response.read()
        assert response.status == 200, (response.status, body[:200])
    finally:
        connection.close()
    return time.perf_counter() - began, len(body)


def ms(values: list[float]) -> str:
    ordered = sorted(values)
    return (f"median {statistics.median(ordered) * 1000:6.2f} ms   p90 {ordered[int(len(ordered) * 0.9)] * 1000:6.2f} ms"
            f"   max {ordered[-1] * 1000:6.2f} ms")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scrapes", type=int, default=200)
    parser.add_argument("--bookings", type=int, default=40, help="bookings on the cards (8 hold a card now)")
    parser.add_argument("--threads", type=int, default=8)
    args = parser.parse_args()

    port = free_port()
    with shared_install(extra_toml=f'[metrics]\nlisten = "127.0.0.1:{port}"\n') as install:
        client = install.client()
        now = int(time.time())
        for n in range(args.bookings):  # a card each, one after the other: the first 8 hold the cards now
            start = now + (n // 8) * HOUR
            client.call("book", start=start, end=start + HOUR, cards=[n % 8], **{"class": "batch"})
        deadline = time.monotonic() + 30
        while True:
            try:
                scrape(port)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit(f"/metrics did not answer on 127.0.0.1:{port}")
                time.sleep(0.1)

        scrapes, statuses, size = [], [], 0
        for _ in range(args.scrapes):
            took, size = scrape(port)
            scrapes.append(took)
            began = time.perf_counter()
            client.call("status")
            statuses.append(time.perf_counter() - began)
        print(f"simulated 8 cards, {args.bookings} bookings; /metrics is {size} bytes; {args.scrapes} of each, interleaved")
        print(f"  GET /metrics (new connection)    {ms(scrapes)}")
        print(f"  status over the socket (baseline) {ms(statuses)}")
        print(f"  ratio of medians: {statistics.median(scrapes) / statistics.median(statuses):.2f}")

        crowd: list[float] = []
        lock = threading.Lock()

        def scraper() -> None:
            mine = [scrape(port)[0] for _ in range(args.scrapes)]
            with lock:
                crowd.extend(mine)

        reads = install.stats()["fleet_reads"]
        began = time.monotonic()
        threads = [threading.Thread(target=scraper) for _ in range(args.threads)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        seconds = time.monotonic() - began
        reads = install.stats()["fleet_reads"] - reads
        print(f"  {args.threads} scrapers at once, {len(crowd)} scrapes in {seconds:.1f} s: {ms(crowd)}")
        print(f"  GPU reads meanwhile: {reads} (refresh period 1 s: at most {int(seconds) + 2})")
        client.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
