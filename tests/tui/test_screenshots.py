"""The pictures in the README and docs/ are the board as it is: `make screenshots` reproduces the committed SVGs exactly."""

import subprocess
import sys

from tests.conftest import REPO

NAMES = ["board", "board-80x24", "board-projects", "booking-form", "card-detail", "timeline-week"]


def test_make_screenshots_reproduces_the_committed_pictures(tmp_path):
    result = subprocess.run([sys.executable, str(REPO / "scripts" / "make_screenshots.py"), str(tmp_path)],
                            capture_output=True, text=True, cwd=REPO, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert sorted(p.stem for p in tmp_path.glob("*.svg")) == NAMES
    stale = [name for name in NAMES
             if (tmp_path / f"{name}.svg").read_text() != (REPO / "screenshots" / f"{name}.svg").read_text()]
    assert stale == [], f"run 'make screenshots' and look at the pictures: {stale} changed"
