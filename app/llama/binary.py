"""Finding llama-server: config llama.server_bin, then BOARD_LLAMA_SERVER, then PATH."""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping

from app.config import LlamaSettings
from app.errors import BadInput

HOW_TO_GET = "build it with 'make llama-server' (CPU) or install llama.cpp, then set BOARD_LLAMA_SERVER or llama.server_bin"


def find_server_bin(settings: LlamaSettings, environ: Mapping[str, str] = os.environ) -> str:
    """The absolute path of an executable llama-server; BadInput with what to do when there is none."""
    for origin, value in (("config llama.server_bin", settings.server_bin),
                          ("BOARD_LLAMA_SERVER", environ.get("BOARD_LLAMA_SERVER"))):
        if value:
            path = os.path.abspath(os.path.expanduser(value))
            if os.path.isfile(path) and os.access(path, os.X_OK):
                return path
            raise BadInput(f"{origin} names {value}, which is not an executable file; {HOW_TO_GET}")
    found = shutil.which("llama-server", path=environ.get("PATH", os.defpath))
    if found:
        return os.path.abspath(found)
    raise BadInput(f"llama-server not found (not in config, BOARD_LLAMA_SERVER or PATH); {HOW_TO_GET}")
