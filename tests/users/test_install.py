"""scripts/install_shared.sh follows "Install on a shared server" (docs/service.md) as root, and the result works.

It installs into a temporary PREFIX (a venv in PREFIX/opt/board, board linked in PREFIX/usr/local/bin,
the config in PREFIX/etc/board, the service's directory PREFIX/var/lib/board, the socket's
PREFIX/run/board, the unit in PREFIX/etc/systemd/system), with the real groups boardusers and
boardadmins and the real system user board. Then the installed `board agent` is started as the
unit starts it (setpriv, no systemd), alice books through the installed `board`, bob sees it,
carol (admin) cancels it, mallory is turned away, and nobody but the service opens the file.
"""

from __future__ import annotations

import grp
import os
import pwd
import re
import shutil
import stat
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.shared_install import SharedInstall, config_text, scratch_dir
from tests.unix_users import ADMIN_GROUP, MEMBERS_GROUP, REPO, SERVICE_USER


SECTION = REPO / "docs" / "service.md"
IGNORE = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache",
                                ".hypothesis", "*.db", "*.db-wal", "*.db-shm", "tests", "screenshots")


@pytest.fixture(scope="module")
def installed(tmp_path_factory, unix_users):
    """Run the script once for the module: (prefix, its output)."""

    root = scratch_dir("board-install-")
    yield run_install(root)
    shutil.rmtree(root, ignore_errors=True)


def run_install(root: Path, config: str | None = None, again: bool = False) -> tuple[Path, str]:
    """Run the script into root/prefix, on an existing config (which it keeps) when `config` is given; `again`: once
    more over an install there (its source and config as they are now)."""
    source = root / "src"
    if not again:
        shutil.copytree(REPO, source, ignore=IGNORE)  # pip builds in the tree: not in the shared checkout
    prefix = root / "prefix"
    if config is not None and not again:
        (prefix / "etc/board").mkdir(parents=True)
        (prefix / "etc/board/board.toml").write_text(config_text(prefix, extra=config))
    env = {
        "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
        "HOME": os.environ.get("HOME", "/root"),
        "PREFIX": str(prefix),
        "PYTHON": os.path.realpath(getattr(sys, "_base_executable", sys.executable)),
        "BOARD_SOURCE": str(source),
        "BOARD_GROUP": MEMBERS_GROUP,
        "BOARD_ADMIN_GROUP": ADMIN_GROUP,
    }
    result = subprocess.run(["sh", str(REPO / "scripts" / "install_shared.sh")], capture_output=True, text=True,
                            env=env, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    return prefix, result.stdout


def as_installed(prefix: Path, scratch: Path) -> SharedInstall:
    return SharedInstall(root=scratch, prefix=prefix, program=[str(prefix / "usr/local/bin/board")])


@pytest.fixture
def running(installed, scratch):
    """The installed agent, started the way the unit starts it."""
    prefix, _ = installed
    board = as_installed(prefix, scratch)
    board.start_agent()
    yield board
    board.stop_agent()


def owner_group_mode(path) -> tuple[str, str, int]:
    st = os.lstat(path)
    return pwd.getpwuid(st.st_uid).pw_name, grp.getgrgid(st.st_gid).gr_name, stat.S_IMODE(st.st_mode)


UNIT_LINES = ("User=board", "Group=board", "AmbientCapabilities=CAP_KILL", "CapabilityBoundingSet=CAP_KILL",
              "NoNewPrivileges=yes", "ProtectSystem=strict", "ProtectHome=yes", "RuntimeDirectory=board",
              "RuntimeDirectoryMode=0755", "StateDirectory=board", "StateDirectoryMode=0700", "UMask=0077",
              "LimitNOFILE=65536")


def test_the_layout_is_what_the_section_says(installed):
    prefix, output = installed
    link = prefix / "usr/local/bin/board"
    assert link.is_symlink() and os.readlink(link) == str(prefix / "opt/board/bin/board")
    assert owner_group_mode(prefix / "var/lib/board") == (SERVICE_USER, SERVICE_USER, 0o700)
    assert owner_group_mode(prefix / "run/board") == (SERVICE_USER, SERVICE_USER, 0o755)
    assert owner_group_mode(prefix / "etc/board/board.toml") == ("root", "root", 0o644)
    config = tomllib.loads((prefix / "etc/board/board.toml").read_text())
    assert config["storage"] == {"db": f"{prefix}/var/lib/board/board.db"}
    assert config["service"] == {"socket": f"{prefix}/run/board/board.sock", "group": MEMBERS_GROUP}
    assert config["access"] == {"admin_group": ADMIN_GROUP}
    service = pwd.getpwnam(SERVICE_USER)
    assert service.pw_shell in ("/usr/sbin/nologin", "/sbin/nologin", "/bin/false")
    assert grp.getgrgid(service.pw_gid).gr_name == SERVICE_USER
    assert SERVICE_USER in grp.getgrnam(MEMBERS_GROUP).gr_mem  # so that it may give its socket to the members
    assert not re.search(r"^FIX", output, re.MULTILINE) and "--ambient-caps +kill" in output, output
    assert not (prefix / "var/lib/board/board.db").exists() or owner_group_mode(
        prefix / "var/lib/board/board.db")[:2] == (SERVICE_USER, SERVICE_USER)  # made by the service, not the script


def test_the_installed_console_script_imports_nothing_but_the_quick_path(installed):
    """The script pip writes is what every member's quick command starts with: an old pip's imports re (a few ms on
    each command, issue 37). Wrong version: the venv's bundled pip left as it came."""
    prefix, _ = installed
    script = (prefix / "opt/board/bin/board").read_text()
    assert "from app.quick import main" in script and "import re" not in script, script


def test_the_completion_scripts_are_installed_for_bash_and_zsh(installed):
    """The installed board's own scripts (from its parser), where bash-completion and zsh look for a local install;
    bash reads the one it loads, and it completes `bo` to book. Wrong versions: not installed, or only bash's;
    written 0600 (root's alone: no member's shell could read it)."""
    prefix, output = installed
    board = prefix / "usr/local/bin/board"
    for shell, path in (("bash", "usr/local/share/bash-completion/completions/board"),
                        ("zsh", "usr/local/share/zsh/site-functions/_board")):
        made = subprocess.run([str(board), "completion", shell], capture_output=True, text=True, timeout=60)
        assert (prefix / path).read_text() == made.stdout and made.stdout, shell
        assert owner_group_mode(prefix / path) == ("root", "root", 0o644)
    loaded = subprocess.run(["bash", "--norc", "-c", 'source "$1"; COMP_WORDS=(board bo); COMP_CWORD=1; _board; '
                             'echo "${COMPREPLY[*]}"', "bash", str(prefix / "usr/local/share/bash-completion/"
                                                                       "completions/board")],
                            capture_output=True, text=True, timeout=60)
    assert loaded.stdout == "book\n" and not loaded.stderr, loaded.stderr
    assert "completion for bash" in output


def test_the_unit_is_shipped_in_the_package_and_installed_with_this_prefix(installed):
    prefix, _ = installed
    shipped = list((prefix / "opt/board/lib").glob("python3*/site-packages/app/systemd/board-agent.service"))
    assert len(shipped) == 1, "the unit is not in the installed package"
    unit = (prefix / "etc/systemd/system/board-agent.service").read_text()
    assert re.search(rf"^ExecStart={re.escape(str(prefix))}/usr/local/bin/board agent$", unit, re.MULTILINE), unit
    assert f"Environment=BOARD_CONFIG={prefix}/etc/board/board.toml" in unit
    assert re.search(rf"^ReadWritePaths={re.escape(str(prefix))}/var/lib/board\b", unit, re.MULTILINE), unit
    assert "WantedBy=multi-user.target" in unit
    for text in (unit, (REPO / "app/systemd/board-agent.service").read_text()):
        lines = text.splitlines()
        for line in UNIT_LINES:
            assert line in lines, f"the unit lost {line!r}"
        assert not [line for line in lines if line.startswith("User=") and line != "User=board"]
    if shutil.which("systemd-analyze"):
        verify = subprocess.run(["systemd-analyze", "verify", str(prefix / "etc/systemd/system/board-agent.service")],
                                capture_output=True, text=True)
        assert verify.returncode == 0, verify.stderr


def test_the_runners_user_and_unit_are_installed(installed):
    """board runner's system user (no login, in the members' group only to reach the socket) and its unit."""
    prefix, output = installed
    runner = pwd.getpwnam("board-llama")
    assert runner.pw_shell in ("/usr/sbin/nologin", "/sbin/nologin", "/bin/false")
    assert "board-llama" in grp.getgrnam(MEMBERS_GROUP).gr_mem and ADMIN_GROUP not in [
        g.gr_name for g in grp.getgrall() if "board-llama" in g.gr_mem]
    unit = (prefix / "etc/systemd/system/board-runner.service").read_text()
    assert re.search(rf"^ExecStart={re.escape(str(prefix))}/usr/local/bin/board runner$", unit, re.MULTILINE), unit
    assert f"Environment=BOARD_CONFIG={prefix}/etc/board/board.toml" in unit
    lines = unit.splitlines()
    for line in ("User=board-llama", "Group=board-llama", "CapabilityBoundingSet=", "AmbientCapabilities=",
                 "NoNewPrivileges=yes", "KillMode=process", "StateDirectory=board-llama"):
        assert line in lines, f"the runner's unit lost {line!r}"
    if shutil.which("systemd-analyze"):
        verify = subprocess.run(["systemd-analyze", "verify", str(prefix / "etc/systemd/system/board-runner.service")],
                                capture_output=True, text=True)
        assert verify.returncode == 0, verify.stderr


def test_the_agent_command_the_unit_runs_exists_and_refuses_root(installed, scratch):
    prefix, _ = installed
    board = as_installed(prefix, scratch)
    result = board.run("root", "agent", "--help")
    assert result.returncode == 0 and "agent" in result.stdout, result.stderr
    as_root = subprocess.run([str(prefix / "usr/local/bin/board"), "agent"], capture_output=True, text=True,
                             env={**board.environ("root"), "BOARD_SIMULATE": "1"}, timeout=60)
    assert as_root.returncode == 1 and "setpriv --reuid board" in as_root.stderr, as_root.stderr
    assert not board.socket.exists()


def test_members_use_the_installed_board_through_its_service(running):
    board = running
    mine = board.json("alice", "book", "2", "--for", "1h", "--note", "installed")
    assert mine["user"] == "alice"
    seen = board.json("bob", "list")["bookings"]
    assert (mine["id"], "alice") in [(b["id"], b["user"]) for b in seen]
    refused = board.run("bob", "cancel", str(mine["id"]))
    assert refused.returncode == 4 and "belongs to alice" in refused.stderr, (refused.returncode, refused.stderr)
    assert board.json("carol", "cancel", str(mine["id"]))["id"] == mine["id"]
    outsider = board.run("mallory", "list")
    assert outsider.returncode == 4 and len(outsider.stderr.splitlines()) == 1
    assert "ask an admin to add you to" in outsider.stderr
    # Only the service opens the file: it made it 0600 (UMask=0077), in its 0700 directory.
    assert owner_group_mode(board.db) == (SERVICE_USER, SERVICE_USER, 0o600)
    peek = board.run("bob", str(board.db), "SELECT 1", program=["sqlite3"])
    assert peek.returncode != 0 and "unable to open" in peek.stderr.lower()
    doctor = board.run("root", "doctor")
    assert "integrity: ok" in doctor.stdout and "audit chain intact" in doctor.stdout, doctor.stdout
    # One owner: the directory 0700 and every file in it 0600, all the service user's; nothing to fix.
    assert f"ok    {board.db.parent} belongs to {SERVICE_USER}, mode 700" in doctor.stdout, doctor.stdout
    assert doctor.returncode == 0 and "FIX" not in doctor.stdout, doctor.stdout
    trail = [(e["action"], e["actor"], e["ok"]) for e in board.log() if e["booking_id"] == mine["id"]]
    assert trail == [("create", "alice", True), ("cancel", "bob", False), ("cancel", "carol", True)], trail


def test_the_section_and_the_script_agree():
    """Each command of the documented section appears in the script, so they cannot drift apart silently."""
    section = SECTION.read_text()
    script = (REPO / "scripts" / "install_shared.sh").read_text()
    block = section.split("<!-- install:begin -->", 1)[1].split("<!-- install:end -->", 1)[0]
    for needle in ("python3 -m venv /opt/board", "pip install", "ln -sfn /opt/board/bin/board /usr/local/bin/board",
                   "groupadd --system board", "groupadd --system board-admin", "useradd --system --gid board",
                   "--no-create-home", "--shell /usr/sbin/nologin", "install -d -o board -g board -m 0700 /var/lib/board",
                   "/etc/board/board.toml", 'socket = "/run/board/board.sock"', 'group = "board"',
                   'admin_group = "board-admin"', "systemctl enable --now board-agent", "board doctor",
                   "useradd --system --gid board-llama", "board-runner.service",
                   "systemctl status board-agent", "usermod -aG board"):
        assert needle in block, f"the documented section lost {needle!r}"
    assert "board init" not in block and "2770" not in block, "the section still makes a shared 2770 directory"
    for step in ("groupadd --system", "useradd --system --gid", "--no-create-home", "--shell /usr/sbin/nologin",
                 "-m venv", "pip install", "ln -sfn", "-m 0700 \"$DATA\"", "socket = ", "group = ", "admin_group",
                 "systemctl enable --now", "doctor", "systemctl status", "board-agent.service"):
        assert step in script, f"the script lost {step!r}"
    assert "init --group" not in script, "the script still runs board init"


# -- the power policy at boot (board-power.service) ----------------------------------------------------------------

POWER_UNIT = "etc/systemd/system/board-power.service"
POWER_WANTED = "etc/systemd/system/multi-user.target.wants/board-power.service"


def test_without_a_power_policy_the_boot_unit_is_not_installed(installed):
    """Wrong version: the unit installed and enabled on every box (it fails at each boot: nothing to apply)."""
    prefix, output = installed
    assert not (prefix / POWER_UNIT).exists() and not (prefix / POWER_WANTED).is_symlink()
    assert f"no [power] limit_w in {prefix}/etc/board/board.toml: board-power.service not installed" in output


POLICIES = {"limit_w": "[power]\nlimit_w = 500\npause_s = 0\n", "cards": "[power]\npause_s = 0\n[power.cards]\n3 = 450\n"}


@pytest.fixture(scope="module", params=POLICIES.values(), ids=POLICIES.keys())
def installed_with_power(request, unix_users):
    root = scratch_dir("board-install-power-")
    yield run_install(root, request.param)
    shutil.rmtree(root, ignore_errors=True)


def test_a_policy_taken_out_of_the_config_disables_the_unit_at_the_next_install(unix_users):
    """Installed with [power] limit_w, then the policy removed and the script run again: the unit and its symlink are
    gone, and the output says so. Wrong version: the unit left enabled, failing at each boot with nothing to apply."""
    root = scratch_dir("board-install-unpower-")
    try:
        prefix, _ = run_install(root, POLICIES["limit_w"])
        assert (prefix / POWER_WANTED).is_symlink()
        config = prefix / "etc/board/board.toml"
        config.write_text(config.read_text().replace(POLICIES["limit_w"], ""))
        prefix, output = run_install(root, again=True)
        assert not (prefix / POWER_UNIT).exists() and not os.path.lexists(prefix / POWER_WANTED)
        assert "board-power.service disabled and removed" in output, output
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_a_power_policy_installs_and_enables_the_boot_unit(installed_with_power):
    """[power] limit_w, or [power.cards] alone: the unit is installed with this install's paths and enabled (the
    symlink WantedBy= asks for, as systemctl enable makes it), and the command it runs applies the policy.
    Wrong versions: only limit_w looked for ([power.cards] alone installs nothing); installed but not enabled;
    the shipped paths left in (the unit runs another board, or none)."""
    prefix, output = installed_with_power
    unit = (prefix / POWER_UNIT).read_text()
    assert owner_group_mode(prefix / POWER_UNIT) == ("root", "root", 0o644)
    assert os.readlink(prefix / POWER_WANTED) == "/etc/systemd/system/board-power.service"
    assert "board-power.service enabled: board power apply at each boot" in output
    [start] = re.findall(r"^ExecStart=(.*)$", unit, re.MULTILINE)
    assert start == f"{prefix}/usr/local/bin/board --db {prefix}/var/lib/board-power/power.db power apply"
    assert f"Environment=BOARD_CONFIG={prefix}/etc/board/board.toml" in unit.splitlines()
    if shutil.which("systemd-analyze"):
        verify = subprocess.run(["systemd-analyze", "verify", str(prefix / POWER_UNIT)], capture_output=True, text=True)
        assert verify.returncode == 0, verify.stderr
    # What systemd would run: its StateDirectory made as systemd makes it, root, the unit's environment.
    (prefix / "var/lib/board-power").mkdir(mode=0o700)
    env = {"PATH": "/usr/bin:/bin", "BOARD_CONFIG": f"{prefix}/etc/board/board.toml", "BOARD_SIMULATE": "1"}
    applied = subprocess.run(start.split(), capture_output=True, text=True, env=env, timeout=120)
    assert applied.returncode == 0, applied.stderr
    assert "set card 3: power limit 575 W -> 450 W (nvidia-smi -i 3 -pl 450)" in applied.stdout or (
        "set card 3: power limit 575 W -> 500 W (nvidia-smi -i 3 -pl 500)" in applied.stdout), applied.stdout
