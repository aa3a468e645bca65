"""Issue 52 case 11: ``--cluster HOST:PORT`` of a listener that is not Ray hung for 300 s and more,
printing Ray's retry lines (the TCP connect succeeded, then ``ray.init`` retried). Now the address
is asked to answer as a Ray head's GCS does (a gRPC server: its HTTP/2 SETTINGS) within seconds,
and refused in one line otherwise. A real head passes (tests/cluster start one)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from torchfl.cluster.ray_runner import GCS_TIMEOUT_S, gcs_silence

ROOT = Path(__file__).resolve().parents[2]


class Listener:
    """A plain TCP listener on 127.0.0.1: each connection gets ``reply`` (or silence), then is held
    open (``close``: closed at once)."""

    def __init__(self, reply: bytes = b"", close: bool = False):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.reply, self.close_at_once, self.held = reply, close, []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            if self.reply:
                conn.sendall(self.reply)
            if self.close_at_once:
                conn.close()
            else:
                self.held.append(conn)

    def stop(self):
        self.sock.close()
        for c in self.held:
            c.close()


@pytest.mark.parametrize("reply, close, why", [
    (b"", False, "no answer"),
    (b"HTTP/1.1 400 Bad Request\r\n\r\n", False, "it answered, but not in HTTP/2 (gRPC)"),
    (b"", True, "it closed the connection"),
])
def test_a_listener_that_is_not_ray_is_told_apart(reply, close, why):
    lis = Listener(reply, close)
    try:
        t0 = time.monotonic()
        assert gcs_silence(lis.address) == why
        assert time.monotonic() - t0 < GCS_TIMEOUT_S + 3
    finally:
        lis.stop()


def test_cluster_at_a_plain_listener_fails_within_seconds(tmp_path):
    pytest.importorskip("ray", reason="Ray is not installed: pip install 'torchfl[cluster]'")
    lis = Listener()
    url = f"sqlite:///{tmp_path / 'r.db'}"
    env = dict(os.environ, PYTHONPATH=str(ROOT), TORCHFL_COMPILE_HELPERS="0")
    try:
        subprocess.run([sys.executable, "-m", "torchfl.cli", "registry", "init", "--registry", url], env=env,
                       capture_output=True, check=True, timeout=300)
        t0 = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "torchfl.cli", "conformance", "--registry", url, "--chip",
                               "TFL-X1", "--ops", "neg", "--cluster", lis.address], capture_output=True, text=True,
                              env=env, timeout=240, cwd=ROOT)
        took = time.monotonic() - t0
    finally:
        lis.stop()
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr == (f"error: no Ray cluster at {lis.address}: something listens there but does not answer "
                           f"as a Ray head (no answer within 5 s); give the head's GCS port (`ray start --head "
                           "--port PORT`, 6379 by default), or auto on a node of the cluster\n"), proc.stderr
    assert took < 120, took      # the CLI's start-up on a shared machine, plus the 5 s asked of the listener
