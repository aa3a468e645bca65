"""Units as Ray tasks on a cluster (``--cluster ADDRESS``); Ray is imported here only.

The driver connects to a running cluster (``auto``: the one ``ray start`` left on this
machine, or ``RAY_ADDRESS``), probes every node that has CPUs with one small task (is it the
driver's torchfl? is its kernel cache warm?), then submits one task per unit (one CPU each)
and yields units as they finish, wherever they ran. A task whose worker dies is retried by
Ray (``MAX_RETRIES``); the unit's result is written by the worker that completes it, once
(:func:`torchfl.cluster.units.execute`), so a retry after a write stores nothing twice.
"""

from __future__ import annotations

import logging
from typing import Iterator

from torchfl.cluster import INSTALL_HINT, ClusterError
from torchfl.cluster.fingerprint import VersionMismatch
from torchfl.cluster.units import Done, Job, Unit, execute, node_name

#: Ray re-runs a task this many times after its worker or node died (not after an error it raised)
MAX_RETRIES = 3
#: the task's name: worker processes show ``ray::torchfl-unit`` while they run one
TASK_NAME = "torchfl-unit"


def import_ray():
    try:
        import ray
    except ImportError:
        raise ClusterError(f"--cluster needs Ray, which is not installed here: {INSTALL_HINT}") from None
    return ray


def probe(expect) -> dict:
    """On one node: who it is, whether it runs the driver's torchfl, its kernel cache."""
    from torchfl.cluster.fingerprint import local
    from torchfl.kernels import jitcache

    path, source = jitcache.location()
    functions = len(list(path.rglob("*.nbi"))) if path.is_dir() else 0
    return dict(node=node_name(), differences=local().differences(expect), cache=str(path), cache_source=source,
                cached_functions=functions)


#: seconds a Ray head's GCS has to answer its first request before the address is refused
GCS_TIMEOUT_S = 5.0


def gcs_silence(address: str, timeout: float = GCS_TIMEOUT_S) -> str | None:
    """None when the listener at ``address`` (HOST:PORT) answers as a Ray head's GCS does (a gRPC
    server: HTTP/2, whose first frame is its SETTINGS), else what it did instead. Why: ``ray.init``
    retries a listener that is not Ray for minutes (>= 300 s, issue 52); a gRPC server sends its
    SETTINGS within milliseconds of the client's preface. Plain sockets: Ray's own client is C++."""
    import socket

    host, _, port = address.rpartition(":")
    preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])  # + empty SETTINGS
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout) as sock:
            sock.settimeout(timeout)
            sock.sendall(preface)
            head = b""
            while len(head) < 9:
                chunk = sock.recv(9 - len(head))
                if not chunk:
                    return "it closed the connection" if not head else "it answered, but not in HTTP/2 (gRPC)"
                head += chunk
    except socket.timeout:
        return "no answer"
    except (ConnectionResetError, BrokenPipeError):
        # a listener that closes with our preface unread resets the connection (a race with close)
        return "it closed the connection"
    except OSError as exc:
        return f"connection failed: {exc.strerror or exc}"
    if head[3] != 4 or int.from_bytes(head[5:9], "big") & 0x7FFFFFFF != 0:
        return "it answered, but not in HTTP/2 (gRPC)"
    return None


class RayRunner:
    """Ray tasks on the cluster at ``address`` (``auto`` or ``HOST:PORT``)."""

    def __init__(self, address: str, *, echo=None):
        self.address = address
        self.echo = echo or (lambda line: None)
        self.ray = import_ray()
        self.nodes: list[dict] = []
        self._connected = False

    def describe(self) -> str:
        """The cluster in a few words (connects and checks its nodes first)."""
        cpus = self.connected_cpus()
        return f"Ray cluster {self.address}: {len(self.nodes)} node(s), {cpus:g} CPUs"

    def _check_reachable(self) -> None:
        """Fail fast on an address nothing listens on (ray.init would retry it for minutes)."""
        import os
        import socket

        address = self.address
        if address == "auto":
            address = os.environ.get("RAY_ADDRESS", "")
            if not address or address == "auto":
                return            # Ray looks for the cluster this node runs, and says so when there is none
        host, _, port = address.removeprefix("ray://").rpartition(":")
        if not host or not port.isdigit():
            raise ClusterError(f"--cluster {address!r} is not HOST:PORT (the head's address, e.g. 10.0.0.5:6379) "
                               "nor auto")
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=5).close()
        except OSError as exc:
            raise ClusterError(
                f"no Ray cluster at {address}: cannot connect ({exc.strerror or exc}); start one with `ray start "
                "--head --port PORT` on the head node and `ray start --address HEAD:PORT` on each worker") from None
        if not address.startswith("ray://"):
            why = gcs_silence(address)
            if why is not None:
                raise ClusterError(
                    f"no Ray cluster at {address}: something listens there but does not answer as a Ray head ({why} "
                    f"within {GCS_TIMEOUT_S:g} s); give the head's GCS port (`ray start --head --port PORT`, 6379 by "
                    "default), or auto on a node of the cluster")

    def connect(self) -> None:
        ray = self.ray
        if self._connected:
            return
        self._check_reachable()
        try:
            ray.init(address=self.address, logging_level=logging.ERROR, log_to_driver=False,
                     configure_logging=True)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise ClusterError(
                f"no Ray cluster at {self.address} ({first[:300]}); start one with `ray start --head` on the head "
                "node and `ray start --address HEAD:PORT` on each worker, then pass --cluster HEAD:PORT "
                "(or auto on a node of the cluster)") from None
        self._connected = True

    def check_nodes(self, expect) -> list[dict]:
        """Probe each alive node with CPUs; refuse (VersionMismatch) when any is not the driver's torchfl."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        ray = self.ray
        self.connect()
        alive = [n for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) > 0]
        if not alive:
            raise ClusterError(f"the Ray cluster at {self.address} has no node with CPUs to run units; "
                               "start workers with `ray start --address HEAD:PORT --num-cpus N`")
        task = ray.remote(probe)
        refs = [task.options(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False),
                             name="torchfl-probe").remote(expect) for n in alive]
        found = ray.get(refs)
        refused = [f for f in found if f["differences"]]
        if refused:
            raise VersionMismatch(
                f"{len(refused)} of {len(found)} node(s) do not run the driver's torchfl: "
                + "; ".join(f"{f['node']}: {', '.join(f['differences'])}" for f in refused)
                + "; install the driver's torchfl (same version and sources, same torch and Numba) on every node "
                "and restart its Ray worker")
        self.nodes = []
        for n, f in zip(alive, found):
            cpus = n["Resources"].get("CPU", 0)
            self.nodes.append(dict(f, cpus=cpus, address=n.get("NodeManagerAddress")))
            warm = (f"{f['cached_functions']} compiled kernel functions cached" if f["cached_functions"]
                    else "kernel cache cold: its first units compile their kernels (run `torchfl kernels warmup` "
                    "on that node once to avoid it)")
            self.echo(f"node {f['node'].rsplit(' pid', 1)[0]} ({n.get('NodeManagerAddress')}): {cpus:g} CPUs, {warm}")
        return self.nodes

    def connected_cpus(self) -> float:
        """Connect, check every node (see :meth:`check_nodes`) and return the CPUs that run units."""
        from torchfl.cluster.fingerprint import local

        if not self.nodes:
            self.check_nodes(local())
        return sum(n["cpus"] for n in self.nodes)

    def run(self, units: list[Unit], job: Job) -> Iterator[Done]:
        """Submit every unit, yield each :class:`Done` as it finishes; the first unit that
        fails for good cancels the rest and raises ClusterError."""
        ray = self.ray
        self.connect()
        if not self.nodes:
            self.check_nodes(job.expect)
        options = dict(num_cpus=1, max_retries=MAX_RETRIES, retry_exceptions=False, name=TASK_NAME)
        if job.process_env:     # workers of their own, started with it (Ray keys its worker pools by it)
            options["runtime_env"] = {"env_vars": dict(job.process_env)}
        remote = ray.remote(execute).options(**options)
        pending = {remote.remote(unit, job): unit for unit in units}
        try:
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=1)
                for ref in ready:
                    unit = pending.pop(ref)
                    yield self._get(ref, unit)
        finally:
            for ref in pending:
                ray.cancel(ref, force=True)

    def _get(self, ref, unit: Unit) -> Done:
        ray = self.ray
        try:
            return ray.get(ref)
        except ray.exceptions.RayTaskError as exc:
            cause = getattr(exc, "cause", None)
            if isinstance(cause, ClusterError):
                raise type(cause)(str(cause)) from None
            if cause is not None:
                first = (str(cause).strip().splitlines() or [""])[0]
                raise ClusterError(f"unit {unit.key} failed on the cluster: {type(cause).__name__}: "
                                   f"{first[:400]}") from None
            raise ClusterError(f"unit {unit.key} failed on the cluster: {str(exc).splitlines()[0][:400]}") from None
        except ray.exceptions.RayError as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise ClusterError(f"unit {unit.key} was lost: {type(exc).__name__} after {MAX_RETRIES} retries "
                               f"({first[:300]})") from None

    def close(self) -> None:
        if self._connected:
            self.ray.shutdown()
            self._connected = False
