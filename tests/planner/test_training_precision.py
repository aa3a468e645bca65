"""The precision policy keeps saved normalisation statistics float32 (SPEC 8: the policy
casts activations and parameters and accumulates in fp32). The planner's table of which
op outputs / arguments are statistics (planner/graph.py ACCUMULATOR_*) is checked here
against the kernel catalog, and the norm kernels are run in float16 to show that they
write and read those statistics as float32."""
import pytest
import torch

from torchfl.kernels import ChipModel, DeviceMemory, KernelError
from torchfl.kernels.catalog import CATALOG, get
from torchfl.kernels.tensor import DeviceTensor
from torchfl.planner.graph import ACCUMULATOR_ARGS, ACCUMULATOR_OUTPUTS

# a float16 problem per norm kernel: input shapes (batch-norm: 4 channels; layer-norm: rows of 6)
SHAPES = {
    "batch_norm_infer": {"x": (2, 4, 3, 3), "weight": (4,), "bias": (4,), "running_mean": (4,),
                         "running_var": (4,)},
    "batch_norm_train": {"x": (2, 4, 3, 3), "weight": (4,), "bias": (4,), "running_mean": (4,),
                         "running_var": (4,)},
    "layer_norm": {"x": (2, 5, 6), "weight": (6,), "bias": (6,)},
    "group_norm": {"x": (2, 4, 6), "weight": (4,), "bias": (4,)},
    "batch_norm_backward": {"grad_out": (2, 4, 3, 3), "x": (2, 4, 3, 3), "weight": (4,),
                            "save_mean": (4,), "save_invstd": (4,)},
    "layer_norm_backward": {"grad_out": (2, 5, 6), "x": (2, 5, 6), "mean": (2, 5, 1), "rstd": (2, 5, 1),
                            "weight": (6,), "bias": (6,)},
}
ATTRS = {"layer_norm": {"normalized_shape": [6]}, "group_norm": {"groups": 2}, "layer_norm_backward": {"normalized_shape": [6]}}


def _serving(op):
    """The norm kernels that serve ``op`` whole (their ``fuses`` name it)."""
    names = [k.name for k in CATALOG.values() if k.family == "norm" and op in k.fuses]
    assert names, f"no norm kernel serves {op}"
    return names


def _problem(name, dtypes=None):
    spec = get(name)
    shapes = SHAPES[name]
    dtypes = {n: "float16" for n in shapes} | (dtypes or {})
    return spec.problem(shapes, ATTRS.get(name, {}), "float16", {}, dtypes)


@pytest.mark.parametrize("op", sorted(ACCUMULATOR_OUTPUTS))
def test_statistic_outputs_are_the_kernels_float32_outputs(op):
    for name in _serving(op):
        metas = get(name).output_meta(_problem(name))
        n_out = len(getattr(torch.ops.aten, op.split(".")[1]).default._schema.returns)
        f32 = {i for i, m in enumerate(metas[:n_out]) if m.dtype == "float32"}
        # the table names exactly the outputs the kernel keeps float32 when computing in float16
        assert f32 == set(ACCUMULATOR_OUTPUTS[op]), (name, [m.dtype for m in metas])


@pytest.mark.parametrize("op", sorted(ACCUMULATOR_ARGS))
def test_statistic_arguments_are_the_kernels_float32_inputs(op):
    schema = {a.name for a in getattr(torch.ops.aten, op.split(".")[1]).default._schema.arguments}
    for name in _serving(op):
        spec = get(name)
        for arg in ACCUMULATOR_ARGS[op]:
            assert arg in schema and arg in spec.input_names   # the rule binds them by name
        stats = {a: "float32" for a in ACCUMULATOR_ARGS[op]}
        _problem(name, stats)        # float16 data with float32 statistics: accepted
        for arg in ACCUMULATOR_ARGS[op]:
            if arg.startswith("save_"):
                # batch norm's saved statistics of a float16 graph are float16 in ATen's
                # decomposition (a float16 model's backward graph reads them so): accepted;
                # any third dtype is not
                _problem(name, {**stats, arg: "float16"})
                with pytest.raises(KernelError, match=f"{arg} must be float32"):
                    _problem(name, {**stats, arg: "bfloat16"})
                continue
            with pytest.raises(KernelError, match=f"{arg} must be float32"):
                _problem(name, {**stats, arg: "float16"})


def _dev(t, mem):
    return DeviceTensor.from_torch(t, mem, dtype="float16" if t.dtype == torch.float32 else None)


def test_norm_kernels_in_float16_write_and_read_float32_statistics():
    chip = ChipModel(cache_bytes=8 << 20)
    mem = DeviceMemory(chip)
    torch.manual_seed(0)
    x = torch.randn(2, 5, 6) * 3 + 1
    w, b = torch.rand(6) + 0.5, torch.randn(6)
    (y, mean, rstd), counted = get("layer_norm").run(
        chip, {"x": _dev(x, mem), "weight": _dev(w, mem), "bias": _dev(b, mem)}, {"normalized_shape": [6]})
    assert (y.dtype, mean.dtype, rstd.dtype) == ("float16", "float32", "float32")
    xh = x.half().float()
    ref = torch.ops.aten.native_layer_norm(xh, [6], w.half().float(), b.half().float(), 1e-5)
    assert torch.allclose(mean.to_torch(), ref[1], rtol=1e-5, atol=1e-5)
    assert torch.allclose(rstd.to_torch(), ref[2], rtol=1e-4, atol=1e-5)
    # the backward reads them as they are, with no cast in between
    g = torch.randn(2, 5, 6)
    spec = get("layer_norm_backward")
    outs, _ = spec.run(chip, {"grad_out": _dev(g, mem), "x": _dev(x, mem), "mean": mean, "rstd": rstd,
                              "weight": _dev(w, mem), "bias": _dev(b, mem)}, {"normalized_shape": [6]})
    assert [o.dtype for o in outs] == ["float16"] * 3
    # predicted bytes (the tiling) equal the bytes the kernel counted, float32 statistics included
    problem = get("layer_norm").problem({"x": (2, 5, 6), "weight": (6,), "bias": (6,)},
                                        {"normalized_shape": [6]}, "float16")
    tp = get("layer_norm").tile(problem, chip)
    assert (tp.traffic.bytes_read, tp.traffic.bytes_written) == (counted.bytes_read, counted.bytes_written)

    xb = torch.randn(2, 4, 3, 3)
    C = 4
    ins = {"x": _dev(xb, mem), "weight": _dev(torch.rand(C) + 0.5, mem), "bias": _dev(torch.randn(C), mem),
           "running_mean": _dev(torch.zeros(C), mem), "running_var": _dev(torch.ones(C), mem)}
    outs, _ = get("batch_norm_train").run(chip, ins, {})
    # the new running statistics are float32 too (ATen's decomposition promotes with save_mean)
    assert [o.dtype for o in outs] == ["float16", "float32", "float32", "float32", "float32"]
    ref_mean = xb.half().float().mean(dim=(0, 2, 3))
    assert torch.allclose(outs[1].to_torch(), ref_mean, atol=1e-5)
