"""`board run --docker` as a member (issue 31, section 6): the docker daemon runs as root, so a bind mount reads for
the member what the kernel would not let them read. bob, a real user, cannot bind alice's private directory, directly
or through a link of his own; his own directory reaches docker. File mode (bob's own database) and the stand-in
docker of tests/integration/test_run_docker.py, which records what reached it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from tests.integration.test_run_docker import FAKE_DOCKER
from tests.shared_install import scratch_dir
from tests.unix_users import REPO, as_user


def test_bob_cannot_bind_alices_directory_and_his_own_reaches_docker(unix_users):
    alice, bob = unix_users["alice"], unix_users["bob"]
    root = scratch_dir("board-docker-")
    try:
        private = root / "alice-private"
        private.mkdir(mode=0o700)
        (private / "notes.txt").write_text("alice's")
        for path in (private, private / "notes.txt"):
            os.chown(path, alice.pw_uid, alice.pw_gid)
        home = root / "bob"
        home.mkdir()
        (home / "data").mkdir()
        (home / "alice").symlink_to(private)
        for path in (home, home / "data", home / "alice"):
            os.lchown(path, bob.pw_uid, bob.pw_gid)
        (root / "bin").mkdir()
        (root / "bin" / "docker").write_text(FAKE_DOCKER)
        (root / "bin" / "docker").chmod(0o755)
        (root / "board.toml").write_text("")
        (root / "board.toml").chmod(0o644)
        log = home / "docker.log"
        env = {"BOARD_DB": str(home / "board.db"), "BOARD_SIMULATE": "1", "TZ": "UTC", "HOME": str(home),
               "BOARD_CONFIG": str(root / "board.toml"), "XDG_STATE_HOME": str(root / "state"),
               "DOCKER_LOG": str(log), "PATH": f"{root / 'bin'}:/usr/bin:/bin", "LANG": "C.UTF-8"}

        def as_bob(*args: str) -> subprocess.CompletedProcess:
            return subprocess.run(as_user("bob", [sys.executable, "-m", "app", *args]), capture_output=True,
                                  text=True, env=env, cwd=REPO, timeout=60)

        booked = as_bob("book", "--cards", "3", "--for", "1h")
        assert booked.returncode == 0, booked.stderr
        assert subprocess.run(as_user("bob", ["cat", str(private / "notes.txt")]), capture_output=True).returncode
        for source in (str(private), f"{home}/alice", f"{home}/alice/"):
            refused = as_bob("run", "--docker", "busybox", "-v", f"{source}:/a:ro", "--", "cat", "/a/notes.txt")
            assert refused.returncode == 2 and refused.stdout == "" and refused.stderr.count("\n") == 1, refused
            assert f"docker option -v {source} is not yours" in refused.stderr, refused.stderr
            assert not log.exists()  # nothing reached docker
        mounted = as_bob("run", "--docker", "busybox", "--mount", f"type=bind,src={private},dst=/a", "--", "true")
        assert mounted.returncode == 2 and "is not yours" in mounted.stderr and not log.exists(), mounted

        ran = as_bob("run", "--docker", "busybox", "-v", f"{home}/data:/data", "--", "true")
        assert ran.returncode == 0, ran.stderr
        argv = log.read_text().split("\n\n")[0].splitlines()
        assert argv[argv.index("board.booking=1") + 1:] == ["-v", f"{home}/data:/data", "busybox", "true"]
    finally:
        shutil.rmtree(root)
