"""The torchfl Dynamo backend: entry point, execution, fallbacks, strict, debug log,
errors, recompiles and graph breaks. Real torch.compile, real planner, real kernels."""
import logging
import re
import subprocess
import sys

import pytest
import torch

from tests.runtime.models import SmallCNN, TwoGraphs, WithErfinv, rel_err, seeded

V3 = {"chip": "NPU-V3", "precision": "float16"}
FP16_TOL = 1e-2   # end-to-end fp16 storage with fp32 accumulation, relative to max |ref|


def test_entry_point_registered():
    from importlib.metadata import entry_points

    eps = {e.name: e.value for e in entry_points(group="torch_dynamo_backends")}
    assert eps.get("torchfl") == "torchfl.runtime.backend:torchfl_backend"
    assert "torchfl" in torch._dynamo.list_backends(exclude_tags=())


def test_backend_works_without_importing_torchfl(registry_url, tmp_path):
    script = tmp_path / "user.py"
    script.write_text(
        "import sys, torch\n"
        "m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval()\n"
        "x = torch.randn(4, 8)\n"
        "c = torch.compile(m, backend='torchfl', options={'chip': 'NPU-V3', 'precision': 'float16'})\n"
        "with torch.no_grad():\n"
        "    y = c(x)\n"
        "    err = float((y - m(x)).abs().max() / m(x).abs().max())\n"
        "assert 'torchfl' not in {k.split('.')[0] for k in sys.modules if False}\n"
        "print('ERR', err)\n")
    env = {"TORCHFL_REGISTRY_URL": registry_url, "PATH": "/usr/bin:/bin"}
    from torchfl.kernels import jitcache

    env["NUMBA_CACHE_DIR"] = str(jitcache.configure())   # the kernels this session compiled
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    err = float(re.search(r"ERR (\S+)", out.stdout).group(1))
    assert err < FP16_TOL


def test_small_cnn_runs_on_chip_and_matches_eager():
    m = seeded(SmallCNN)
    x = torch.randn(2, 3, 16, 16)
    c = torch.compile(m, backend="torchfl", options=V3)
    with torch.no_grad():
        y = c(x)
        ref = m(x)
    assert y.dtype == torch.float32 and y.shape == ref.shape
    assert rel_err(y, ref) < FP16_TOL


def test_outputs_come_back_in_the_callers_layout():
    """A channels-last input: eager returns channels-last conv outputs, and so do we (same
    values, same strides); a contiguous input keeps contiguous outputs."""
    conv = seeded(lambda: torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU()).eval())
    c = torch.compile(conv, backend="torchfl", options=V3)
    with torch.no_grad():
        for fmt in (torch.channels_last, torch.contiguous_format):
            x = torch.randn(2, 3, 8, 8).contiguous(memory_format=fmt)
            y, ref = c(x), conv(x)
            assert y.stride() == ref.stride(), fmt
            assert rel_err(y, ref) < FP16_TOL


def test_debug_log_mapping_lines_once_per_plan(monkeypatch, caplog):
    monkeypatch.setenv("TORCH_FL_DEBUG", "1")
    m = seeded(SmallCNN)
    x = torch.randn(1, 3, 16, 16)
    c = torch.compile(m, backend="torchfl", options=V3)
    with caplog.at_level(logging.DEBUG, logger="torchfl"), torch.no_grad():
        c(x)
        first = [r.getMessage() for r in caplog.records if r.name == "torchfl"]
        c(x)
        c(x)
        after = [r.getMessage() for r in caplog.records if r.name == "torchfl"]
    mapping = [m for m in first if m.startswith("[SME] Mapping")]
    assert mapping, first
    pat = re.compile(r"^\[SME\] Mapping aten::\w+( \+ aten::\w+)* -> \w+ \(layout=[A-Z]+, dtype=fp16\)$")
    for line in mapping:
        assert pat.match(line), line
    assert any("aten::convolution" in l or "aten::conv2d" in l for l in mapping)
    assert after == first            # later calls log nothing


def test_fallback_is_logged_and_correct(caplog):
    m = seeded(WithErfinv)
    x = torch.randn(4, 16)
    c = torch.compile(m, backend="torchfl", options=V3)
    with caplog.at_level(logging.WARNING, logger="torchfl"), torch.no_grad():
        y = c(x)
        ref = m(x)
    lines = [r.getMessage() for r in caplog.records if r.name == "torchfl"]
    assert any(re.match(r"^\[SME\] Fallback to CPU: aten::erfinv \(.+\)$", l) for l in lines), lines
    assert rel_err(y, ref) < FP16_TOL


@pytest.mark.parametrize("how", ["option", "env"])
def test_strict_raises_before_execution(how, monkeypatch):
    from torchfl.kernels.memory import DeviceMemory

    opts = dict(V3)
    if how == "option":
        opts["strict"] = True
    else:
        monkeypatch.setenv("TORCHFL_STRICT", "1")
    m = seeded(WithErfinv)
    c = torch.compile(m, backend="torchfl", options=opts)
    allocs = []
    orig = DeviceMemory.alloc
    monkeypatch.setattr(DeviceMemory, "alloc", lambda self, n: allocs.append(n) or orig(self, n))
    with pytest.raises(RuntimeError) as err, torch.no_grad():
        c(torch.randn(4, 16))
    assert type(err.value).__name__ != "BackendCompilerFailed"
    assert "erfinv" in str(err.value) and "strict" in str(err.value).lower()
    assert allocs == []          # nothing was put on the device, nothing ran


def test_hard_constraint_error_surfaces_unchanged():
    mha = torch.nn.MultiheadAttention(768, 12, batch_first=True).eval()
    x = torch.randn(1, 8, 768)
    c = torch.compile(mha, backend="torchfl", options={"chip": "NPU-V2", "precision": "float16"})
    with pytest.raises(NotImplementedError) as err, torch.no_grad():
        c(x, x, x, need_weights=False)
    assert "MultiheadAttention with num_heads=12 not supported on NPU-V2" in str(err.value)
    assert type(err.value).__module__.startswith("torchfl")


def test_unknown_chip_names_registered_ones():
    c = torch.compile(torch.nn.Linear(4, 4), backend="torchfl", options={"chip": "NPU-V9"})
    with pytest.raises(Exception) as err, torch.no_grad():
        c(torch.randn(2, 4))
    assert "NPU-V9" in str(err.value) and "NPU-V3" in str(err.value)


def test_bad_options_are_clear():
    c = torch.compile(torch.nn.Linear(4, 4), backend="torchfl", options={"chip": "NPU-V3", "chips": 1})
    with pytest.raises(ValueError, match="unknown option.*'chips'.*accepts chip, precision, strict, registry"):
        c(torch.randn(2, 4))


def test_new_input_shape_replans():
    from torchfl.runtime.backend import recording

    m = seeded(SmallCNN)
    c = torch.compile(m, backend="torchfl", options=V3)
    shapes = []
    with torch.no_grad():
        for n in (1, 2, 3):
            x = torch.randn(n, 3, 16, 16)
            with recording() as rec:
                y = c(x)
            assert rel_err(y, m(x)) < FP16_TOL
            (cg, plan, _r), = rec.entries
            shapes.append(next(p.shape for p in plan.inputs if p.kind == "input"))
    assert shapes == [(1, 3, 16, 16), (2, 3, 16, 16), (3, 3, 16, 16)]


def test_graph_break_gives_two_planned_graphs():
    import torchfl

    m = seeded(TwoGraphs)
    x = torch.randn(4, 16)
    c = torch.compile(m, backend="torchfl", options=V3)
    with torch.no_grad():
        assert rel_err(c(x), m(x)) < FP16_TOL
    text = torchfl.explain(c, x)
    assert "graph 1 of 2" in text and "graph 2 of 2" in text


def test_outputs_of_data_dependent_size_keep_the_identity_layout():
    """An output whose strides hang on a data-dependent size cannot be asked whether it is
    channels-last (torch raises GuardOnDataDependentSymNode): it keeps the identity layout."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    from torchfl.runtime.backend import _channels_last_outputs

    env = ShapeEnv()
    u = env.create_unbacked_symint()
    with FakeTensorMode(shape_env=env):
        unknown = torch.empty_strided((2, 3, u, 4), (12 * u, 1, 12, 3))
        last = torch.empty((2, 3, 4, 5)).to(memory_format=torch.channels_last)
    g = torch.fx.Graph()
    a, b = g.placeholder("a"), g.placeholder("b")
    a.meta["val"], b.meta["val"] = unknown, last
    g.output((a, b))
    assert _channels_last_outputs(torch.fx.GraphModule(torch.nn.Module(), g)) == (1,)
