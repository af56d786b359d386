"""`pipx install .` from a checkout (README's "board on your PATH"): a member's own board, outside the shared install.

pipx itself comes from PyPI into a scratch venv, and installs this checkout's copy into a PIPX_HOME and PIPX_BIN_DIR
of the test's own, never the machine's. The installed board runs with nothing of the test venv on its PATH: its
version, its completion script (package data: the shell files under app/completion) and the demo's status.
About a minute with a warm pip cache; slow (tests/conftest.py's TIER_PATHS), as it needs the registry.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from tests.conftest import REPO


def test_pipx_install_of_the_checkout_gives_a_board_that_runs(tmp_path):
    """Wrong versions: the shell files left out of the package (completion fails on a real install); an import only
    the test extras satisfy (the demo's status fails)."""
    source = tmp_path / "src"  # pip builds in the tree: a copy, never the checkout
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, source / name)
    shutil.copytree(REPO / "app", source / "app", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    base = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIPX_HOME": str(tmp_path / "pipx"),
           "PIPX_BIN_DIR": str(tmp_path / "bin"), "PIPX_MAN_DIR": str(tmp_path / "man"), "HOME": str(tmp_path)}
    for step in ([base, "-m", "venv", str(tmp_path / "tool")],
                 [str(tmp_path / "tool/bin/python"), "-m", "pip", "install", "--quiet", "pipx"],
                 [str(tmp_path / "tool/bin/pipx"), "install", str(source)]):
        done = subprocess.run(step, capture_output=True, text=True, env=env, timeout=900)
        assert done.returncode == 0, f"{' '.join(step)}:\n{done.stdout}\n{done.stderr}"
    board = tmp_path / "bin" / "board"
    assert board.is_symlink() and os.path.realpath(board).startswith(str(tmp_path / "pipx"))
    alone = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8", "TZ": "UTC"}
    for args, expected in ((["--version"], "board "), (["completion", "bash"], "complete -F _board board"),
                           (["--demo", "status"], "SIMULATED")):
        done = subprocess.run(["board", *args], capture_output=True, text=True, env=alone, cwd=tmp_path, timeout=120)
        assert done.returncode == 0 and expected in done.stdout, f"board {' '.join(args)}: {done.stderr}"
