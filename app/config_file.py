"""Finding and reading the config file (TOML), and nothing more: light enough for the quick path.

app.config builds the typed settings from what this reads.
"""

from __future__ import annotations

import os

DEFAULT_CONFIG_PATH = "/etc/board/board.toml"


class ConfigError(ValueError):
    """A config file that cannot be used; the message is one line naming the file."""


def shared_socket(environ) -> str | None:
    """The shared service's socket when the config names one and no personal database was asked for; None when the
    config cannot be read (the full CLI reports it)."""
    if environ.get("BOARD_DB"):
        return None
    try:
        return configured_socket(environ)
    except ConfigError:
        return None


def configured_socket(environ=os.environ) -> str | None:
    """`[service] socket` from the config, or None; raises ConfigError like read_config."""
    return configured_string(environ, "service", "socket") or None


def configured_host(environ=os.environ) -> str:
    """This host's name in the fleet, read as configured_socket reads: `board book` names another host's cards by it,
    and through the socket app.config (msgspec, tomllib) would cost more than the request."""
    return host_name(configured_string(environ, "fleet", "host"))


def host_name(configured: str) -> str:
    """This host's name in the fleet: [fleet] host, else the short hostname."""
    return configured or os.uname().nodename.split(".")[0] or "localhost"


def configured_string(environ, table: str, key: str) -> str:
    """A string setting of the config, "" when it has none; raises ConfigError like read_config.

    The quick path asks for the socket before every command, and tomllib (with re, typing and string)
    costs more than the whole request, so a plain config is read line by line first. Anything
    that scan is not sure of (multi-line strings, escapes, inline or dotted tables, a table
    named twice) goes to tomllib; a test checks that both agree on every config they both read.
    """
    path = environ.get("BOARD_CONFIG") or DEFAULT_CONFIG_PATH
    try:
        with open(path, "rb") as file:
            text = file.read().decode()
    except (OSError, UnicodeDecodeError):
        text = None
    if text is not None and (found := scan_string(text, table, key)) is not None:
        return found
    _, raw = read_config(environ)
    section = raw.get(table)
    value = section.get(key) if isinstance(section, dict) else None
    return value if isinstance(value, str) else ""


def scan_string(text: str, wanted: str, name: str) -> str | None:
    """`name` in table `wanted` of a plain config: its value, "" when there is none, or None when unsure."""
    if '"""' in text or "'''" in text:
        return None
    table, found, tables = "", "", set()
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            if line.startswith("[[") or not line.endswith("]") or line[1:-1].strip() in tables:
                return None
            table = line[1:-1].strip()
            tables.add(table)
            continue
        key, equals, value = line.partition("=")
        key, value = key.strip(), value.strip()
        if not equals or key.startswith(wanted) and table == "" or "." in key or key.startswith(("\"", "'")):
            return None  # dotted keys and a top-level table = {...}: tomllib's job
        if table == wanted and key == name:
            if len(value) < 2 or value[0] != '"' or value.count('"') != 2 or "\\" in value:
                return None
            closing = value.index('"', 1)
            if value[closing + 1:].strip() and not value[closing + 1:].strip().startswith("#"):
                return None
            found = value[1:closing]
    return found


def read_config(environ=os.environ) -> tuple[str, dict]:
    """(path, its tables): BOARD_CONFIG, else the default; {} when the default does not exist."""
    path = environ.get("BOARD_CONFIG") or DEFAULT_CONFIG_PATH
    try:
        with open(path, "rb") as file:
            data = file.read()
    except FileNotFoundError:
        if "BOARD_CONFIG" in environ:
            raise ConfigError(f"config file {path} does not exist; fix BOARD_CONFIG or create the file") from None
        return path, {}
    except OSError as error:
        raise ConfigError(f"can't read config {path}: {error.strerror or error}") from None
    import tomllib  # only when there is a file to read

    try:
        return path, tomllib.loads(data.decode())
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
        raise ConfigError(f"can't read config {path}: {error}") from None
