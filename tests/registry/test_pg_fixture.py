"""Issue #20: `make test` as root on a fresh machine: the PostgreSQL fixture creates the
unprivileged user the server must run as (36 tests failed at set-up without `.ci/run`)."""

from __future__ import annotations

import os
import pwd
import subprocess
import uuid

import pytest
from tests.pg_server import PostgresServer, ensure_pg_user


@pytest.mark.postgres
@pytest.mark.skipif(os.geteuid() != 0, reason="only root creates users (and only root needs one)")
def test_fixture_creates_the_server_user_when_root():
    user = f"tfl-pg-{uuid.uuid4().hex[:8]}"  # a user this machine cannot have yet
    with pytest.raises(KeyError):
        pwd.getpwnam(user)
    server = None
    try:
        server = PostgresServer(user).start()  # what the session fixture does, for a missing user
        created = pwd.getpwnam(user)
        assert created.pw_uid != 0 and created.pw_shell.endswith("nologin")
        assert ensure_pg_user(user).pw_uid == created.pw_uid  # a second worker finds it
        import psycopg

        with psycopg.connect(f"host=127.0.0.1 port={server.port} user=postgres dbname=postgres") as conn:
            owner = conn.execute("SELECT usename FROM pg_stat_activity WHERE pid = pg_backend_pid()").fetchone()
            assert owner == ("postgres",)
        pid = int((server.data / "postmaster.pid").read_text().split()[0])
        assert os.stat(f"/proc/{pid}").st_uid == created.pw_uid  # the server runs as that user, not root
    finally:
        if server is not None:
            server.stop()
        subprocess.run(["userdel", user], capture_output=True)
