"""`board run --docker`: the docker command on exactly the booked cards, and the container stopped with
`docker stop` when the job is told to end.

The machine that runs the tests has the docker client but no daemon, so these tests put a stand-in `docker` first
on PATH that records its argv; others check that the real client accepts the options board builds (it gets as far
as looking for the daemon). The member's own docker options go through an allow-list (app/cli/docker_options.py):
each refused form is one the real client would have passed to the daemon, and board refuses it before anything
reaches docker or the service; what board lets through, the real client turns into a container on the booked card
alone, as a recording daemon on a Unix socket receives it."""

from __future__ import annotations

import http.server
import json
import os
import pty
import random
import re
import select
import shutil
import signal
import socket
import socketserver
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from app.errors import BadInput
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


def test_the_container_gets_exactly_the_booked_cards_and_the_bookings_label(env, tmp_path):
    booked = run_board("book", "--cards", "7,4", "--for", "1h", env=env)
    assert booked.returncode == 0, booked.stderr
    (tmp_path / "models").mkdir()
    result = run_board("run", "--booking", "1", "--docker", "ghcr.io/ggml-org/llama.cpp:server", "-v",
                       f"{tmp_path}/models:/models", "--", "-m", "/models/x.gguf", "-ngl", "999", env=env)
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
        "-v", f"{tmp_path}/models:/models", "ghcr.io/ggml-org/llama.cpp:server", "-m", "/models/x.gguf", "-ngl", "999"]


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


def real_client(options: list[str], host: str = "unix:///nonexistent/docker.sock") -> str:
    """The real client's answer to board's argv with these member options: it parses them all, then looks for a
    daemon that is not there (or is the recording one below). Its stderr."""
    from app.cli.run import docker_command

    booking = {"id": 1, "card_uuids": [f"{SIM}4"], "end": 1_800_000_000}
    argv = docker_command(booking, ["busybox", *options], ["true"], "board-1-1")
    terminal, other = pty.openpty()  # for -t, which wants a terminal on stdin
    try:
        result = subprocess.run([shutil.which("docker"), *argv[1:]], capture_output=True, text=True, timeout=60,
                                stdin=terminal, env={"PATH": os.environ["PATH"], "CUDA_VISIBLE_DEVICES": "0",
                                                     "DOCKER_HOST": host})
    finally:
        os.close(terminal)
        os.close(other)
    assert result.returncode != 0, "a docker daemon answered: not for a test to start containers on"
    return result.stderr


@pytest.fixture(scope="module")
def member(tmp_path_factory):
    """One booking, the stand-in docker, and the files the cases name: a data directory of the member's, the
    models directory (not theirs: [llama] model_dirs), someone else's directory, a link to /, env and label files."""
    root = tmp_path_factory.mktemp("member")
    bin_dir = root / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(FAKE_DOCKER)
    (bin_dir / "docker").chmod(0o755)
    for name in ("data", "models", "others"):
        (root / name).mkdir()
    for name in ("models", "others"):
        os.chown(root / name, 65534, 65534)  # not the member's (the tests run as root: nobody's, then)
    (root / "to-root").symlink_to("/")
    (root / "to-dev").symlink_to("/dev")
    (root / "bad.env").write_text("# the team's\n\nHF_HOME=/data\n  NVIDIA_VISIBLE_DEVICES=all\n")
    (root / "ok.env").write_text("# the team's\n\nHF_HOME=/data\nMY_NVIDIA_NOTE=1\n")
    (root / "bad.labels").write_text("team=ml\nboard.booking=7\n")
    (root / "bom.env").write_text("\ufeffNVIDIA_VISIBLE_DEVICES=all\n")  # the client drops a UTF-8 BOM, then reads the name
    (root / "big.env").write_text("HF_HOME=/data\n" * 80_000 + "NVIDIA_VISIBLE_DEVICES=all\n")  # over 1 MiB
    (root / "board.toml").write_text(f'[enforce]\ngrace_s = 60\n[llama]\nmodel_dirs = ["{root}/models"]\n')
    env = {"BOARD_DB": str(root / "board.db"), "BOARD_SIMULATE": "1", "TZ": "UTC",
           "BOARD_CONFIG": str(root / "board.toml"), "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    booked = run_board("book", "--cards", "3", "--for", "1h", env=env)
    assert booked.returncode == 0, booked.stderr
    return root, env


def fill(options: tuple[str, ...], root) -> list[str]:
    return [option.replace("{root}", str(root)) for option in options]


# (the member's options, what the one-line refusal names). Each is a form the real client passes to the daemon.
REFUSED = [
    (("--gpus", "all"), "--gpus"),
    (("--gpus=all",), "--gpus"),
    (("-e", "NVIDIA_VISIBLE_DEVICES=all"), "-e NVIDIA_VISIBLE_DEVICES"),
    (("-eNVIDIA_VISIBLE_DEVICES=all",), "-e NVIDIA_VISIBLE_DEVICES"),
    (("-e=NVIDIA_DRIVER_CAPABILITIES=all",), "-e NVIDIA_DRIVER_CAPABILITIES"),
    (("--env=CUDA_VISIBLE_DEVICES=0,1",), "--env CUDA_VISIBLE_DEVICES"),
    (("-ite", "CUDA_VISIBLE_DEVICES"), "-e CUDA_VISIBLE_DEVICES"),  # its value from the client's environment
    (("-e", "BOARD_BOOKING_ID=7"), "-e BOARD_BOOKING_ID"),
    (("--env-file", "{root}/bad.env"), "--env-file NVIDIA_VISIBLE_DEVICES"),
    (("--env-file", "{root}/big.env"), "--env-file over 1 MiB"),  # its last line past what a reader would check
    (("--env-file", "{root}/bom.env"), "--env-file NVIDIA_VISIBLE_DEVICES"),  # not a name "\ufeffNVIDIA_..."
    (("--privileged",), "--privileged"),
    (("--privileged=true",), "--privileged"),
    (("-v", "/:/host"), "-v /"),
    (("-itv", "/:/host"), "-v /"),
    (("--volume=/dev:/dev",), "--volume /dev"),
    (("-v", "/proc:/p:ro"), "-v /proc"),
    (("-v", "/:ro"), "-v /"),  # two parts are SOURCE:TARGET to the daemon, not TARGET:MODES
    (("-v", "/sys/class:/c"), "-v /sys/class"),  # inside a protected tree
    (("-v", "/var/run/docker.sock:/var/run/docker.sock"), "-v /var/run/docker.sock"),
    (("-v", "/run:/r"), "-v /run"),  # above the docker socket
    (("-v", "/var/lib:/l:ro"), "-v /var/lib"),  # above every container's files
    (("-v", "{root}/to-root:/h"), "to-root"),  # a link to /
    (("-v", "{root}/to-dev/:/d"), "to-dev"),
    (("-v", "{root}/others:/o"), "others"),  # not the member's
    (("-v", "{root}/models:/m"), "read-only"),  # the models, but writable
    (("-v", "{root}/missing:/m"), "does not exist"),  # docker would create it as root
    (("--mount", "type=bind,source=/,target=/h"), "--mount /"),
    (("--mount", "type=bind,src=/dev,dst=/d,readonly"), "--mount /dev"),
    (("--mount", '"type=bind",source=/,target=/h'), "--mount /"),  # CSV quoting
    (("--mount=type=bind,source={root}/models,target=/m",), "read-only"),
    (("--mount", "type=bind,source={root}/data,src=/,target=/h"), "--mount / would"),  # the last source wins
    (("--mount", "type=bind,source={root}/data,target=/d,bind-propagation=rshared"), "--mount shares"),
    (("--mount", "type=bind,source={root}/data,target=/d,bind-propagation=shared"), "--mount shares"),
    (("-v", "{root}/data:/d:rshared"), "-v has modes rshared"),  # a mount the container makes shows on the host
    (("-v", "{root}/data:/d:ro,shared"), "-v has modes"),
    (("--mount", "type=volume,dst=/h,volume-driver=local,volume-opt=type=none,volume-opt=o=bind,"
                 "volume-opt=device=/"), "volume-driver"),
    (("--mount", "dst=/h,volume-opt=type=none,volume-opt=o=bind,volume-opt=device=/"), "volume-opt"),
    (("--volume-driver", "local"), "--volume-driver"),
    (("--volumes-from", "alices-job"), "--volumes-from"),
    (("--pid", "host"), "--pid"),
    (("--pid=container:alices-job",), "--pid"),
    (("--network", "host"), "--network host"),
    (("--network=container:alices-job",), "--network container:alices-job"),
    (("--net=host",), "--net"),  # the client's hidden alias: not in the table, refused
    (("--network", "name=host"), "--network host"),  # the client's CSV form
    (("--network=name=container:alices-job",), "--network container:alices-job"),
    (("--network", "name=bridge,driver-opt=com.docker.network.endpoint.sysctls=net.ipv4.ip_forward=1"),
     "--network driver-opt"),
    (("--log-driver", "syslog"), "--log-driver syslog"),
    (("--log-opt", "syslog-address=unix:///var/run/docker.sock"), "--log-opt syslog-address"),
    (("-p", "80:80"), "-p 80:80 privileged"),
    (("-p", "127.0.0.1:443:8443"), "-p privileged"),
    (("-p", "[::1]:1023:80"), "-p privileged"),
    (("--publish", "published=22,target=22"), "--publish privileged"),
    (("--ipc=host",), "--ipc host"),
    (("--ipc", "container:alices-job"), "--ipc container:alices-job"),
    (("--uts=host",), "--uts"),
    (("--userns=host",), "--userns"),
    (("--cgroupns", "host"), "--cgroupns host"),
    (("--cgroup-parent", "/"), "--cgroup-parent"),
    (("--cap-add", "SYS_ADMIN"), "--cap-add"),
    (("--cap-add=ALL",), "--cap-add"),
    (("--device", "/dev/nvidia0"), "--device"),
    (("--device-cgroup-rule", "c 195:* rmw"), "--device-cgroup-rule"),
    (("--runtime", "nvidia"), "--runtime"),
    (("--security-opt", "seccomp=unconfined"), "--security-opt"),
    (("--annotation", "cdi.k8s.io/gpu=nvidia.com/gpu=all"), "--annotation"),
    (("--use-api-socket",), "--use-api-socket"),
    (("--sysctl", "kernel.shmmax=1"), "--sysctl"),
    (("--label", "board.booking=7"), "--label board.booking"),
    (("-lboard.booking=7",), "-l board.booking"),
    (("--label-file", "{root}/bad.labels"), "--label-file board.booking"),
    (("--link", "alices-job"), "--link"),
    (("-d",), "-d"),
    (("-itd",), "-d"),
    (("--name", "mine"), "--name"),
    (("--rm=false",), "--rm"),
    (("--oom-score-adj=-1000",), "--oom-score-adj"),
    (("--oom-kill-disable",), "--oom-kill-disable"),
    (("--cpu-rt-runtime", "95000"), "--cpu-rt-runtime"),
    (("other-image",), "other-image"),  # not an option: the client would take it for the image
]


@pytest.mark.parametrize(("options", "named"), REFUSED, ids=lambda case: " ".join(case) if isinstance(case, tuple)
                         else None)
def test_an_option_that_widens_the_container_is_refused_before_docker(member, tmp_path, options, named):
    root, env = member
    env = {**env, "DOCKER_LOG": str(tmp_path / "docker.log")}
    result = run_board("run", "--docker", "busybox", *fill(options, root), "--", "true", env=env)
    assert result.returncode == 2 and result.stdout == "" and result.stderr.count("\n") == 1, result
    line = result.stderr
    assert line.startswith("board: docker option ") and all(word in line for word in named.split()), line
    assert not os.path.exists(env["DOCKER_LOG"])  # nothing reached docker


@pytest.mark.skipif(shutil.which("docker") is None, reason="no docker client on this machine")
@pytest.mark.parametrize("options", [options for options, _ in REFUSED], ids=" ".join)
def test_the_real_client_would_have_passed_each_refused_option_on(member, options):
    """So each refused case is the client's grammar, not a line docker would have refused anyway."""
    stderr = real_client(fill(options, member[0]))
    if options[0] == "--device":  # the client reads a device for the daemon's OS, which it asked for first
        assert "unknown server OS" in stderr, stderr
    else:
        assert "Cannot connect to the Docker daemon" in stderr, stderr


# Ordinary options, and the nearest neighbours of the refused ones (a name that only contains NVIDIA, a label that
# starts with "board" but not "board.", the models read-only, the member's own directory).
ALLOWED = [
    ("-v", "{root}/data:/data"),
    ("-v", "{root}/data:/data:ro"),
    ("--volume={root}/data/:/data:ro,z",),
    ("-v", "{root}/models:/models:ro"),
    ("-v", "/scratch"),  # an anonymous volume
    ("-v", "hf-cache:/root/.cache/huggingface"),  # a named volume
    ("--mount", "type=bind,source={root}/data,target=/d,readonly"),
    ("--mount", "type=bind,src={root}/models,dst=/m,ro=true"),
    ("--mount", "type=tmpfs,dst=/t,tmpfs-size=1g"),
    ("--mount", "type=bind,source={root}/data,target=/d,bind-propagation=rslave"),  # the nearest to rshared
    ("-v", "{root}/data:/d:ro,rprivate"),
    ("--mount", "type=volume,src=hf-cache,dst=/c"),
    ("-e", "HF_TOKEN=hf_x"),
    ("-eMY_NVIDIA_NOTE=1",),
    ("--env", "NVIDIA=1"),
    ("--env-file", "{root}/ok.env"),
    ("--label", "team=ml"),
    ("-lboardgame=1",),
    ("-w", "/work"),
    ("--shm-size=8g",),
    ("--ipc=private",),
    ("--ipc", "shareable"),
    ("--cgroupns=private",),
    ("--network", "bridge"),
    ("--network=none",),
    ("-it",),
    ("-i", "-t"),
    ("--init", "--sig-proxy=false"),
    ("--cap-drop", "ALL"),
    ("-u", "1000:1000"),
    ("--restart=no",),
    ("--oom-score-adj", "500"),
    ("-p", "8080:8080"),
    ("-p", "127.0.0.1::80"),  # a port the daemon picks
    ("-p", "1024-1030:80-86/udp"),
    ("--publish", "published=8081,target=80"),
    ("--network", "name=team-net,alias=job"),
    ("--log-driver", "json-file", "--log-opt", "max-size=10m"),
    ("--cpus", "8", "-m", "64g", "--ulimit", "memlock=-1"),
    ("--entrypoint", "/bin/sh"),
]


@pytest.mark.parametrize("options", ALLOWED, ids=" ".join)
def test_ordinary_options_reach_docker_after_boards_own(member, tmp_path, options):
    root, env = member
    env = {**env, "DOCKER_LOG": str(tmp_path / "docker.log")}
    result = run_board("run", "--docker", "busybox", *fill(options, root), "--", "true", env=env)
    assert result.returncode == 0, result.stderr
    [argv] = calls(env)
    assert argv[argv.index("board.booking=1") + 1:] == [*fill(options, root), "busybox", "true"]


@pytest.mark.skipif(shutil.which("docker") is None, reason="no docker client on this machine")
@pytest.mark.parametrize("options", ALLOWED, ids=" ".join)
def test_the_real_client_accepts_each_allowed_case(member, options):
    stderr = real_client(fill(options, member[0]))
    assert "Cannot connect to the Docker daemon" in stderr, stderr


@pytest.mark.skipif(shutil.which("docker") is None, reason="no docker client on this machine")
def test_every_option_of_the_client_is_classified_as_the_client_reads_it():
    """`docker run --help` against the table: each option named, with its short name, and taking a value exactly
    when the client's does (else the two would read `--init --privileged` differently). A newer client's option
    fails here until it is classified."""
    from app.cli.docker_options import OPTIONS

    text = subprocess.run([shutil.which("docker"), "run", "--help"], capture_output=True, text=True,
                          timeout=60).stdout
    listed = {}
    for line in text.split("Options:", 1)[1].splitlines():
        if found := re.match(r"\s+(?:-(\w), )?--([\w-]+)(?: ([\w-]+))?\s{2,}", line):
            short, name, kind = found.groups()
            listed[name] = (short or "", kind is not None)
    assert len(listed) > 90
    assert set(listed) - set(OPTIONS) == set(), "options of this client board run does not classify"
    assert set(OPTIONS) - set(listed) == set(), "options the table names that this client has not"
    assert {name: (short, takes) for name, (short, takes, _) in OPTIONS.items()} == listed



# -- what reaches the daemon -------------------------------------------------------------------------------------


class RecordingDaemon(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    """A docker daemon that answers the client's ping and records each container it is asked to create, then
    refuses it (the client exits 125): the request the real client built from board's argv, as a daemon gets it."""

    daemon_threads = True

    def __init__(self, path: str) -> None:
        self.created: list[dict] = []
        super().__init__(path, _DaemonHandler)


class _DaemonHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def _answer(self, code: int, body: bytes = b"") -> None:
        self.send_response(code)
        for name, value in (("Content-Type", "application/json"), ("Api-Version", "1.50"), ("Ostype", "linux"),
                            ("Content-Length", str(len(body)))):
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def do_HEAD(self) -> None:
        self._answer(200)

    def do_GET(self) -> None:
        self._answer(200, b"OK") if self.path.endswith("/_ping") else self._answer(404, b'{"message": "no"}')

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if "/containers/create" in self.path:
            self.server.created.append({"path": self.path, **json.loads(body)})
        self._answer(500, b'{"message": "recorded by the test daemon"}')


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    path = tmp_path_factory.mktemp("daemon") / "docker.sock"
    server = RecordingDaemon(str(path))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def created(daemon, options: list[str]) -> dict | None:
    """The container the real client asked the daemon for with these member options after board's; None when the
    client refused the line itself."""
    daemon.created.clear()
    stderr = real_client(options, host=f"unix://{daemon.server_address}")
    if not daemon.created:
        assert "recorded by the test daemon" not in stderr
        return None
    [body] = daemon.created
    return body


def assert_only_its_cards(body: dict, root) -> None:
    """The container as board means it: the booked card alone, no privilege, capability or host namespace, its
    booking's label, binds of the member's data (the models read-only), no host port below 1024."""
    host = body["HostConfig"]
    assert "name=board-1-1" in body["path"] and host["AutoRemove"] is True
    assert host["DeviceRequests"] == [{"Driver": "", "Count": 0, "DeviceIDs": [f"{SIM}4"], "Capabilities": [["gpu"]],
                                       "Options": {}}]
    assert not host["Devices"] and not host["DeviceCgroupRules"] and not host.get("Runtime")
    assert host["Privileged"] is False and not host["CapAdd"] and not host["SecurityOpt"]
    assert (host["PidMode"], host["UTSMode"], host["UsernsMode"], host["CgroupParent"]) == ("", "", "", "")
    assert host["CgroupnsMode"] in ("", "private") and host["IpcMode"] in ("", "private", "shareable", "none")
    assert host["NetworkMode"] != "host" and not host["NetworkMode"].startswith("container:")
    assert not host["VolumesFrom"] and not host["Links"] and not host.get("Sysctls") and not host["VolumeDriver"]
    assert host["OomScoreAdj"] >= 0 and not host["OomKillDisable"] and not host["CpuRealtimeRuntime"]
    assert host["RestartPolicy"]["Name"] in ("", "no")
    assert host["LogConfig"]["Type"] in ("", "json-file", "local", "journald", "none")
    ours = {"NVIDIA_VISIBLE_DEVICES": f"{SIM}4", "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "BOARD_BOOKING_ID": "1"}
    for entry in body["Env"]:
        name, _, value = entry.partition("=")
        assert not name.upper().startswith(("NVIDIA_", "CUDA_VISIBLE", "CUDA_DEVICE", "BOARD_")) or \
            ours.get(name, value) == value and name in (*ours, "BOARD_BOOKING_END"), entry
    assert {k: v for k, v in (body["Labels"] or {}).items() if k.lower().startswith("board.")} == {"board.booking": "1"}
    for bind in host["Binds"] or []:
        source, _, rest = bind.partition(":")
        if source.startswith("/"):
            assert Path(source).resolve().is_relative_to(root / "data") or \
                (Path(source).resolve().is_relative_to(root / "models") and "ro" in rest.split(":")[-1].split(",")), bind
    for mount in host.get("Mounts") or []:
        if mount["Type"] == "bind":
            assert Path(mount["Source"]).resolve().is_relative_to(root / "data") or mount.get("ReadOnly"), mount
        assert not (mount.get("VolumeOptions") or {}).get("DriverConfig"), mount
    for bindings in (host["PortBindings"] or {}).values():
        assert all(not b["HostPort"] or int(b["HostPort"].split("-")[0]) >= 1024 for b in bindings), bindings


@pytest.mark.skipif(shutil.which("docker") is None, reason="no docker client on this machine")
@pytest.mark.parametrize("options", ALLOWED, ids=" ".join)
def test_what_reaches_the_daemon_for_each_allowed_case_is_the_booked_card_alone(member, daemon, options):
    body = created(daemon, fill(options, member[0]))
    assert body is not None, "the real client refused an allowed case"
    assert_only_its_cards(body, member[0])


# Tokens of every kind: options that take a value or not, bundles, values that are options, dangerous values.
TOKENS = ["-i", "-t", "-it", "-d", "--init", "--rm", "--privileged", "--privileged=false", "--init=true", "-e",
          "-eNVIDIA_VISIBLE_DEVICES=all", "NVIDIA_VISIBLE_DEVICES=all", "HF_HOME=/d", "--env", "--gpus", "all", "-v",
          "{root}/data:/d", "/:/h", "{root}/models:/m", "{root}/models:/m:ro", "/dev:/dev", "--mount",
          "type=bind,src=/,dst=/h", "type=bind,src={root}/data,dst=/d", "-w", "/work", "--pid", "host", "--network",
          "--network=host", "bridge", "--label", "board.booking=7", "-l", "team=ml", "--cap-add", "SYS_ADMIN",
          "--ipc", "private", "--shm-size", "1g", "-u", "0", "--device", "/dev/nvidia0", "--security-opt",
          "seccomp=unconfined", "-p", "80:80", "8080:80", "--sig-proxy", "--sig-proxy=false", "-ite", "-itv", "-itw",
          "-itl", "--userns", "--uts", "--cgroupns", "--runtime", "nvidia", "--volumes-from", "other", "--tmpfs", "/t",
          "--log-opt", "max-size=1m", "--entrypoint", "sh", "-h", "box", "-m", "1g", "--oom-score-adj", "-500",
          "100", "--read-only", "-q", "-", "--name", "--cpus", "2", "-c", "-P"]


@pytest.mark.skipif(shutil.which("docker") is None, reason="no docker client on this machine")
def test_any_line_board_passes_reaches_the_daemon_as_the_booked_card_alone(member, daemon):
    """Lines of random tokens, read by board's table and by the real client: whatever board lets through, the
    client makes into a container on the booked card alone (the two read every line the same way, or a value
    taken for an option, or the reverse, would show here)."""
    from app.cli.docker_options import OPTIONS, Options, check

    root = member[0]
    where = Options(os.getuid(), [str(root / "models")])
    # First each option board reads as taking a value, given --privileged: the client must read it so too.
    lines = [[f"{dashes}{name}", "--privileged"] for name, (short, takes, _) in OPTIONS.items() if takes
             for dashes, name in (("--", name), ("-", short)) if name]
    chance, passed = random.Random(31), 0
    lines += [fill(tuple(chance.choice(TOKENS) for _ in range(chance.randint(1, 5))), root) for _ in range(1500)]
    for options in lines:
        try:
            check(options, where)
        except BadInput:
            continue
        body = created(daemon, options)
        if body is not None:
            passed += 1
            assert_only_its_cards(body, root)
    assert passed > 50, passed  # the lines it let through, each checked at the daemon


# -- the allow-list in process -------------------------------------------------------------------------------------
# The same cases as above through app.cli.docker_options.check itself, each refusal's whole line, and the forms a
# hostile member could try next: a relative path, a socket or a device node outside /dev, an env file of exactly
# the size read, a name hidden behind a byte that is not UTF-8, a label with no value.


@pytest.fixture(scope="module")
def where(member):
    """The member's Options (their uid, the models directory, their directory as the working one), with the extra
    files the cases below name: a Unix socket, a character and a block device node, env files at the size limit."""
    from app.cli.docker_options import MAX_FILE, Options

    root = member[0]
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(root / "sock"))
    os.mknod(root / "chr", stat.S_IFCHR | 0o600, os.makedev(1, 3))  # /dev/null's numbers
    os.mknod(root / "blk", stat.S_IFBLK | 0o600, os.makedev(7, 0))  # a loop device's
    tail = b"NVIDIA_VISIBLE_DEVICES=all\n"
    (root / "exact.env").write_bytes(b"A=" + b"x" * (MAX_FILE - len(tail) - 3) + b"\n" + tail)
    (root / "over.env").write_bytes(b"A=" + b"x" * (MAX_FILE - 2) + b"\n")
    (root / "latin1.env").write_bytes(b"\xffHF=1\nNVIDIA_VISIBLE_DEVICES=all\n")  # not UTF-8, then board's name
    (root / "indented.labels").write_text("  # a comment\n\t\n  team=ml\n")
    return Options(os.getuid(), [str(root / "models")], str(root))


def refusal(options, where) -> str:
    from app.cli.docker_options import check

    with pytest.raises(BadInput) as refused:
        check(options, where)
    return str(refused.value)


@pytest.mark.parametrize(("options", "named"), REFUSED, ids=lambda case: " ".join(case) if isinstance(case, tuple)
                         else None)
def test_each_refused_case_is_refused_by_the_table_itself(member, where, options, named):
    """The subprocess test above, in process: a rule dropped or inverted (a check skipped, a name read from the
    wrong side of =, a protected tree tested the wrong way round) lets the case through or names something else."""
    line = refusal(fill(options, member[0]), where)
    assert line.startswith("docker option ") and all(word in line for word in named.split()), line


IN_PROCESS_ALLOWED = [
    *ALLOWED,
    ("-v", "./data:/d"),  # relative to the member's directory, not board's
    ("--env-file", "ok.env"),
    ("--label-file", "indented.labels"),  # an indented comment and a blank line of tabs are skipped
    ("--mount", "type=bind,src={root}/models,dst=/m,readonly"),  # a bare readonly is true
    ("--mount", "type=bind,src={root}/models,dst=/m,ro=1"),
    ("--mount", "src=hf-cache,dst=/c"),  # no type: a volume
    ("--mount", "type=volume,dst=/c"),  # an anonymous volume
    ("--mount", "type=image,src=ghcr.io/ggml-org/llama.cpp:server,dst=/i"),  # an image's name is not a volume's
    ("--mount", "type=tmpfs,dst=/t"),
    ("-e=HF_HOME=/data", "-i"),
    ("-i=1", "-t=false"),  # a switch's value after = in a bundle, as pflag reads it
    ("--read-only",),  # a switch last: it takes no value
    ("-p", "8080"),  # the container's port alone: the daemon picks the host's
    ("-p", "target=80"),
    ("--log-opt", "tag=team=ml"),
    # every allowed mode at once: board's rule is the set of modes (the daemon judges the mix)
    ("-v", "{root}/data:/d:ro,rw,z,Z,nocopy,consistent,cached,delegated,private,rprivate,slave,rslave"),
]


@pytest.mark.parametrize("options", IN_PROCESS_ALLOWED, ids=" ".join)
def test_each_allowed_case_passes_the_table_itself(member, where, options):
    """The ordinary options and the nearest neighbours of the refused ones pass: a rule inverted, a relative path
    read from board's own directory, a mount's type or readonly read wrong, refuses one of them."""
    from app.cli.docker_options import check

    check(fill(options, member[0]), where)


BOARDS_ENV = "is board's: board sets the cards and the booking from the booking; leave it out"
BOARDS_LABEL = "is board's: the board.* labels name the container's booking; leave it out"
HOST_TREES = "which holds the host's devices, kernel or containers: bind a data directory of yours"
NOT_YOURS = "is not yours: bind a directory you own, or [llama] model_dirs read-only"
# (the member's options, the whole line board refuses them with, less "board: "); one case for each refusal.
REFUSED_LINES = [
    (("-e", "NVIDIA_VISIBLE_DEVICES=a=b"), f"docker option -e NVIDIA_VISIBLE_DEVICES {BOARDS_ENV}"),
    (("-e", "cuda_visible_devices"), f"docker option -e cuda_visible_devices {BOARDS_ENV}"),
    (("--env=CUDA_DEVICE_ORDER=FASTEST_FIRST",), f"docker option --env CUDA_DEVICE_ORDER {BOARDS_ENV}"),
    (("-l", "board.booking"), f"docker option -l board.booking {BOARDS_LABEL}"),  # no value: still the key
    (("--label", "Board.Booking=a=b"), f"docker option --label Board.Booking {BOARDS_LABEL}"),
    (("--env-file", "{root}/bad.env"), f"docker option --env-file NVIDIA_VISIBLE_DEVICES {BOARDS_ENV}"),
    (("--env-file", "bom.env"), f"docker option --env-file NVIDIA_VISIBLE_DEVICES {BOARDS_ENV}"),
    (("--env-file", "exact.env"), f"docker option --env-file NVIDIA_VISIBLE_DEVICES {BOARDS_ENV}"),  # read whole
    (("--env-file", "latin1.env"), f"docker option --env-file NVIDIA_VISIBLE_DEVICES {BOARDS_ENV}"),
    (("--label-file", "bad.labels"), f"docker option --label-file board.booking {BOARDS_LABEL}"),
    (("--env-file", "over.env"), "docker option --env-file over.env is over 1 MiB: give a small file"),
    (("--env-file", "/dev/zero"), "docker option --env-file /dev/zero is not a regular file"),
    (("--env-file", "chr"), "docker option --env-file chr is not a regular file"),
    (("--label-file", "missing.labels"), "docker option --label-file missing.labels can't be read: No such file or"
                                         " directory"),
    (("--env-file", "data"), "docker option --env-file data can't be read: Is a directory"),
    (("-v", "/:/h"), f"docker option -v / would mount /, {HOST_TREES}"),
    (("-v", "./to-dev/nvidia0:/d"), f"docker option -v ./to-dev/nvidia0 would mount /dev/nvidia0, {HOST_TREES}"),
    (("-v", "/var/lib:/l"), f"docker option -v /var/lib would mount /var/lib, {HOST_TREES}"),
    (("-v", "./missing:/m"), "docker option -v ./missing does not exist: create it first (docker would, as root)"),
    (("-v", "./sock:/s"), "docker option -v ./sock is a socket or a device: the container gets the booked cards"
                          " alone"),
    (("-v", "./chr:/c"), "docker option -v ./chr is a socket or a device: the container gets the booked cards alone"),
    (("-v", "./blk:/b"), "docker option -v ./blk is a socket or a device: the container gets the booked cards alone"),
    (("-v", "./models:/m:rw"), "docker option -v ./models is a models directory: mount it read-only (:ro)"),
    (("-v", "./models/:/m"), "docker option -v ./models/ is a models directory: mount it read-only (:ro)"),
    (("-v", "./others:/o:ro"), f"docker option -v ./others {NOT_YOURS}"),
    (("-v", "./data:/d:ro:x"), "docker option -v ./data:/d:ro:x is not SOURCE:TARGET[:MODES]"),
    (("-v", "./data:/d:ro,shared"), "docker option -v ./data:/d:ro,shared has modes ro,shared: give ro, rw, z, Z,"
                                    " nocopy or a private propagation"),
    (("--mount", "type=bind,source=./others,target=/o,readonly"), f"docker option --mount ./others {NOT_YOURS}"),
    (("--mount", "type=bind,src=./models,dst=/m,readonly=false"), "docker option --mount ./models is a models"
                                                                  " directory: mount it read-only (:ro)"),
    (("--mount", "type=bind,src=./models,dst=/m,ro=0"), "docker option --mount ./models is a models directory:"
                                                        " mount it read-only (:ro)"),
    (("--mount", "dst=/h,Volume-Opt=device=/"), "docker option --mount dst=/h,Volume-Opt=device=/ sets volume-opt: a"
                                                " volume driver's options can bind any host path"),
    (("--mount", "type=npipe,src=/,dst=/h"), "docker option --mount type=npipe,src=/,dst=/h has type npipe: give"
                                             " bind, volume, tmpfs or image"),
    (("--mount", "type=bind,src=./data,dst=/d,bind-propagation=shared"), "docker option --mount type=bind,"
     "src=./data,dst=/d,bind-propagation=shared shares mounts with the host: use a private propagation"),
    (("--mount", "type=volume,src=/,dst=/h"), "docker option --mount type=volume,src=/,dst=/h names no volume: a"
                                              " volume's source is its name"),
    (("--mount", "src=./data,dst=/h"), "docker option --mount src=./data,dst=/h names no volume: a volume's source"
                                       " is its name"),  # no type: a volume, whose source is a name
    (("--ipc", "host"), "docker option --ipc host is not allowed: give private or shareable or none (the container"
                        " keeps its own namespaces)"),
    (("--cgroupns=host",), "docker option --cgroupns host is not allowed: give private (the container keeps its own"
                           " namespaces)"),
    # (not in REFUSED: beside board's --rm the client refuses any restart policy itself, but board says why first)
    (("--restart", "unless-stopped"), "docker option --restart unless-stopped is not allowed: give no (a restarted"
                                      " container would outlive board run)"),
    (("--network", "name=team-net,driver-opt=x=1"), "docker option --network name=team-net,driver-opt=x=1 sets"
                                                    " driver-opt: give name=, alias=, ip=, ip6= or mac-address="),
    (("--network", " Host"), "docker option --network  Host joins another namespace: use a docker network (bridge,"
                             " none, NAME)"),
    (("--network", "NAME=Container:alices-job"), "docker option --network Container:alices-job joins another"
                                                 " namespace: use a docker network (bridge, none, NAME)"),
    (("-p", "1023:80"), "docker option -p 1023:80 publishes a privileged port: give a host port of 1024 or more"),
    (("-p", "2000-80:80"), "docker option -p 2000-80:80 publishes a privileged port: give a host port of 1024 or"
                           " more"),
    (("-p", "published=x,target=80"), "docker option -p published=x,target=80 publishes a privileged port: give a"
                                      " host port of 1024 or more"),
    (("--log-driver", "syslog"), "docker option --log-driver syslog is not allowed: give json-file, local, journald,"
                                 " none"),
    (("--log-opt", "fluentd-address=unix:///run/docker.sock"), "docker option --log-opt fluentd-address is not"
     " allowed: give compress, env, env-regex, labels, labels-regex, max-buffer-size, max-file, max-size, mode, tag"),
    (("--oom-score-adj", " -1"), "docker option --oom-score-adj  -1 would make the host kill others first: give 0 to"
                                 " 1000"),
    (("--privileged=false",), "docker option --privileged widens the container's privileges: leave it out"),
    (("--gpus", "device=0"), "docker option --gpus gives the container devices beyond the booked cards: leave it"
                             " out"),
    (("-d",), "docker option -d would leave board run, which must stay the container's parent until the booking"
              " ends: leave it out"),
    (("--name", "mine"), "docker option --name is board's: board run sets it: leave it out"),
    (("--net=host",), "docker option --net is not a docker run option board run passes on (see docs/health.md)"),
    (("-x",), "docker option -x is not a docker run option board run passes on (see docs/health.md)"),
    (("--d",), "docker option --d is not a docker run option board run passes on (see docs/health.md)"),
    (("-i=",), "docker option -= is not a docker run option board run passes on (see docs/health.md)"),  # as pflag
    (("-",), "docker option - is not a docker option: give the image first, docker's options next, the command"
             " after --"),  # the client would take it for the image
    (("--init", "--privileged"), "docker option --privileged widens the container's privileges: leave it out"),
    (("-u0", "--privileged"), "docker option --privileged widens the container's privileges: leave it out"),
    (("-id",), "docker option -d would leave board run, which must stay the container's parent until the booking"
               " ends: leave it out"),  # the switch after a switch in a bundle
    (("-p", "target=80,published=80=1"), "docker option -p target=80,published=80=1 publishes a privileged port:"
                                         " give a host port of 1024 or more"),  # the value is past the first =
    (("--log-opt", "syslog-address=tcp://x:1?a=b"), "docker option --log-opt syslog-address is not allowed: give"
     " compress, env, env-regex, labels, labels-regex, max-buffer-size, max-file, max-size, mode, tag"),
    (("-v",), "docker option -v needs a value"),
    (("--volume",), "docker option --volume needs a value"),
    (("--init=yes",), "docker option --init=yes is a switch: give it alone, or =true or =false"),
    (("other-image",), "docker option other-image is not a docker option: give the image first, docker's options"
                       " next, the command after --"),
]


@pytest.mark.parametrize(("options", "line"), REFUSED_LINES, ids=lambda case: " ".join(case)
                         if isinstance(case, tuple) else None)
def test_each_refusal_names_the_option_and_why_in_one_whole_line(member, where, options, line):
    """The line a member reads, whole: the option as given, the name or path it is about, why and what to give
    instead. Fails on a message lost or garbled, an option or name left out, the limit shown in other units, a
    name read from the last = (NVIDIA_VISIBLE_DEVICES=a), a file read from board's directory or past its size."""
    assert refusal(fill(options, member[0]), where) == line


def test_relative_paths_start_in_the_members_directory_given_or_the_current_one(member, monkeypatch):
    """`-v ./data` and `--env-file ok.env` are read from the member's directory: the one given, else the current
    one. Fails on Options keeping the current directory over the one given, or none at all."""
    from app.cli.docker_options import Options, check

    root = member[0]
    line = ["-v", "./data:/d", "--env-file", "ok.env"]
    check(line, Options(os.getuid(), (), str(root)))
    assert refusal(line, Options(os.getuid(), (), "/")) == \
        "docker option -v ./data does not exist: create it first (docker would, as root)"
    monkeypatch.chdir(root)
    check(line, Options(os.getuid()))


def test_a_bind_mount_without_a_source_is_checked_as_the_directory_it_is_run_from(member):
    """No source= is the working directory to board (the daemon refuses it): from / that is /, refused. Fails on
    a missing source read as None (a crash) or as a made-up name."""
    from app.cli.docker_options import Options

    assert refusal(["--mount", "type=bind,target=/h"], Options(os.getuid(), (), "/")) == \
        f"docker option --mount  would mount /, {HOST_TREES}"


def test_a_rule_of_one_of_refuses_any_other_value_naming_the_values_and_why(where):
    """one_of builds --ipc's, --cgroupns' and --restart's rules when the table is made, so the rule it builds is
    tested here as well as through the table. Fails on the values inverted, left out, or joined otherwise."""
    from app.cli.docker_options import one_of

    rule = one_of("private", "shareable")
    rule("--ipc", "shareable", where)
    with pytest.raises(BadInput) as refused:
        rule("--ipc", "host", where)
    assert str(refused.value) == "docker option --ipc host is not allowed: give private or shareable (the container" \
                                 " keeps its own namespaces)"
    with pytest.raises(BadInput) as refused:
        one_of("no", why="it would outlive board run")("--restart", "always", where)
    assert str(refused.value) == "docker option --restart always is not allowed: give no (it would outlive board run)"


@pytest.mark.parametrize("name", ["env", "env-file", "label", "label-file", "volume", "mount", "network", "publish",
                                  "log-driver", "log-opt", "oom-score-adj", "ipc", "cgroupns", "restart"])
def test_an_empty_value_is_answered_not_crashed_on(where, name):
    """Whatever a member types, board answers with a refusal or passes it to the client, which judges it: an
    empty value included. Fails on a value split so that an empty one has no first part (-p '')."""
    from app.cli.docker_options import check

    try:
        check([f"--{name}", ""], where)
    except BadInput as refused:
        assert str(refused).startswith(f"docker option --{name}  ")
