"""app/systemd/board-power.service: `board power apply` once at boot, as root, after the driver loads."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from app.cli import build_parser
from app.cli.power import cmd_apply
from tests.conftest import REPO

UNIT = REPO / "app" / "systemd" / "board-power.service"


def parse_unit(text: str) -> dict[str, dict[str, list[str]]]:
    """A systemd unit's sections, each key with its values in order (a key may repeat: Environment=)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current = None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        key, equals, value = line.partition("=")
        assert equals and current is not None, f"not a unit line: {line!r}"
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def test_the_unit_is_a_oneshot_after_the_driver_before_the_service():
    """Wrong versions: Type=simple (systemd counts it started before the limits are set); no RemainAfterExit (it
    reads as dead after each boot); ordered before the driver's modules or not at all; after board-agent (its first
    readings show the old limits)."""
    unit = parse_unit(UNIT.read_text())
    service, order = unit["Service"], unit["Unit"]
    assert service["Type"] == ["oneshot"] and service["RemainAfterExit"] == ["yes"]
    after = " ".join(order["After"]).split()
    assert {"systemd-modules-load.service", "nvidia-persistenced.service"} <= set(after)
    assert "board-agent.service" in " ".join(order["Before"]).split() and "board-agent.service" not in after
    assert "User" not in service  # root: the driver's set calls need CAP_SYS_ADMIN
    assert unit["Install"]["WantedBy"] == ["multi-user.target"]
    assert "Environment=BOARD_CONFIG=/etc/board/board.toml" in UNIT.read_text().splitlines()


def test_its_command_is_board_power_apply_on_a_database_of_its_own():
    """The command line the unit runs parses, with board's own parser, as `power apply` on the database in its
    StateDirectory (file mode as root: never the service's board.db, whose files would become root's).
    Wrong versions: `power` alone (it only shows the limits); --dry-run; no --db (through the service's socket,
    which may not set limits); a --db outside StateDirectory."""
    unit = parse_unit(UNIT.read_text())
    [command] = unit["Service"]["ExecStart"]
    argv = shlex.split(command)
    assert argv[0] == "/usr/local/bin/board"
    args = build_parser().parse_args(argv[1:])
    assert args.handler is cmd_apply and not args.dry_run
    [state] = unit["Service"]["StateDirectory"]
    assert args.db.startswith(f"/var/lib/{state}/") and unit["Service"]["StateDirectoryMode"] == ["0700"]


def test_systemd_analyze_verifies_it(tmp_path):
    """systemd's own reading of the unit, where systemd-analyze is installed (its ExecStart pointed at this
    checkout's board: verify wants the binary to exist)."""
    if shutil.which("systemd-analyze") is None:
        parse_unit(UNIT.read_text())  # at least a well-formed unit
        return
    board = Path(sys.executable).parent / "board"  # this venv's console script
    copy = tmp_path / "board-power.service"
    copy.write_text(UNIT.read_text().replace("/usr/local/bin/board", str(board)))
    result = subprocess.run(["systemd-analyze", "verify", str(copy)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "board-power.service" not in result.stderr, result.stderr  # no warning about this unit
