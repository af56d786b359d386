"""Many real processes race for the same slot on one real database file."""

import os
import subprocess
import sys

from app.store.db import connect
from tests.conftest import REPO

RACERS = 16


def test_exactly_one_of_sixteen_processes_wins_the_same_slot(tmp_path):
    db = tmp_path / "board.db"
    connect(db).close()  # created and migrated once, before the race
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("BOARD_")}, "BOARD_DB": str(db), "BOARD_SIMULATE": "1"}
    # A barrier: every racer has imported and parsed before any of them books.
    go = tmp_path / "go"
    script = (
        "import os, sys, time\n"
        "from app.cli import main\n"
        f"while not os.path.exists({str(go)!r}): time.sleep(0.001)\n"
        "sys.exit(main(['book', '--cards', '0,1', '--start', '+1h', '--for', '2h', '--note', sys.argv[1]]))\n"
    )
    racers = [
        subprocess.Popen([sys.executable, "-c", script, f"racer {n}"], cwd=REPO, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for n in range(RACERS)
    ]
    go.touch()
    results = [(p.wait(timeout=60), p.stdout.read(), p.stderr.read()) for p in racers]
    codes = sorted(code for code, _, _ in results)
    assert codes == [0] + [3] * (RACERS - 1), results
    for code, out, err in results:
        assert "locked" not in err and "Traceback" not in err
        if code == 3:
            assert err.count("\n") == 1 and "booked by" in err
    conn = connect(db)
    assert conn.execute("SELECT count(*) FROM bookings").fetchone()[0] == 1
    assert conn.execute("SELECT count(*) FROM booking_cards").fetchone()[0] == 2
    actions = conn.execute("SELECT ok, count(*) FROM events WHERE action = 'create' GROUP BY ok ORDER BY ok").fetchall()
    assert actions == [(0, RACERS - 1), (1, 1)]  # every refused attempt is audited
