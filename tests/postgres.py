"""A throwaway PostgreSQL cluster for the tests: socket-only, one per pytest(-xdist) worker, a fresh database per test.

`initdb` runs as the system user postgres (PostgreSQL refuses root) into a directory under /tmp; the server listens
on a Unix socket in a directory every user may reach (the agent runs as user board) and on no TCP port, with
fsync off (a test's data need not survive a crash). The board's schema is made once in a template database, and
each test gets `CREATE DATABASE ... TEMPLATE`, so tests are isolated and start in milliseconds.
Debian's `postgresql` package provides the binaries (`make test` installs it: scripts/install_postgresql.sh).
"""

from __future__ import annotations

import glob
import itertools
import os
import pwd
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

SUPERUSER = "postgres"  # the system user and the role
TEMPLATE = "board_template"


def bin_dir() -> Path | None:
    """The newest installed PostgreSQL's binaries (Debian puts them in /usr/lib/postgresql/<major>/bin)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parent.parent.name))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def missing_reason() -> str | None:
    """Why no cluster can be started here, or None."""
    if bin_dir() is None:
        return "PostgreSQL is not installed (scripts/install_postgresql.sh, which make test runs)"
    if os.geteuid() != 0:
        return "the throwaway PostgreSQL cluster needs root (initdb runs as user postgres)"
    try:
        pwd.getpwnam(SUPERUSER)
    except KeyError:
        return f"no system user {SUPERUSER} (Debian's postgresql package makes it)"
    return None


class Cluster:
    """One running server: `url(db)` is a libpq URI for database `db` over the socket."""

    def __init__(self, max_connections: int = 200) -> None:
        self.max_connections = max_connections  # a test fills a small one to see the server turn connections away
        self.root = Path(tempfile.mkdtemp(prefix="board-pg-", dir="/tmp"))
        os.chmod(self.root, 0o755)
        self.data = self.root / "data"
        self.sockets = self.root / "run"  # 0755: user board connects to the socket inside
        self._names = itertools.count(1)
        entry = pwd.getpwnam(SUPERUSER)
        self.log = self.root / "log" / "server.log"
        for path in (self.data, self.sockets, self.log.parent):
            path.mkdir()
            os.chown(path, entry.pw_uid, entry.pw_gid)
        os.chmod(self.data, 0o700)
        os.chmod(self.sockets, 0o755)
        binaries = bin_dir()
        assert binaries is not None, missing_reason()
        self._as_postgres(str(binaries / "initdb"), "-D", str(self.data), "-U", SUPERUSER, "--auth=trust",
                          "-E", "UTF8", "--locale=C.UTF-8", "--no-sync")
        self._made_template = False
        self.resume()

    def resume(self) -> None:
        """Start the server (again, after pause)."""
        options = f"-k {self.sockets} -c listen_addresses='' -c fsync=off -c full_page_writes=off" \
            f" -c max_connections={self.max_connections}"
        self._as_postgres(str(bin_dir() / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-o", options,
                          "-w", "-t", "60", "start")

    def pause(self) -> None:
        """Stop the server, keeping its data (the database 'went away'); resume() starts it again."""
        self._as_postgres(str(bin_dir() / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop")

    def stopping(self) -> None:
        """Begin a smart shutdown and return at once: while a client stays connected the server keeps refusing new
        connections ('the database system is shutting down'), as every stop and start does for a moment."""
        self._as_postgres(str(bin_dir() / "pg_ctl"), "-D", str(self.data), "-m", "smart", "-W", "stop")

    def _as_postgres(self, *cmd: str) -> None:
        result = subprocess.run(["setpriv", "--reuid", SUPERUSER, "--regid", SUPERUSER, "--clear-groups", *cmd],
                                capture_output=True, text=True, cwd=self.root, timeout=120)
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd[:2])} failed ({result.returncode}): {result.stderr[-2000:]}"
                               f"{self.log.read_text()[-2000:] if self.log.exists() else ''}")

    def url(self, database: str = "postgres") -> str:
        return f"postgresql:///{database}?host={self.sockets}&user={SUPERUSER}"

    def admin(self, sql: str, database: str = "postgres") -> None:
        import psycopg

        with psycopg.connect(self.url(database), autocommit=True) as conn:
            conn.execute(sql)

    def fleet_roles(self, hosts: tuple[str, ...] = ("gpu1", "gpu2"), *, schema: bool = True) -> FleetRoles:
        """A database set up as docs/fleet.md's roles section says: an owner role (the admin's), a group with the
        tables' grants, a LOGIN role per host in it, and (`schema`) the schema made by the owner with each role bound
        to its host in fleet_roles. Roles are the cluster's, so each call's names are new: board<n>, board<n>_gpu1."""
        from app.config import PostgresStore
        from app.migrate import make_schema

        n = next(self._names)
        owner, group, database = f"board{n}", f"board{n}_hosts", f"fleet{n}"
        roles = {host: f"board{n}_{host}" for host in hosts}
        made = FleetRoles(self, database, owner, group, roles)
        self.admin(f"CREATE ROLE {owner} LOGIN")
        self.admin(f"CREATE ROLE {group} NOLOGIN")
        for role in roles.values():
            self.admin(f"CREATE ROLE {role} LOGIN IN ROLE {group}")
        self.admin(f"CREATE DATABASE {database} OWNER {owner}")
        self.admin(f"ALTER DEFAULT PRIVILEGES FOR ROLE {owner} GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO {group}",
                   database)
        if schema:
            make_schema(PostgresStore(made.url(owner), host="admin"))  # board migrate --schema-only, as the owner
            for host, role in roles.items():
                made.as_owner(f"INSERT INTO fleet_roles (role, host) VALUES ('{role}', '{host}')")
        return made

    def fresh_database(self) -> str:
        """A new database holding the board's schema, copied from the template; returns its url."""
        if not self._made_template:
            from app.config import PostgresStore
            from app.store.db import connect

            self.admin(f"CREATE DATABASE {TEMPLATE}")
            connect(PostgresStore(self.url(TEMPLATE), host="test")).close()  # the schema, as a service makes it
            self._made_template = True
        name = f"board_{os.getpid()}_{next(self._names)}"
        self.admin(f"CREATE DATABASE {name} TEMPLATE {TEMPLATE}")
        return self.url(name)

    def empty_database(self) -> str:
        """A new database without the schema (a service's first start makes it)."""
        name = f"empty_{os.getpid()}_{next(self._names)}"
        self.admin(f"CREATE DATABASE {name}")
        return self.url(name)

    def drop(self, url: str) -> None:
        """Drop the database `url` names, closing whatever still holds it."""
        from psycopg.conninfo import conninfo_to_dict

        self.admin(f"DROP DATABASE {conninfo_to_dict(url)['dbname']} WITH (FORCE)")

    def stop(self) -> None:
        binaries = bin_dir()
        try:
            if (self.data / "postmaster.pid").exists():  # not when a test left it paused
                self._as_postgres(str(binaries / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w",
                                  "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


@dataclass
class FleetRoles:
    """Cluster.fleet_roles's database: `url(role)` connects as a role; `drop()` removes the database and the roles."""

    cluster: Cluster
    database: str
    owner: str
    group: str
    roles: dict[str, str]  # host -> its LOGIN role

    def url(self, role: str) -> str:
        return f"postgresql:///{self.database}?host={self.cluster.sockets}&user={role}"

    def as_owner(self, sql: str) -> None:
        import psycopg

        with psycopg.connect(self.url(self.owner), autocommit=True) as conn:
            conn.execute(sql)

    def drop(self) -> None:
        self.cluster.admin(f"DROP DATABASE {self.database} WITH (FORCE)")
        for role in (*self.roles.values(), self.group, self.owner):
            self.cluster.admin(f"DROP ROLE {role}")
