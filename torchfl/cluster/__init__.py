"""Sweeps fanned out over workers: local processes, or Ray tasks on a cluster.

The commands that sweep (``torchfl conformance``, ``plan compare``, ``plan impact``,
``tools/bench_zoo.py``) split their work into units (:class:`~.units.Unit`: a stable key and
a function to call) and hand them to a runner: :class:`~.local.LocalRunner` (today's
process pool) or, with ``--cluster ADDRESS``, :class:`~.ray_runner.RayRunner` (Ray tasks;
Ray is imported only there). Every unit runs through the same :func:`~.units.execute` on
whichever worker takes it: it checks that the worker runs the driver's torchfl
(:mod:`.fingerprint`), calls the unit, and writes its result to the registry exactly once
(``torchfl.registry.sweeps``). :class:`~.sweep.Sweep` ties a run in the registry to a
runner, so that a run whose driver died is finished by ``--resume RUN``.

Layering: above ``conformance`` (it builds conformance units), below ``cli``.
"""

from __future__ import annotations

#: how to get Ray, in every message that needs it
INSTALL_HINT = "pip install 'torchfl[cluster]'"


class ClusterError(Exception):
    """A sweep could not run on its workers; ``str()`` is one line that says what to do."""

    exit_code = 2
