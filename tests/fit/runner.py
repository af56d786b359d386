"""Measure what the real llama-server allocates for a model and settings: start it with `-lv 4 --log-jsonl`, read
its log until it listens (or exits), stop it, and parse llama.cpp's own figures with app.llama.memory.

A tiny model is measured in well under a second. A setting llama.cpp refuses (a quantised V cache without flash
attention, a K cache type whose block does not divide the head size) raises ServerRefused with llama.cpp's message.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from app.llama.memory import Measured, read_memory

LISTENING = "listening on http"
# Logged (at -lv 4) from the task loop. A SIGTERM before the loop starts is lost (the loop sets running = true
# after the handler cleared it), and the server then runs until a second signal makes it exit(1).
IDLE = "all slots are idle"


class ServerRefused(RuntimeError):
    """llama-server exited before it listened. `message` is llama.cpp's first error (or the last line it wrote)."""

    def __init__(self, message: str, lines: list[str]):
        super().__init__(message)
        self.message = message
        self.lines = lines


@dataclass(frozen=True)
class ServerRun:
    """One start of llama-server: its command, every line it wrote (stdout and stderr), and how it ended."""

    argv: list[str]
    lines: list[str]
    listened: bool
    returncode: int  # how it exited: by itself, or on our SIGTERM (0 when it shut down cleanly)
    seconds: float  # from the start until it listened or exited

    def error(self) -> str:
        """llama.cpp's first error: a --log-jsonl record of level "error", or a plain line that says error (the
        command-line parser writes plain text to stderr before logging starts)."""
        for line in self.lines:
            try:
                record = json.loads(line)
            except ValueError:
                if "error" in line.lower():
                    return line.strip()
                continue
            if isinstance(record, dict) and record.get("level") == "error" and isinstance(record.get("msg"), str):
                return record["msg"].strip()
        return self.lines[-1].strip() if self.lines else f"llama-server exited with {self.returncode} and wrote nothing"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def server_argv(server_binary: str | Path, model_path: str | Path, *, ctx: int, parallel: int, unified: bool = False,
                cache_type_k: str = "f16", cache_type_v: str = "f16", flash_attn: str = "off", ubatch: int | None = None,
                batch: int | None = None, port: int | None = None, extra: Sequence[str] = ()) -> list[str]:
    argv = [str(server_binary), "-m", str(model_path), "--host", "127.0.0.1", "--port", str(port or free_port()),
            "-c", str(ctx), "-np", str(parallel), "-kvu" if unified else "-no-kvu", "-ctk", cache_type_k, "-ctv", cache_type_v,
            "-fa", flash_attn, "-t", "2", "--no-warmup", "-lv", "4", "--log-jsonl"]
    if ubatch is not None:
        argv += ["-ub", str(ubatch)]
    if batch is not None:
        argv += ["-b", str(batch)]
    return argv + list(extra)


def run_server(argv: Sequence[str], timeout: float = 60) -> ServerRun:
    """Start llama-server with `argv`, wait until it listens or exits (at most `timeout` s), then stop it: SIGTERM
    once its task loop runs, so that it logs its exit memory breakdown; SIGKILL if it has not gone within 5 s."""
    # LLAMA_ARG_* variables would change the settings behind the command line's back.
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_ARG_")}
    lines: list[str] = []
    listening, idle, ended = threading.Event(), threading.Event(), threading.Event()
    start = time.monotonic()
    process = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               env=env, text=True, errors="replace", start_new_session=True)

    def read() -> None:
        for line in process.stdout:
            lines.append(line.rstrip("\n"))
            if LISTENING in line:
                listening.set()
            if IDLE in line:
                idle.set()
        for event in (ended, listening, idle):
            event.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        listening.wait(timeout)
        seconds = time.monotonic() - start
        listened = any(LISTENING in line for line in lines)
        if listened:
            idle.wait(5)
        exited = ended.is_set()
        if not exited:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                process.kill()
    finally:
        if process.poll() is None:
            process.kill()
        returncode = process.wait()
        reader.join(5)
        process.stdout.close()
    if not listened and not exited:
        raise TimeoutError(f"llama-server did not listen within {timeout:g} s: {' '.join(argv)}\n" + "\n".join(lines[-20:]))
    return ServerRun(list(argv), list(lines), listened, returncode, seconds)


def measure(server_binary: str | Path, model_path: str | Path, *, ctx: int, parallel: int, unified: bool = False,
            cache_type_k: str = "f16", cache_type_v: str = "f16", flash_attn: str = "off", ubatch: int | None = None,
            batch: int | None = None, timeout: float = 60, extra: Sequence[str] = ()) -> Measured:
    """llama.cpp's figures (from its -lv 4 lines) for `model_path` served with these settings."""
    run = run_server(server_argv(server_binary, model_path, ctx=ctx, parallel=parallel, unified=unified,
                                 cache_type_k=cache_type_k, cache_type_v=cache_type_v, flash_attn=flash_attn,
                                 ubatch=ubatch, batch=batch, extra=extra), timeout)
    if not run.listened:
        raise ServerRefused(run.error(), run.lines)
    measured = read_memory(run.lines)
    if measured is None or measured.source != "lines":
        raise AssertionError("llama-server listened but logged no buffer sizes (is -lv 4 honoured?):\n"
                             + "\n".join(run.lines[-20:]))
    return measured
