"""`make install` and `make uninstall` (issue 31 §8): after `make run` a newcomer's `board` is .venv/bin/board,
not on the PATH; `make install` links it into ~/.local/bin (here USER_BIN in a scratch folder, HOME too), says
how to undo it and how to put that folder on the PATH, and never replaces a `board` that is not its link.
`-o .venv/.runtime` keeps make from reinstalling into the (shared) venv: the link is what is tested."""

from __future__ import annotations

import os
import subprocess

from tests.conftest import REPO

OURS = REPO / ".venv" / "bin" / "board"


def make(target: str, bin_dir, home, path: str = "/usr/local/bin:/usr/bin:/bin") -> subprocess.CompletedProcess:
    return subprocess.run(["make", "--no-print-directory", "-o", ".venv/.runtime", target, f"USER_BIN={bin_dir}"],
                          cwd=REPO, capture_output=True, text=True, timeout=60,
                          env={"PATH": path, "HOME": str(home), "LANG": "C.UTF-8"})


def test_make_install_links_board_into_the_user_bin_says_how_to_undo_and_uninstall_removes_only_that(tmp_path):
    bin_dir = tmp_path / "home" / ".local" / "bin"
    installed = make("install", bin_dir, tmp_path / "home")
    assert installed.returncode == 0, installed.stderr
    link = bin_dir / "board"
    assert link.is_symlink() and os.readlink(link) == str(OURS)
    assert f"board is {link} -> {OURS}; undo with: make uninstall" in installed.stdout
    assert f'{bin_dir} is not on your PATH: add  export PATH="{bin_dir}:$PATH"  to ~/.bashrc' in installed.stdout
    again = make("install", bin_dir, tmp_path / "home", path=f"{bin_dir}:/usr/bin:/bin")  # idempotent; on the PATH
    assert again.returncode == 0 and "not on your PATH" not in again.stdout, again.stderr
    version = subprocess.run([str(link), "--version"], capture_output=True, text=True, timeout=60)
    assert version.returncode == 0 and version.stdout.strip(), version.stderr

    removed = make("uninstall", bin_dir, tmp_path / "home")
    assert removed.returncode == 0 and f"removed {link}" in removed.stdout
    assert not link.exists() and not link.is_symlink()


def test_make_install_never_replaces_another_board_and_uninstall_leaves_it(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    theirs = bin_dir / "board"
    theirs.write_text("#!/bin/sh\necho another board\n")
    refused = make("install", bin_dir, tmp_path)
    assert refused.returncode != 0
    assert f"{theirs} exists and is not a link to {OURS}; move it away first" in refused.stderr
    kept = make("uninstall", bin_dir, tmp_path)
    assert kept.returncode == 0 and "left alone" in kept.stdout
    assert theirs.read_text() == "#!/bin/sh\necho another board\n"
