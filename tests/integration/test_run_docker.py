"""`board run --docker`: the docker command on exactly the booked cards, and the container stopped with
`docker stop` when the job is told to end.

The machine that runs the tests has the docker client but no daemon, so these tests put a stand-in `docker` first
on PATH that records its argv; one more checks that the real client accepts the options board builds (it gets as far
as looking for the daemon)."""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import sys

import pytest

from tests.conftest import REPO, run_board

FAKE_DOCKER = """#!/bin/sh
# Records its argv (one argument a line, then a blank line). `run` says it is ready through a FIFO and runs until
# `stop` ends it; `stop` records and ends the run.
printf '%s\\n' "$@" >> "$DOCKER_LOG"; echo >> "$DOCKER_LOG"
case "$1" in
  run) if [ -n "$DOCKER_READY" ]; then echo $$ > "$DOCKER_LOG.pid"; echo ready > "$DOCKER_READY"; exec sleep 600; fi ;;
  stop) kill -TERM "$(cat "$DOCKER_LOG.pid")" ;;
esac
exit 0
"""
SIM = "GPU-5090sim-0000-0000-0000-00000000000"


@pytest.fixture
def env(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(FAKE_DOCKER)
    (bin_dir / "docker").chmod(0o755)
    (tmp_path / "board.toml").write_text("[enforce]\ngrace_s = 60\n")
    return {"BOARD_DB": str(tmp_path / "board.db"), "BOARD_SIMULATE": "1", "TZ": "UTC",
            "BOARD_CONFIG": str(tmp_path / "board.toml"), "DOCKER_LOG": str(tmp_path / "docker.log"),
            "PATH": f"{bin_dir}:{os.environ['PATH']}"}


def calls(env) -> list[list[str]]:
    with open(env["DOCKER_LOG"]) as log:
        return [chunk.splitlines() for chunk in log.read().split("\n\n") if chunk]


def test_the_container_gets_exactly_the_booked_cards_and_the_bookings_label(env):
    booked = run_board("book", "--cards", "7,4", "--for", "1h", env=env)
    assert booked.returncode == 0, booked.stderr
    result = run_board("run", "--booking", "1", "--docker", "ghcr.io/ggml-org/llama.cpp:server", "-v",
                       "/models:/models", "--", "-m", "/models/x.gguf", "-ngl", "999", env=env)
    assert result.returncode == 0, result.stderr
    [argv] = calls(env)
    uuids = f"{SIM}4,{SIM}7"
    name = argv[argv.index("--name") + 1]
    assert name.startswith("board-1-")
    end = argv[argv.index("BOARD_BOOKING_ID=1") + 2]
    assert end.startswith("BOARD_BOOKING_END=") and end.endswith("+00:00")
    assert argv == [
        "run", "--rm", "--name", name, "--gpus", f'"device={uuids}"', "-e", f"NVIDIA_VISIBLE_DEVICES={uuids}",
        "-e", "CUDA_DEVICE_ORDER=PCI_BUS_ID", "-e", "BOARD_BOOKING_ID=1", "-e", end, "--label", "board.booking=1",
        "-v", "/models:/models", "ghcr.io/ggml-org/llama.cpp:server", "-m", "/models/x.gguf", "-ngl", "999"]


def test_the_end_of_the_job_stops_the_container_with_docker_stop(env, tmp_path):
    """The service ends a job with SIGTERM (then SIGKILL after the grace): the job answers with docker stop, giving
    the container half the grace, and exits as the container did."""
    assert run_board("book", "--cards", "3", "--for", "1h", env=env).returncode == 0
    ready = tmp_path / "ready"
    os.mkfifo(ready)
    job = subprocess.Popen([sys.executable, "-m", "app", "run", "--docker", "busybox", "--", "sleep", "600"],
                           env={**env, "DOCKER_READY": str(ready)}, cwd=REPO, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    try:
        fd = os.open(ready, os.O_RDONLY | os.O_NONBLOCK)
        assert select.select([fd], [], [], 60)[0], "the container never started"
        os.close(fd)
        job.send_signal(signal.SIGTERM)
        out, err = job.communicate(timeout=60)
    finally:
        job.kill()
    run, stop = calls(env)
    name = run[run.index("--name") + 1]
    assert stop == ["stop", "--time", "30", name]
    assert f"board: stopping container {name} (docker stop --time 30)" in err
    assert job.returncode == 128 + signal.SIGTERM  # the container's end, as a shell reports it


@pytest.mark.parametrize("args", [("--docker",), ("--docker", "-v", "/m:/m", "--", "true")])
def test_docker_without_an_image_is_bad_input(env, args):
    assert run_board("book", "--cards", "3", "--for", "1h", env=env).returncode == 0
    result = run_board("run", *args, env=env)
    assert result.returncode == 2 and result.stdout == "" and result.stderr.count("\n") == 1
    assert "--docker needs the image first" in result.stderr
    assert not os.path.exists(env["DOCKER_LOG"])


@pytest.mark.skipif(shutil.which("docker") is None, reason="no docker client on this machine")
def test_the_real_docker_client_accepts_the_options(env):
    """board's argv through the real client: it parses every option (the --gpus quoting included) and only then
    looks for the daemon, which this machine does not run."""
    from app.cli.run import docker_command

    booking = {"id": 1, "card_uuids": [f"{SIM}4", f"{SIM}7"], "end": 1_800_000_000}
    argv = docker_command(booking, ["busybox", "-v", "/m:/m"], ["true"], "board-1-1")
    real = shutil.which("docker", path=os.environ["PATH"])
    result = subprocess.run([real, *argv[1:]], capture_output=True, text=True, timeout=60,
                            env={"PATH": os.environ["PATH"], "DOCKER_HOST": "unix:///nonexistent/docker.sock"})
    if result.returncode == 0:
        pytest.skip("a docker daemon answered: not for a test to start containers on")
    assert "invalid argument" not in result.stderr and "unknown flag" not in result.stderr, result.stderr
    assert "Cannot connect to the Docker daemon" in result.stderr
