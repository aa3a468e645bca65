"""A throw-away Ray cluster on this machine: `ray start --head` plus worker nodes, loopback only.

Each node is a `ray start --block` process in a process group of its own, so that stopping the
cluster ends exactly the processes these tests started (their process groups), never another
Ray on the machine (`ray stop` would end every Ray of the user). The groups stay in the
caller's session: with the kernel's autogroup scheduling a new session would be a new share
of a busy machine's CPU, which would flatter the cluster against a local run. Files go to a private
RAY_TMPDIR. Workers inherit ``env`` (PYTHONPATH: the checkout under test, NUMBA_CACHE_DIR).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RAY = str(Path(sys.executable).with_name("ray"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RayCluster:
    def __init__(self, workers: int = 2, cpus_per_worker: int = 1, env: dict | None = None):
        self.workers, self.cpus = workers, cpus_per_worker
        # short: Ray's unix sockets live under it (a socket path has ~107 characters at most)
        self.tmp = Path(tempfile.mkdtemp(prefix="tfray-", dir="/tmp"))
        self.env = dict(env or os.environ, RAY_TMPDIR=str(self.tmp), RAY_USAGE_STATS_ENABLED="0")
        self.env.pop("RAY_ADDRESS", None)
        self.port = _free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.nodes: list[subprocess.Popen] = []

    def _start(self, *args: str) -> subprocess.Popen:
        log = open(self.tmp / f"node{len(self.nodes)}.log", "a")
        proc = subprocess.Popen([RAY, "start", "--block", "--disable-usage-stats", "--node-ip-address", "127.0.0.1",
                                 "--object-store-memory", str(80 * 1024 * 1024), *args],
                                env=self.env, stdout=log, stderr=subprocess.STDOUT, process_group=0)
        self.nodes.append(proc)
        return proc

    def start(self, timeout: float = 180, tries: int = 3) -> "RayCluster":
        """The head, then each worker node in turn. Ray gives a node 30 s to register with the
        head; on a loaded machine it may miss that, so a node that gave up is ended (its
        process group) and started again, ``tries`` times in all."""
        self._node(1, tries, timeout, "--head", "--port", str(self.port), "--num-cpus", "0",
                   "--include-dashboard=false")
        for i in range(self.workers):
            self._node(2 + i, tries, timeout, "--address", self.address, "--num-cpus", str(self.cpus))
        return self

    def _node(self, expect: int, tries: int, timeout: float, *args: str) -> None:
        for attempt in range(tries):
            proc = self._start(*args)
            try:
                self._wait(expect, timeout)
                return
            except RuntimeError:
                if proc.poll() is None or attempt == tries - 1:
                    raise
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.nodes.remove(proc)

    def alive_nodes(self) -> int:
        """Nodes the head reports alive (asked through `ray` in a child process: the test process keeps no Ray)."""
        code = ("import ray, logging; ray.init(address=%r, logging_level=logging.ERROR, log_to_driver=False); "
                "print(sum(1 for n in ray.nodes() if n['Alive'])); ray.shutdown()" % self.address)
        proc = subprocess.run([sys.executable, "-c", code], env=self.env, capture_output=True, text=True, timeout=120)
        try:
            return int(proc.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            return 0

    def _wait(self, n: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            dead = [p for p in self.nodes if p.poll() is not None]
            if dead:
                raise RuntimeError(f"a Ray node exited ({dead[0].args[2:5]}): {self.log_tail()}")
            if self.alive_nodes() >= n:
                return
            time.sleep(1)
        raise RuntimeError(f"the Ray cluster did not reach {n} nodes in {timeout:.0f} s: {self.log_tail()}")

    def log_tail(self) -> str:
        return " | ".join((self.tmp / f"node{i}.log").read_text(errors="replace")[-400:]
                          for i in range(len(self.nodes)))

    def unit_workers(self, task: str = "torchfl-unit") -> list[int]:
        """PIDs of this cluster's worker processes running a unit now (their title is ``ray::<task>``)."""
        out = []
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                title = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
                environ = Path(f"/proc/{pid}/environ").read_bytes()
            except OSError:
                continue
            if title.startswith(f"ray::{task}") and f"RAY_TMPDIR={self.tmp}".encode() in environ:
                out.append(int(pid))
        return out

    def stop(self) -> None:
        """End every process of every node this object started (by process group), then its files."""
        for proc in self.nodes:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 15
        for proc in self.nodes:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        time.sleep(1)
        for proc in self.nodes:
            try:
                os.killpg(proc.pid, signal.SIGKILL)   # what SIGTERM left (workers, agents)
            except ProcessLookupError:
                pass
        self.nodes = []
        import shutil

        shutil.rmtree(self.tmp, ignore_errors=True)
