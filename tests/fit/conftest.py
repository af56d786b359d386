"""Fixtures for the memory-estimate tests: the real llama-server and the model shapes, written once per session."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.fit.shapes import write_model

REPO = Path(__file__).resolve().parents[2]


def _named_server() -> str | None:
    """BOARD_LLAMA_SERVER (make test sets it) or llama-server on PATH; read at import, as tests/llama does, before
    the autouse fixture clears BOARD_* variables."""
    return os.environ.get("BOARD_LLAMA_SERVER") or shutil.which("llama-server")


NAMED_SERVER = _named_server()


@pytest.fixture(scope="session")
def llama_server() -> str:
    """The binary. Named but missing is a failure; unnamed, scripts/build_llama_server.sh gives the cached build
    (and builds it first, about 7 minutes, where there is none)."""
    if NAMED_SERVER:
        if not (os.path.isfile(NAMED_SERVER) and os.access(NAMED_SERVER, os.X_OK)):
            pytest.fail(f"llama-server {NAMED_SERVER!r} is not an executable file")
        return NAMED_SERVER
    result = subprocess.run([str(REPO / "scripts" / "build_llama_server.sh")], capture_output=True, text=True)
    if result.returncode != 0 or not result.stdout.strip():
        pytest.fail("scripts/build_llama_server.sh failed:\n" + result.stderr[-2000:])
    return result.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="session")
def model_path(tmp_path_factory) -> Callable[[str], Path]:
    """model_path("tiny") -> the shape's GGUF, written on first use and kept for the session."""
    directory = tmp_path_factory.mktemp("shapes")
    written: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in written:
            written[name] = write_model(directory / f"{name}.gguf", name)
        return written[name]

    return get
