"""Issue 52 case 12: ``conformance --resume RUN --ops neg`` on a run of four ops silently ran the
four original ops; docs/CLUSTER.md promises that a resumed run is the same sweep and that other
options are refused with what differs. Now each sweep option given with another value than the
run's is named in one line (exit 1); the run's own values, or none, resume it."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from torchfl.cli.main import cli
from torchfl.registry import Registry
from torchfl.registry.sweeps import Sweeps

OPS = ["aten.add.Tensor", "aten.neg.default", "aten.sigmoid.default", "aten.relu.default"]


@pytest.fixture(scope="module")
def partial(tmp_path_factory):
    """A partial conformance sweep of 4 ops on TFL-X1 (as a driver killed after starting it leaves it)."""
    url = f"sqlite:///{tmp_path_factory.mktemp('resume') / 'r.db'}"
    reg = Registry(url)
    reg.init(seed=True)
    from torchfl.cluster.conformance import ConformanceSweep
    from torchfl.conformance.harness import Settings

    settings = Settings(samples=1, edge_from=0, ops=tuple(OPS), dtypes=("float32",), jobs=1)
    spec = ConformanceSweep(None, registry=reg).spec("TFL-X1", settings, reg.identity("TFL-X1").chip_hash)
    run = Sweeps(reg).start("conformance", "conformance TFL-X1", spec, [f"{o} float32" for o in OPS], driver="test")
    return url, run.id


def _resume(partial, *args):
    url, run_id = partial
    return CliRunner().invoke(cli, ["conformance", "--registry", url, "--resume", str(run_id), *args]), run_id


def test_changed_ops_are_refused_naming_them(partial):
    r, run_id = _resume(partial, "--ops", "neg")
    assert r.exit_code == 1, r.output
    (line,) = [ln for ln in r.output.splitlines() if ln.strip()]
    assert f"sweep run {run_id} was started with other options: --ops neg (the run's: {','.join(OPS)})" in line, line
    assert f"--resume {run_id} alone" in line


def test_every_changed_option_is_named_at_once(partial):
    r, _ = _resume(partial, "--dtypes", "float16", "--samples", "all", "--edge", "3", "--mode", "eager")
    assert r.exit_code == 1, r.output
    for words in ("--dtypes float16 (the run's: float32)", "--samples all (the run's: 1)",
                  "--edge 3 (the run's: 0)", "--mode eager (the run's: compile)"):
        assert words in r.output, r.output


def test_the_runs_own_options_are_not_refused():
    from torchfl.cli.conformance_cmd import _refuse_changed

    recorded = dict(ops=tuple(OPS), dtypes=("float32",), samples=1, edge_from=0, mode="compile")
    _refuse_changed(1, dict(ops=(",".join(OPS),), dtypes=("torch.float32",), samples=1, edge_from=0,
                            mode="compile"), recorded)
    _refuse_changed(1, {}, recorded)
