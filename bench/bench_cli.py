"""Quick-CLI latency through the shared service's socket: `board status --json`, `board status --short` and `board book`
as a member (alice) against a running `board agent`, against `python3 -c "import sqlite3"` with
the same interpreter, run side by side (interleaved, so machine noise hits every case alike).
Medians; the ratio is against that baseline. Target (issue 8, section 6): 2x or less.

    sudo .venv/bin/python bench/bench_cli.py [--runs 30] [--group boardusers] [--breakdown]
    .venv/bin/python bench/bench_cli.py --file [--runs 30] [--breakdown]     # the old file mode (BOARD_DB), no root
    .venv/bin/python bench/bench_cli.py --file --against /tmp/old   # and another checkout's, in the same rounds
    .venv/bin/python bench/bench_cli.py --structs [--runs 30]     # the config's sections: Structs or dataclasses
    sudo .venv/bin/python bench/bench_cli.py --against /tmp/old     # the same through two agents, one each

Socket mode needs root: it starts a throwaway agent as the user board, exactly as the unit does
(bench/shared_install.py), and runs every case as alice through setpriv (the baseline too, so
both pay the same exec). Each `board book 1 --for 10m --start +Nh --json` takes a slot of its own
and is cancelled afterwards, off the clock. The agent and its directory are gone at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from shared_install import BIN, MEMBERS_GROUP, REPO, as_user, shared_install  # noqa: E402

STDLIB_FLOOR = "import argparse, dataclasses, datetime, grp, hashlib, json, pathlib, pwd, sqlite3, typing, unicodedata"


def timed(argv: list[str], env: dict, cwd: str | None = None) -> tuple[float, float, str]:
    """(wall seconds, CPU seconds of the child: user + system, its stdout)."""
    with tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        child = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=err, cwd=cwd)
        out = child.stdout.read()
        _, status, usage = os.wait4(child.pid, 0)
        elapsed = time.perf_counter() - start
        child.stdout.close()
        child.returncode = os.waitstatus_to_exitcode(status)
        if child.returncode != 0:
            err.seek(0)
            raise SystemExit(f"{' '.join(argv)} failed ({child.returncode}): {err.read().decode().strip()}")
    return elapsed, usage.ru_utime + usage.ru_stime, out.decode()


def report(wall: dict[str, list[float]], cpu: dict[str, list[float]], target: float) -> None:
    base, base_cpu = statistics.median(next(iter(wall.values()))), statistics.median(next(iter(cpu.values())))
    print(f"{'case':44} {'median ms':>9} {'p90 ms':>7} {'min ms':>7} {'ratio':>6}   {'CPU ms':>6} {'ratio':>6}")
    for name, values in wall.items():
        median = statistics.median(values)
        p90 = statistics.quantiles(values, n=10)[-1] if len(values) > 1 else values[0]
        cpu_median = statistics.median(cpu[name])
        flag = "" if not name.startswith("board") else ("  ok" if median / base <= target else "  OVER")
        print(f"{name:44} {median * 1000:9.1f} {p90 * 1000:7.1f} {min(values) * 1000:7.1f} {median / base:5.2f}x"
              f"   {cpu_median * 1000:6.1f} {cpu_median / base_cpu:5.2f}x{flag}")
    print(f"target: board commands at {target:g}x the baseline or less (median wall time); CPU is user + system of"
          " the child, steadier when the machine is shared")


def run_cases(cases: dict, runs: int, env: dict, cwd: str | None = None, user: str | None = None,
              after=None, envs: dict | None = None) -> tuple[dict, dict]:
    """Each case `runs` times, interleaved; `envs` gives a case an environment of its own (another install's)."""
    wall: dict[str, list[float]] = {name: [] for name in cases}
    cpu: dict[str, list[float]] = {name: [] for name in cases}
    for n in range(runs):
        for name, argv in cases.items():  # interleaved, so machine noise hits every case alike
            case_env = (envs or {}).get(name, env)
            elapsed, used, out = timed(as_user(user, argv(n)) if user else argv(n), case_env, cwd)
            wall[name].append(elapsed)
            cpu[name].append(used)
            if after is not None:
                after(name, out)
    return wall, cpu


# What the socket client's path costs in imports alone, step by step (--breakdown): the packages any socket client
# would use (json, socket, threading: 1.4x the baseline alone), the C modules the quick path uses instead, then what
# app.quick adds on top of them.
BREAKDOWN = {
    "imports: json, socket, threading": "import json, socket, threading",
    "imports: _json, _socket, _thread (app.wire, app.client.socket)": "import _json, _socket, _thread",
    "  + datetime, functools (app.output, app.cli.context)": "import json, socket, threading, datetime, functools",
    "  = app.quick's modules, no request": "import app.quick, app.cli.context, app.cli.bookings, app.cli.status,"
                                           " app.client.socket, app.output, app.config_file",
    "  (tomllib, which the plain config's line scan avoids)": "import json, socket, threading, datetime, tomllib",
}


# File mode's imports, step by step (--file --breakdown): the standard library it cannot do without, then each
# heavy module it still loads, then board's own modules on the quick path (the request itself costs ~5-10 ms).
FILE_BREAKDOWN = {
    "imports: sqlite3, json, datetime, threading": "import sqlite3, json, datetime, threading, functools, pwd, grp",
    "  + dataclasses (inspect, ast, dis)": "import sqlite3, json, datetime, threading, functools, pwd, grp, dataclasses",
    "  + pathlib (urllib.parse, ipaddress)": "import sqlite3, json, datetime, threading, functools, pwd, grp, pathlib",
    "  + typing": "import sqlite3, json, datetime, threading, functools, pwd, grp, typing",
    "  = all three": "import sqlite3, json, datetime, threading, functools, pwd, grp, dataclasses, pathlib, typing",
    "  = app.config (17 dataclasses)": "import app.config",
    "  = app.gpu.simulated, app.model": "import app.gpu.simulated, app.model",
    "  = the file mode's modules, no request": "import app.quick, app.cli.context, app.cli.status, app.cli.bookings,"
                                               " app.client.local, app.gpu.simulated, app.service.ops.reads,"
                                               " app.service.ops.bookings, hashlib",
}


def config_shapes() -> list[tuple[str, list[str]]]:
    """app.config's sections (msgspec Structs) as (name, field names), in the order the module defines them."""
    import msgspec

    import app.config

    return [(name, [f.name for f in msgspec.structs.fields(kind)]) for name, kind in vars(app.config).items()
            if isinstance(kind, type) and issubclass(kind, msgspec.Struct) and kind.__module__ == "app.config"]


def struct_modules(folder: Path) -> tuple[Path, Path]:
    """Two modules defining the config's sections, one as msgspec Structs (as app.config does) and one as frozen,
    slotted dataclasses (as app.model does): the same names and fields, every field `object = None`, so the two differ
    only in the kind of class (issue 37, item 4)."""
    shapes = config_shapes()
    heads = {"structs": "import msgspec\n\n", "dataclasses": "from dataclasses import dataclass\n\n"}
    paths = []
    for kind, head in heads.items():
        lines = ["from __future__ import annotations\n", head]
        for name, fields in shapes:
            if kind == "structs":
                lines.append(f"class {name}(msgspec.Struct, frozen=True, forbid_unknown_fields=True):\n")
            else:
                lines.append(f"@dataclass(frozen=True, slots=True)\nclass {name}:\n")
            lines += [f"    {field}: object = None\n" for field in fields] or ["    pass\n"]
        paths.append(folder / f"shapes_{kind}.py")
        paths[-1].write_text("".join(lines))
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(folder)], check=True, stdout=subprocess.DEVNULL)
    return paths[0], paths[1]


# What file mode loads anyway, before its config: the dataclasses of app.model and app.core.identity, typing, pathlib.
FILE_MODE_ANYWAY = "import sqlite3, json, datetime, threading, dataclasses, typing, pathlib"


def structs_mode(runs: int) -> None:
    """Item 4: the config's sections as msgspec Structs against the same as dataclasses, alone and on top of what
    file mode loads anyway; the marginal cost is what choosing one over the other changes on the quick path."""
    compile_bytecode()
    with tempfile.TemporaryDirectory() as tmp:
        structs, dataclasses = struct_modules(Path(tmp))
        shapes = config_shapes()
        fields = sum(len(f) for _, f in shapes)
        python = [sys.executable, "-c"]
        cases = {
            "baseline: python3 -c 'import sqlite3'": lambda n: [*python, "import sqlite3"],
            f"{len(shapes)} sections as Structs (import msgspec)": lambda n: [*python, "import sqlite3, shapes_structs"],
            f"{len(shapes)} sections as dataclasses": lambda n: [*python, "import sqlite3, shapes_dataclasses"],
            "file mode's stdlib, no config": lambda n: [*python, FILE_MODE_ANYWAY],
            "  + the sections as Structs": lambda n: [*python, FILE_MODE_ANYWAY + ", shapes_structs"],
            "  + the sections as dataclasses": lambda n: [*python, FILE_MODE_ANYWAY + ", shapes_dataclasses"],
            "  + app.config itself (Structs, its loader)": lambda n: [*python, FILE_MODE_ANYWAY + ", app.config"],
        }
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([tmp, str(REPO)])}
        wall, cpu = run_cases(cases, runs, env, str(REPO))
    print(f"{runs} runs each, interleaved: app.config's {len(shapes)} sections ({fields} fields) as msgspec Structs"
          " and as dataclasses")
    report(wall, cpu, 3.0)


def compile_bytecode() -> None:
    # As an installed package has: bytecode, so that no case pays for compiling.
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "app")], check=True, stdout=subprocess.DEVNULL)


def socket_mode(runs: int, group: str, user: str, breakdown: bool, against: Path | None = None) -> None:
    compile_bytecode()
    checkouts = {"": BIN / "board"}
    if against is not None:  # the other checkout's board and agent (its own venv), an install of its own
        subprocess.run([str(against / ".venv" / "bin" / "python"), "-m", "compileall", "-q", str(against / "app")],
                       check=True, stdout=subprocess.DEVNULL)
        checkouts["against: "] = against / ".venv" / "bin" / "board"
    with contextlib.ExitStack() as stack:
        cases = {"baseline: python3 -c 'import sqlite3'": lambda n: [sys.executable, "-c", "import sqlite3"]}
        envs, admins = {}, {}
        for label, board_path in checkouts.items():
            install = stack.enter_context(shared_install(group=group, board=board_path))
            install.run(user, "status", check=True)  # the first request opens (and migrates) the database: not timed
            board = str(board_path)
            cases[f"{label}board status --json"] = lambda n, board=board: [board, "status", "--json"]
            cases[f"{label}board status --short"] = lambda n, board=board: [board, "status", "--short"]
            cases[f"{label}board book 1 --for 10m --start +Nh"] = lambda n, board=board: [
                board, "book", "1", "--for", "10m", "--start", f"+{n + 1}h", "--json"]
            envs.update({f"{label}board status --json": install.environ(user),
                         f"{label}board status --short": install.environ(user),
                         f"{label}board book 1 --for 10m --start +Nh": install.environ(user)})
            admins[f"{label}board book 1 --for 10m --start +Nh"] = stack.enter_context(
                contextlib.closing(install.client()))  # root: cancels each booking after it is timed
        env = next(iter(envs.values()))
        if breakdown:
            cases.update({name: (lambda code: lambda n: [sys.executable, "-c", code])(code)
                          for name, code in BREAKDOWN.items()})

        def cancel(name: str, out: str) -> None:
            if name in admins:
                admins[name].call("cancel", id=json.loads(out)["id"])

        wall, cpu = run_cases(cases, runs, env, tempfile.gettempdir(), user, cancel, envs)
    print(f"{runs} runs each, interleaved, as {user} (setpriv) against a board agent on its socket:")
    report(wall, cpu, 2.0)


def file_mode(runs: int, against: Path | None = None, breakdown: bool = False) -> None:
    compile_bytecode()
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "BOARD_DB": f"{tmp}/board.db", "BOARD_SIMULATE": "1"}
        board = str(BIN / "board")
        subprocess.run([board, "status"], env=env, check=True, stdout=subprocess.DEVNULL)  # create + migrate once
        cases = {
            "baseline: python3 -c 'import sqlite3'": lambda n: [sys.executable, "-c", "import sqlite3"],
            "stdlib floor: the same imports, no board": lambda n: [sys.executable, "-c", STDLIB_FLOOR],
            "board status --json (file)": lambda n: [board, "status", "--json"],
            "board status --short (file)": lambda n: [board, "status", "--short"],
            "board book 1 --for 10m (file)": lambda n: [board, "book", "1", "--start", f"+{n + 1}h", "--for", "10m"],
        }
        if against is not None:  # the other checkout's board (its own venv) on the same file, other slots
            theirs = str(against / ".venv" / "bin" / "board")
            cases.update({
                "against: board status --json (file)": lambda n: [theirs, "status", "--json"],
                "against: board book --cards 1 --for 10m (file)": lambda n: [theirs, "book", "--cards", "1", "--start",
                                                                             f"+{n + 1}h", "--for", "10m"],
            })
            del cases["board book 1 --for 10m (file)"]  # each checkout books a card of its own, at the same times
            cases["board book --cards 0 --for 10m (file)"] = lambda n: [board, "book", "--cards", "0", "--start",
                                                                        f"+{n + 1}h", "--for", "10m"]
        if breakdown:
            cases.update({name: (lambda code: lambda n: [sys.executable, "-c", code])(code)
                          for name, code in FILE_BREAKDOWN.items()})
        wall, cpu = run_cases(cases, runs, env, str(REPO))
    print(f"{runs} runs each, interleaved, file mode (BOARD_DB, in process):")
    report(wall, cpu, 3.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--group", default=MEMBERS_GROUP, help=f"the members' group (default {MEMBERS_GROUP})")
    parser.add_argument("--user", default="alice", help="the member who runs the commands (default alice)")
    parser.add_argument("--file", action="store_true", help="file mode instead (BOARD_DB; no agent, no root)")
    parser.add_argument("--against", type=Path, help="another checkout's board beside this one's (its own venv; in"
                        " socket mode its own install and agent)")
    parser.add_argument("--structs", action="store_true", help="the config's sections as msgspec Structs against the"
                        " same as dataclasses (issue 37, item 4); no agent, no root")
    parser.add_argument("--breakdown", action="store_true",
                        help="also time the quick path's imports step by step (where the time goes; both modes)")
    args = parser.parse_args()
    if args.structs:
        return structs_mode(args.runs)
    if not args.file and os.geteuid() != 0:
        print("not root, so no agent of our own: file mode (sudo for the socket, the shared install's path)")
        args.file = True
    if args.file:
        file_mode(args.runs, args.against, args.breakdown)
    else:
        socket_mode(args.runs, args.group, args.user, args.breakdown, args.against)


if __name__ == "__main__":
    main()
