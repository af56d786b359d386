"""The real `board agent` records the faults its fleet reports: a scenario injects an Xid and throttling, the watcher
thread records the Xid as it comes and the throttling still on when SIGTERM stops the service."""

from __future__ import annotations

import os
import sqlite3
import time

from tests.service.support import REPO


def test_the_agent_records_injected_faults_and_the_throttling_still_on_at_stop(make_agent):
    agent = make_agent(start=False)
    scenario = agent.root / "scenario.toml"
    scenario.write_text("[cards]\ncount = 4\n[faults]\nxid = [{card = 3, code = 79}]\n"
                        "throttle = [{card = 1, seconds = 3600}]\n")
    os.chmod(scenario, 0o644)
    agent.env = {"BOARD_SIMULATE": str(scenario), "PYTHONPATH": str(REPO)}  # this checkout, wherever the venv points
    agent.start()
    client = agent.client()
    try:
        deadline = time.monotonic() + 30
        while not (found := client.call("faults", since=0))["faults"]:
            assert time.monotonic() < deadline, f"no fault after 30 s:\n{agent.log_text()}"
            time.sleep(0.2)
    finally:
        client.close()
    [xid] = found["faults"]
    assert (xid["kind"], xid["code"], xid["card"]) == ("xid", 79, 3)
    assert xid["detail"] == "Xid 79: GPU has fallen off the bus"
    assert agent.stop() == 0
    conn = sqlite3.connect(f"file:{agent.db}?mode=ro", uri=True)
    try:
        rows = conn.execute("SELECT kind, card_uuid, duration_s, detail FROM faults WHERE kind = 'throttle'").fetchall()
    finally:
        conn.close()
    [(kind, card, duration, detail)] = rows
    assert card.endswith("000000000001") and duration >= 0 and "still on when the service stopped" in detail
