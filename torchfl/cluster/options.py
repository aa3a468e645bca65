"""The ``--cluster`` and ``--resume`` options, shared by every command that sweeps.

``--cluster ADDRESS`` checks that Ray is importable before anything else runs (without it:
one line with the install hint, exit 2); the runner is built by :func:`runner`. Messages
name the registry by :func:`~torchfl.registry.url.display_url` only (no password).
"""

from __future__ import annotations

import contextlib
import sys

import click

from torchfl.cluster import INSTALL_HINT, ClusterError


def cluster_option(f):
    return click.option(
        "--cluster", "cluster", metavar="ADDRESS", default=None,
        help="Run the units as Ray tasks on the cluster at ADDRESS (HOST:PORT of its head; auto: the cluster "
             f"this node belongs to). Needs the cluster extra: {INSTALL_HINT}.")(f)


def resume_option(f):
    return click.option("--resume", "resume", metavar="RUN", type=click.IntRange(min=1), default=None,
                        help="Finish sweep run RUN (recorded in the registry): only its missing units run.")(f)


def require_ray(cluster: str | None) -> None:
    """Exit 2 with the install hint when --cluster is given and Ray is missing (before torch loads)."""
    if cluster is None:
        return
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        click.echo(f"error: --cluster needs Ray, which is not installed: {INSTALL_HINT}", err=True)
        sys.exit(2)
    if not cluster.strip():
        click.echo("error: --cluster is empty; give the head's HOST:PORT (e.g. 10.0.0.5:6379) or auto", err=True)
        sys.exit(2)


def runner(cluster: str | None, jobs: int, echo=None):
    """A RayRunner on ``cluster``, else a LocalRunner of ``jobs`` processes."""
    if cluster is None:
        from torchfl.cluster.local import LocalRunner

        return LocalRunner(jobs)
    from torchfl.cluster.ray_runner import RayRunner

    return RayRunner(cluster, echo=echo)


@contextlib.contextmanager
def reported(sweep_of=lambda: None):
    """ClusterError -> one line and its exit code; a sweep that stops early says how to resume it.
    ``sweep_of()`` returns the running Sweep (or None)."""
    try:
        yield
    except ClusterError as exc:
        _note(sweep_of())
        click.echo(f"error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        _note(sweep_of())
        click.echo("error: interrupted", err=True)
        sys.exit(130)
    except BaseException:
        _note(sweep_of())
        raise


def _note(sweep) -> None:
    if sweep is None:
        return
    try:
        note = sweep.partial_note()
    except Exception:  # noqa: BLE001 - the registry may be what failed; the error below says so
        note = None
    if note:
        click.echo(f"note: {note}", err=True)
