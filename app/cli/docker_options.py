"""The docker run options a member may add to `board run --docker`: an allow-list over every option of the client.

board gives the container exactly the booked cards (`--gpus device=UUID,...`, NVIDIA_VISIBLE_DEVICES) and names
its booking (label board.booking). An option that widens the devices, the privileges, the namespaces or the
capabilities, mounts the host's system trees or the docker socket, or overrides what board set would void that, so
every option of `docker run --help` (docker 28.2) is classified below: allowed, refused, or allowed with its value
checked. An option the table does not name (a newer client's, or a hidden alias such as --net) is refused.

The options are read with the client's own grammar (spf13/pflag): `--opt=value`, `--opt value`, a bool's
`--opt=false`, short bundles (`-it`, `-itv /d:/d`, `-eFOO=1`, `-e=FOO=1`), and a value-taking option takes the
next argument whatever it looks like. Whether an option takes a value must match the client's, or the two would
read the same line differently: tests/integration/test_run_docker.py checks this table against `docker run --help`.
"""

from __future__ import annotations

import csv
import os
import re
import stat
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

from app.errors import BadInput

# Where the host's devices, kernel, runtime sockets and other containers' files are: a bind mount of one of these,
# of anything under one, or of a directory above one (`/`, `/var`) reaches past the booked cards.
PROTECTED = ("/dev", "/proc", "/sys", "/run/docker.sock", "/var/run/docker.sock", "/run/docker", "/run/containerd",
             "/var/lib/docker", "/var/lib/containerd")
# The environment board sets, or the NVIDIA runtime reads to pick the cards: the container's cards are board's.
_BOARD_ENV = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")
_BOARD_ENV_PREFIXES = ("NVIDIA_", "BOARD_")
_VOLUME_NAME = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]+")
_VOLUME_MODES = {"ro", "rw", "z", "Z", "nocopy", "consistent", "cached", "delegated", "private", "rprivate", "slave",
                 "rslave"}  # not shared/rshared: a mount the container made would show on the host
_MOUNT_KEYS = {"type", "source", "src", "target", "dst", "destination", "readonly", "ro", "bind-propagation",
               "bind-recursive", "bind-nonrecursive", "consistency", "volume-nocopy", "volume-subpath", "volume-label",
               "tmpfs-size", "tmpfs-mode", "image-subpath"}  # not volume-driver, volume-opt: they bind any host path
_MOUNT_ALIASES = {"src": "source", "dst": "target", "destination": "target", "ro": "readonly"}
_NETWORK_KEYS = {"name", "alias", "ip", "ip6", "link-local-ip", "mac-address", "gw-priority"}  # not driver-opt (sysctls)
# Log drivers that write where the daemon keeps them, and their options: syslog, fluentd, gelf... would have the daemon
# (root) connect wherever syslog-address or fluentd-address says, the docker socket included.
_LOG_DRIVERS = ("json-file", "local", "journald", "none")
_LOG_OPTS = {"max-size", "max-file", "compress", "mode", "max-buffer-size", "tag", "labels", "labels-regex", "env",
             "env-regex"}
MAX_FILE = 1 << 20  # an --env-file or --label-file
_TRUE = {"1", "t", "T", "true", "TRUE", "True"}  # pflag's (strconv.ParseBool)
_FALSE = {"0", "f", "F", "false", "FALSE", "False"}


class Options:
    """What the checks need beyond the option: who runs the container (the member), the models' directories
    (bound read-only though they are not the member's) and where relative paths start."""

    def __init__(self, uid: int, model_dirs: Sequence[str] = (), cwd: str | None = None) -> None:
        self.uid, self.model_dirs, self.cwd = uid, tuple(model_dirs), cwd or os.getcwd()


def refuse(option: str, why: str) -> BadInput:
    return BadInput(f"docker option {option} {why}")


def env_name(option: str, value: str, where: Options) -> None:
    name = value.partition("=")[0].strip()
    if name.upper() in _BOARD_ENV or name.upper().startswith(_BOARD_ENV_PREFIXES):
        raise refuse(f"{option} {name}", "is board's: board sets the cards and the booking from the booking; leave it out")


def label_key(option: str, value: str, where: Options) -> None:
    key = value.partition("=")[0].strip()
    if key.lower().startswith("board."):
        raise refuse(f"{option} {key}", "is board's: the board.* labels name the container's booking; leave it out")


def key_value_file(option: str, value: str, where: Options, check: Callable[[str, str, Options], None]) -> None:
    """--env-file and --label-file, read as the client reads them (a line NAME=VALUE or NAME; blank lines and
    # comments skipped), each name checked as -e's or --label's. Only a small regular file: not /dev/zero."""
    path = os.path.join(where.cwd, value)
    try:
        with open(path, "rb") as file:
            if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
                raise refuse(f"{option} {value}", "is not a regular file")
            data = file.read(MAX_FILE + 1)
            if len(data) > MAX_FILE:  # docker reads it all: a name past what was checked would pass
                raise refuse(f"{option} {value}", f"is over {MAX_FILE >> 20} MiB: give a small file")
            text = data.decode("utf-8", "replace").removeprefix("\ufeff")
    except OSError as e:
        raise refuse(f"{option} {value}", f"can't be read: {e.strerror}") from None
    for line in text.splitlines():
        line = line.lstrip()
        if line and not line.startswith("#"):
            check(option, line, where)


def host_path(option: str, source: str, readonly: bool, where: Options) -> None:
    """A bind mount's source, after the symlinks (the daemon follows them as root): never a protected tree, inside
    one or above one, never a socket or a device; the member's own, or a models directory read-only. The daemon
    creates a missing source as root, so it must exist."""
    real = os.path.realpath(os.path.join(where.cwd, source))
    for protected in PROTECTED:
        if Path(real).is_relative_to(protected) or Path(protected).is_relative_to(real):
            raise refuse(f"{option} {source}", f"would mount {real}, which holds the host's devices, kernel or"
                                               f" containers: bind a data directory of yours")
    try:
        info = os.stat(real)
    except OSError:
        raise refuse(f"{option} {source}", "does not exist: create it first (docker would, as root)") from None
    if stat.S_ISSOCK(info.st_mode) or stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode):
        raise refuse(f"{option} {source}", "is a socket or a device: the container gets the booked cards alone")
    if info.st_uid == where.uid:
        return
    if any(Path(real).is_relative_to(os.path.realpath(d)) for d in where.model_dirs):
        if readonly:
            return
        raise refuse(f"{option} {source}", "is a models directory: mount it read-only (:ro)")
    raise refuse(f"{option} {source}", "is not yours: bind a directory you own, or [llama] model_dirs read-only")


def volume(option: str, value: str, where: Options) -> None:
    """-v [SOURCE:]TARGET[:MODES], split as the daemon's Linux parser splits it (two parts are SOURCE:TARGET, so
    `/:ro` is the source /); a SOURCE that is not a volume's name is a host path."""
    parts = value.split(":")
    if len(parts) > 3:
        raise refuse(f"{option} {value}", "is not SOURCE:TARGET[:MODES]")
    source = parts[0] if len(parts) > 1 else ""
    modes = set(parts[2].split(",")) if len(parts) == 3 else set()
    if not modes <= _VOLUME_MODES:
        raise refuse(f"{option} {value}", f"has modes {parts[2]}: give ro, rw, z, Z, nocopy or a private propagation")
    if source and not _VOLUME_NAME.fullmatch(source):
        host_path(option, source, "ro" in modes, where)


def mount(option: str, value: str, where: Options) -> None:
    """--mount type=bind,source=...,target=...: a CSV line of key=value fields, as the client reads it."""
    fields: dict[str, str] = {}
    for field in next(csv.reader([value]), []):
        key, has, val = field.partition("=")
        key = key.strip().lower()
        if key not in _MOUNT_KEYS:
            raise refuse(f"{option} {value}", f"sets {key}: a volume driver's options can bind any host path")
        fields[_MOUNT_ALIASES.get(key, key)] = val if has else "true"  # the last of src= and source= wins, as there
    kind = fields.get("type", "volume")
    source = fields.get("source", "")
    readonly = fields.get("readonly", "false") in _TRUE
    if kind not in ("bind", "volume", "tmpfs", "image"):
        raise refuse(f"{option} {value}", f"has type {kind}: give bind, volume, tmpfs or image")
    if fields.get("bind-propagation", "").endswith("shared"):
        raise refuse(f"{option} {value}", "shares mounts with the host: use a private propagation")
    if kind == "bind":
        host_path(option, source, readonly, where)
    elif kind == "volume" and source and not _VOLUME_NAME.fullmatch(source):
        raise refuse(f"{option} {value}", "names no volume: a volume's source is its name")


def one_of(*allowed: str, why: str = "the container keeps its own namespaces") -> Callable[[str, str, Options], None]:
    def check(option: str, value: str, where: Options) -> None:
        if value not in allowed:
            raise refuse(f"{option} {value}", f"is not allowed: give {' or '.join(allowed)} ({why})")
    return check


def network(option: str, value: str, where: Options) -> None:
    """--network NAME, or the client's CSV form name=NAME,alias=...: never the host's or another container's."""
    name = value
    if "=" in value:
        for field in next(csv.reader([value]), []):
            key, _, val = field.partition("=")
            if key.lower() not in _NETWORK_KEYS:
                raise refuse(f"{option} {value}", f"sets {key}: give name=, alias=, ip=, ip6= or mac-address=")
            if key.lower() == "name":
                name = val
    if name.strip().lower() == "host" or name.strip().lower().startswith("container:"):
        raise refuse(f"{option} {name}", "joins another namespace: use a docker network (bridge, none, NAME)")


def publish(option: str, value: str, where: Options) -> None:
    """-p [IP:][HOST:]CONTAINER[/PROTO] or published=HOST,target=...: the daemon binds the host's port as root, so
    not a privileged one (below 1024), which a member could not bind."""
    if "=" in value:
        fields = dict(field.partition("=")[::2] for field in next(csv.reader([value]), []))
        host = fields.get("published", "")
    else:
        parts = value.split("/", 1)[0].rsplit(":", 2)
        host = parts[-2] if len(parts) > 1 else ""
    for port in filter(None, host.split("-")):
        if not port.strip().isdigit() or int(port) < 1024:
            raise refuse(f"{option} {value}", "publishes a privileged port: give a host port of 1024 or more")


def log_driver(option: str, value: str, where: Options) -> None:
    if value not in _LOG_DRIVERS:
        raise refuse(f"{option} {value}", f"is not allowed: give {', '.join(_LOG_DRIVERS)}")


def log_opt(option: str, value: str, where: Options) -> None:
    key = value.partition("=")[0]
    if key not in _LOG_OPTS:
        raise refuse(f"{option} {key}", f"is not allowed: give {', '.join(sorted(_LOG_OPTS))}")


def oom_score(option: str, value: str, where: Options) -> None:
    if value.lstrip().startswith("-"):
        raise refuse(f"{option} {value}", "would make the host kill others first: give 0 to 1000")


ALLOW = "allowed"
# Reasons, each finishing "docker option OPTION ...".
DEVICES = "gives the container devices beyond the booked cards"
PRIVILEGES = "widens the container's privileges"
NAMESPACES = "shares a namespace with the host or another container"
BOARDS = "is board's: board run sets it"
PARENT = "would leave board run, which must stay the container's parent until the booking ends"

# Every option of `docker run --help` (28.2): long name -> (short name, takes a value, rule). A rule is ALLOW, a
# reason it is refused, or a check of its value.
Rule = str | Callable[[str, str, Options], None]
OPTIONS: dict[str, tuple[str, bool, Rule]] = {
    "add-host": ("", True, ALLOW),
    "annotation": ("", True, "is passed to the runtime, which may read devices from it (CDI)"),
    "attach": ("a", True, ALLOW),
    "blkio-weight": ("", True, ALLOW),
    "blkio-weight-device": ("", True, ALLOW),  # a limit on a device, not access to it
    "cap-add": ("", True, PRIVILEGES),
    "cap-drop": ("", True, ALLOW),
    "cgroup-parent": ("", True, "moves the container out of its cgroup"),
    "cgroupns": ("", True, one_of("private")),
    "cidfile": ("", True, ALLOW),  # written by the client, as the member
    "cpu-count": ("", True, ALLOW),
    "cpu-percent": ("", True, ALLOW),
    "cpu-period": ("", True, ALLOW),
    "cpu-quota": ("", True, ALLOW),
    "cpu-rt-period": ("", True, PRIVILEGES),  # real-time scheduling
    "cpu-rt-runtime": ("", True, PRIVILEGES),
    "cpu-shares": ("c", True, ALLOW),
    "cpus": ("", True, ALLOW),
    "cpuset-cpus": ("", True, ALLOW),
    "cpuset-mems": ("", True, ALLOW),
    "detach": ("d", False, PARENT),
    "detach-keys": ("", True, ALLOW),
    "device": ("", True, DEVICES),
    "device-cgroup-rule": ("", True, DEVICES),
    "device-read-bps": ("", True, ALLOW),
    "device-read-iops": ("", True, ALLOW),
    "device-write-bps": ("", True, ALLOW),
    "device-write-iops": ("", True, ALLOW),
    "disable-content-trust": ("", False, ALLOW),
    "dns": ("", True, ALLOW),
    "dns-option": ("", True, ALLOW),
    "dns-search": ("", True, ALLOW),
    "domainname": ("", True, ALLOW),
    "entrypoint": ("", True, ALLOW),
    "env": ("e", True, env_name),
    "env-file": ("", True, partial(key_value_file, check=env_name)),
    "expose": ("", True, ALLOW),
    "gpus": ("", True, DEVICES),
    "group-add": ("", True, ALLOW),  # root in the container reads its mounts anyway; the mounts are the limit
    "health-cmd": ("", True, ALLOW),
    "health-interval": ("", True, ALLOW),
    "health-retries": ("", True, ALLOW),
    "health-start-interval": ("", True, ALLOW),
    "health-start-period": ("", True, ALLOW),
    "health-timeout": ("", True, ALLOW),
    "help": ("", False, ALLOW),
    "hostname": ("h", True, ALLOW),
    "init": ("", False, ALLOW),
    "interactive": ("i", False, ALLOW),
    "io-maxbandwidth": ("", True, ALLOW),
    "io-maxiops": ("", True, ALLOW),
    "ip": ("", True, ALLOW),
    "ip6": ("", True, ALLOW),
    "ipc": ("", True, one_of("private", "shareable", "none")),
    "isolation": ("", True, ALLOW),
    "kernel-memory": ("", True, ALLOW),
    "label": ("l", True, label_key),
    "label-file": ("", True, partial(key_value_file, check=label_key)),
    "link": ("", True, "gives the container another container's environment"),
    "link-local-ip": ("", True, ALLOW),
    "log-driver": ("", True, log_driver),
    "log-opt": ("", True, log_opt),
    "mac-address": ("", True, ALLOW),
    "memory": ("m", True, ALLOW),
    "memory-reservation": ("", True, ALLOW),
    "memory-swap": ("", True, ALLOW),
    "memory-swappiness": ("", True, ALLOW),
    "mount": ("", True, mount),
    "name": ("", True, BOARDS),
    "network": ("", True, network),
    "network-alias": ("", True, ALLOW),
    "no-healthcheck": ("", False, ALLOW),
    "oom-kill-disable": ("", False, "would leave the host's memory to the container"),
    "oom-score-adj": ("", True, oom_score),
    "pid": ("", True, NAMESPACES),
    "pids-limit": ("", True, ALLOW),
    "platform": ("", True, ALLOW),
    "privileged": ("", False, PRIVILEGES),
    "publish": ("p", True, publish),
    "publish-all": ("P", False, ALLOW),
    "pull": ("", True, ALLOW),
    "quiet": ("q", False, ALLOW),
    "read-only": ("", False, ALLOW),
    "restart": ("", True, one_of("no", why="a restarted container would outlive board run")),
    "rm": ("", False, BOARDS),
    "runtime": ("", True, DEVICES),
    "security-opt": ("", True, PRIVILEGES),
    "shm-size": ("", True, ALLOW),
    "sig-proxy": ("", False, ALLOW),
    "stop-signal": ("", True, ALLOW),
    "stop-timeout": ("", True, ALLOW),
    "storage-opt": ("", True, ALLOW),
    "sysctl": ("", True, "sets the kernel's settings"),
    "tmpfs": ("", True, ALLOW),
    "tty": ("t", False, ALLOW),
    "ulimit": ("", True, ALLOW),
    "use-api-socket": ("", False, "mounts the docker socket, which is root on the host"),
    "user": ("u", True, ALLOW),
    "userns": ("", True, NAMESPACES),
    "uts": ("", True, NAMESPACES),
    "volume": ("v", True, volume),
    "volume-driver": ("", True, "lets a volume plugin bind any host path"),
    "volumes-from": ("", True, "mounts another container's volumes"),
    "workdir": ("w", True, ALLOW),
}
SHORT = {short: name for name, (short, _, _) in OPTIONS.items() if short}


def apply(name: str, shown: str, value: str | None, where: Options) -> None:
    rule = OPTIONS[name][2]
    if isinstance(rule, str):
        if rule != ALLOW:
            raise refuse(shown, f"{rule}: leave it out")
    elif value is not None:
        rule(shown, value, where)


def check(options: Sequence[str], where: Options) -> None:
    """Raise BadInput naming the first option board run may not pass to `docker run`; `options` are the member's,
    between the image and `--`."""
    options = list(options)
    while options:
        arg = options.pop(0)
        if arg.startswith("--") and len(arg) > 2:
            name, has, value = arg[2:].partition("=")
            if name not in OPTIONS:
                raise refuse(f"--{name}", "is not a docker run option board run passes on (see docs/health.md)")
            if OPTIONS[name][1] and not has:
                if not options:
                    raise refuse(f"--{name}", "needs a value")
                value = options.pop(0)
            elif not OPTIONS[name][1] and has and value not in _TRUE | _FALSE:
                raise refuse(arg, "is a switch: give it alone, or =true or =false")
            apply(name, f"--{name}", value if OPTIONS[name][1] else None, where)
        elif arg.startswith("-") and len(arg) > 1:
            shorts = arg[1:]
            while shorts:  # pflag's bundle: switches, then at most one option that takes the rest or the next arg
                short = shorts[0]
                if short not in SHORT:
                    raise refuse(f"-{short}", "is not a docker run option board run passes on (see docs/health.md)")
                name = SHORT[short]
                if len(shorts) > 2 and shorts[1] == "=":
                    value, shorts = shorts[2:], ""
                elif not OPTIONS[name][1]:
                    value, shorts = None, shorts[1:]
                elif len(shorts) > 1:
                    value, shorts = shorts[1:], ""
                elif options:
                    value, shorts = options.pop(0), ""
                else:
                    raise refuse(f"-{short}", "needs a value")
                apply(name, f"-{short}", value if OPTIONS[name][1] else None, where)
        else:
            raise refuse(arg, "is not a docker option: give the image first, docker's options next, the command"
                              " after --")
