"""A throw-away PostgreSQL server for the tests: real initdb/pg_ctl, loopback only.

The server refuses to run as root, so as root it runs as the unprivileged system user
``torchfl-pg`` (created here on first use if missing) through ``runuser``, in a temporary
directory owned by that user. Each pytest(-xdist) worker starts its own server once per session
(initdb with --no-sync and fsync off take ~1-2 s) and each test gets its own database.
Missing binaries are an error, never a skip: CI installs them.
"""

from __future__ import annotations

import atexit
import glob
import os
import re
import shlex
import shutil
import socket
import subprocess
import tempfile
import uuid
from pathlib import Path

PG_USER = "torchfl-pg"
INSTALL_HINT = ("install the server with `apt-get install postgresql-15` (or run `.ci/run`, which does), "
                "or set TORCHFL_PG_BINDIR to the directory holding initdb and pg_ctl")


class PostgresUnavailable(RuntimeError):
    """The tests cannot start PostgreSQL; the message says why and what to do."""


def find_bindir() -> Path:
    """The newest /usr/lib/postgresql/<N>/bin holding initdb, or $TORCHFL_PG_BINDIR."""
    env = os.environ.get("TORCHFL_PG_BINDIR")
    if env:
        if not (Path(env) / "initdb").exists():
            raise PostgresUnavailable(f"TORCHFL_PG_BINDIR={env} has no initdb; {INSTALL_HINT}")
        return Path(env)
    found = glob.glob("/usr/lib/postgresql/*/bin/initdb")
    if not found:
        on_path = shutil.which("initdb")
        if on_path:
            return Path(on_path).parent
        raise PostgresUnavailable(f"PostgreSQL server binaries not found (/usr/lib/postgresql/*/bin/initdb); "
                                  f"{INSTALL_HINT}")

    def version(p: str) -> tuple:
        m = re.search(r"/postgresql/([\d.]+)/", p)
        return tuple(int(x) for x in m.group(1).split(".")) if m else (0,)

    return Path(max(found, key=version)).parent


def ensure_pg_user(user: str = PG_USER):
    """The unprivileged system user the server runs as when the tests run as root; created
    here if missing (PostgreSQL refuses root), so `make test` needs no set-up on a fresh
    machine. Workers starting at once serialise on a lock file; the second finds the user."""
    import fcntl
    import pwd

    try:
        return pwd.getpwnam(user)
    except KeyError:
        pass
    with open(os.path.join(tempfile.gettempdir(), "torchfl-pg-useradd.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            return pwd.getpwnam(user)
        except KeyError:
            pass
        useradd = shutil.which("useradd") or "/usr/sbin/useradd"
        nologin = shutil.which("nologin") or "/usr/sbin/nologin"
        proc = subprocess.run([useradd, "--system", "--no-create-home", "--shell", nologin, user],
                              capture_output=True, text=True, timeout=60)
        try:
            return pwd.getpwnam(user)
        except KeyError:
            raise PostgresUnavailable(
                f"running as root, and PostgreSQL refuses root; creating the unprivileged user {user} failed "
                f"(useradd exit {proc.returncode}: {proc.stderr.strip()}); create it with `useradd --system "
                f"--no-create-home --shell /usr/sbin/nologin {user}`") from None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PostgresServer:
    def __init__(self, user: str = PG_USER) -> None:
        self.bindir = find_bindir()
        self.as_root = os.geteuid() == 0
        self.user = user
        if self.as_root:
            pw = ensure_pg_user(user)
            self._uid, self._gid = pw.pw_uid, pw.pw_gid
        self.dir = Path(tempfile.mkdtemp(prefix="torchfl-pg-", dir="/tmp"))
        self.data = self.dir / "data"
        self.log = self.dir / "server.log"
        self.port = 0
        self._started = False

    # -- process helpers

    def _run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        if not self.as_root:
            cmd = list(args)
        elif shutil.which("runuser"):
            cmd = ["runuser", "-u", self.user, "--", *args]
        else:  # no util-linux runuser: su with a shell, since the user's login shell is nologin
            cmd = ["su", "-s", "/bin/sh", self.user, "-c", shlex.join(args)]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=self.dir)

    def _check(self, proc: subprocess.CompletedProcess, what: str) -> None:
        if proc.returncode != 0:
            log = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
            raise PostgresUnavailable(f"{what} failed (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}\n{log}")

    def start(self) -> "PostgresServer":
        if self.as_root:
            os.chown(self.dir, self._uid, self._gid)
        os.chmod(self.dir, 0o700)
        self._check(self._run(str(self.bindir / "initdb"), "-D", str(self.data), "-U", "postgres", "-A", "trust",
                              "-E", "UTF8", "--locale=C", "--no-sync"), "initdb")
        options = (f"-p {{port}} -k {self.dir} -c listen_addresses=127.0.0.1 -F -c synchronous_commit=off "
                   "-c full_page_writes=off -c max_connections=200 -c shared_buffers=32MB")
        for attempt in range(3):
            self.port = _free_port()
            proc = self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-w",
                             "-t", "60", "-o", options.format(port=self.port), "start", timeout=90)
            if proc.returncode == 0:
                self._started = True
                atexit.register(self.stop)
                return self
        self._check(proc, "pg_ctl start")
        return self

    def stop(self) -> None:
        if self._started:
            self._started = False
            self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- databases

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def _admin(self, sql: str) -> None:
        import psycopg

        with psycopg.connect(f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres",
                             autocommit=True, connect_timeout=10) as conn:
            conn.execute(sql)

    def create_database(self, name: str | None = None) -> str:
        name = name or f"t_{uuid.uuid4().hex[:16]}"
        self._admin(f'CREATE DATABASE "{name}"')
        return name

    def drop_database(self, name: str) -> None:
        self._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def start_server() -> PostgresServer:
    server = PostgresServer()
    try:
        return server.start()
    except BaseException:
        server.stop()
        raise
