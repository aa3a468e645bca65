"""NaN and ±inf through every kernel family, against torch on the same (rounded) inputs.

Tolerance note: special values are compared exactly -- NaN at exactly the positions where
torch has NaN, ±inf at exactly torch's positions with torch's sign -- and the finite rest at
the per-dtype tolerances of tolerances.py. A kernel that turns a NaN row of softmax into
finite probabilities, drops a NaN in a max, or lets relu(NaN) become 0 fails here.
"""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from torchfl.kernels import DeviceMemory
from torchfl.kernels.catalog import get

from .helpers import as_f32, assert_close, chip_for, dev

DT = ["float32", "float16", "bfloat16"]
NAN, INF = float("nan"), float("inf")
# 1.0e5 overflows float16 (max 65504): the store rounds it to inf, as torch's .half() does
SPECIALS = (NAN, INF, -INF)


def run(name, chip, inputs, attrs=None):
    """Run a kernel on its own tile plan (counted == predicted, as every kernel test)."""
    spec = get(name)
    prob = spec.problem({k: t.shape for k, t in inputs.items()}, attrs,
                        None if spec.mixed_dtypes else next(iter(inputs.values())).dtype,
                        {k: t.layout for k, t in inputs.items()}, {k: t.dtype for k, t in inputs.items()})
    plan = spec.tile(prob, chip)
    outs, counted = spec.run(chip, inputs, attrs, plan)
    assert counted == plan.traffic, (name, plan.config, counted, plan.traffic)
    return outs


def check(got, ref, dtype, what):
    """NaN and ±inf positions exact, the finite rest within the dtype's tolerance."""
    got = torch.from_numpy(np.asarray(got.to_numpy(), dtype=np.float32))    # 0-d bf16 too
    ref = ref.to(torch.float32)
    if dtype in ("float16", "bfloat16"):
        ref = ref.to(getattr(torch, dtype)).to(torch.float32)   # the store's rounding (and overflow)
    for name, test in (("NaN", torch.isnan), ("+inf", torch.isposinf), ("-inf", torch.isneginf)):
        bad = test(got) != test(ref)
        assert not bad.any(), (f"{what} [{dtype}]: {name} at {bad.nonzero().tolist()[:6]} differs from torch: "
                               f"got {got[bad][:6].tolist()}, torch {ref[bad][:6].tolist()}")
    fin = torch.isfinite(ref)
    assert_close(got[fin], ref[fin], dtype, scale=2, what=what)


def special(shape, seed, where):
    """randn with NaN/+inf/-inf at the flat positions ``where`` (cycled in that order)."""
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(seed))
    flat = x.view(-1)
    for i, p in enumerate(where):
        flat[p] = SPECIALS[i % 3]
    return x


def rows(n_cols):
    """Softmax/norm rows: NaN, +inf, one -inf, all -inf, +inf and -inf, plain."""
    x = torch.randn(6, n_cols, generator=torch.Generator().manual_seed(1))
    x[0, 2] = NAN
    x[1, 3] = INF
    x[2, 1] = -INF
    x[3, :] = -INF
    x[4, 0], x[4, 4] = INF, -INF
    return x


# ---------------------------------------------------------------- softmax family

@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
@pytest.mark.parametrize("dim", [-1, 0])
def test_softmax(dtype, name, dim):
    chip = chip_for(dtype)
    mem = DeviceMemory(chip)
    x = dev(rows(7), mem, dtype)
    (y,) = run(name, chip, {"x": x}, {"dim": dim})
    check(y, getattr(torch, name)(as_f32(x), dim), dtype, name)


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_softmax_streamed_rows(name):
    """Rows longer than a 1 KiB cache: the online (row_split) path keeps NaN and inf too."""
    chip = chip_for("float32", 1 << 10)
    mem = DeviceMemory(chip)
    x = rows(700)
    x[0, 650], x[1, 690] = NAN, INF                  # specials in a later chunk than the first
    xd = dev(x, mem, "float32")
    (y,) = run(name, chip, {"x": xd}, {"dim": -1})
    check(y, getattr(torch, name)(as_f32(xd), -1), "float32", f"{name} row_split")


@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize("log", [False, True])
def test_softmax_backward(dtype, log):
    chip = chip_for(dtype)
    mem = DeviceMemory(chip)
    out = torch.log_softmax(torch.randn(4, 6), -1) if log else torch.softmax(torch.randn(4, 6), -1)
    g = special((4, 6), 2, (1, 8, 15))
    gd, od = dev(g, mem, dtype), dev(out, mem, dtype)
    name = "log_softmax_backward" if log else "softmax_backward"
    (y,) = run(name, chip, {"grad": gd, "out": od}, {"dim": -1})
    fn = torch.ops.aten._log_softmax_backward_data if log else torch.ops.aten._softmax_backward_data
    check(y, fn(as_f32(gd), as_f32(od), -1, torch.float32), dtype, name)


# ---------------------------------------------------------------- norms

@pytest.mark.parametrize("dtype", DT)
def test_layer_norm(dtype):
    chip = chip_for(dtype)
    mem = DeviceMemory(chip)
    x = dev(rows(8), mem, dtype)
    w, b = torch.randn(8), torch.randn(8)
    (y, mean, rstd) = run("layer_norm", chip, {"x": x, "weight": dev(w, mem, dtype), "bias": dev(b, mem, dtype)},
                          {"normalized_shape": (8,)})
    ref = F.layer_norm(as_f32(x), (8,), round_(w, dtype), round_(b, dtype), 1e-5)
    check(y, ref, dtype, "layer_norm")   # (the saved mean of a row with inf: inf here, NaN from torch's Welford)


def round_(t, dtype):
    return t.to(getattr(torch, dtype)).to(torch.float32)


@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize("train", [False, True])
def test_batch_norm(dtype, train):
    chip = chip_for(dtype)
    mem = DeviceMemory(chip)
    x = special((2, 4, 3, 3), 3, (5, 30, 60))        # channels 0, 1 and 2 (of batch 0 and 1)
    xd = dev(x, mem, dtype)
    w, b, rm, rv = torch.randn(4), torch.randn(4), torch.randn(4), torch.rand(4) + 0.5
    ins = {"x": xd, "weight": dev(w, mem, dtype), "bias": dev(b, mem, dtype),
           "running_mean": dev(rm, mem, dtype), "running_var": dev(rv, mem, dtype)}
    (y, *_) = run("batch_norm_train" if train else "batch_norm_infer", chip, ins, {"eps": 1e-5})
    ref = F.batch_norm(as_f32(xd), round_(rm, dtype), round_(rv, dtype), round_(w, dtype), round_(b, dtype),
                       training=train)
    check(y, ref, dtype, f"batch_norm {'train' if train else 'infer'}")


# ---------------------------------------------------------------- reductions

REDUCE = {"sum": torch.sum, "mean": torch.mean, "amax": torch.amax}


@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize("name", sorted(REDUCE))
@pytest.mark.parametrize("dim", [1, 0, None])
def test_reduce(dtype, name, dim):
    chip = chip_for(dtype)
    mem = DeviceMemory(chip)
    x = rows(5)
    x[5, :] = -INF if name == "amax" else x[5, :]      # a max over only -inf is -inf
    xd = dev(x, mem, dtype)
    attrs = {"dim": dim} if dim is not None else {}
    (y,) = run(name, chip, {"x": xd}, attrs)
    ref = REDUCE[name](as_f32(xd), dim) if dim is not None else REDUCE[name](as_f32(xd))
    check(y, ref, dtype, f"{name} dim={dim}")


# ---------------------------------------------------------------- pooling

def pool_input():
    x = torch.randn(1, 2, 4, 4, generator=torch.Generator().manual_seed(4))
    x[0, 0, 0, 1] = NAN          # window (0,0) of channel 0: NaN is the max, as in torch
    x[0, 0, 2, 2] = INF
    x[0, 1, 1, 1] = -INF
    x[0, 1, 2:, 2:] = -INF       # a window of only -inf
    x[0, 1, 3, 0] = NAN
    return x


@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize("layout", [None, "NHWC"])
def test_max_pool(dtype, layout):
    chip = chip_for(dtype)
    mem = DeviceMemory(chip)
    xd = dev(pool_input(), mem, dtype, layout)
    y, idx = run("max_pool2d", chip, {"x": xd}, {"kernel_size": 2, "return_indices": True})
    ref, ridx = F.max_pool2d(as_f32(xd), 2, return_indices=True)
    check(y, ref, dtype, "max_pool2d")
    nan = torch.isnan(ref)
    assert torch.equal(torch.from_numpy(idx.to_numpy())[nan], ridx[nan]), "max_pool2d: index of the NaN"
    (y3,) = run("max_pool2d", chip, {"x": xd}, {"kernel_size": 3, "stride": 1, "padding": 1})
    check(y3, F.max_pool2d(as_f32(xd), 3, 1, 1), dtype, "max_pool2d 3x3 padded")


@pytest.mark.parametrize("dtype", DT)
def test_avg_pools(dtype):
    chip = chip_for(dtype)
    mem = DeviceMemory(chip)
    xd = dev(pool_input(), mem, dtype)
    (y,) = run("avg_pool2d", chip, {"x": xd}, {"kernel_size": 2})
    check(y, F.avg_pool2d(as_f32(xd), 2), dtype, "avg_pool2d")
    (y,) = run("adaptive_avg_pool2d", chip, {"x": xd}, {"output_size": (1, 1)})
    check(y, F.adaptive_avg_pool2d(as_f32(xd), 1), dtype, "adaptive_avg_pool2d")


# ---------------------------------------------------------------- GEMM and epilogues

@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize("kernel", ["linear", "linear_relu", "linear_gelu"])
def test_linear_epilogues(dtype, kernel):
    chip = chip_for(dtype)
    mem = DeviceMemory(chip)
    x = special((5, 8), 5, (3,))                 # row 0 NaN
    x[2, 1] = INF                                # row 2 inf: inf*w of both signs -> NaN or inf
    w = torch.randn(6, 8, generator=torch.Generator().manual_seed(6))
    b = torch.randn(6)
    b[1], b[2], b[4] = INF, -INF, NAN            # bias epilogue: columns 1, 2, 4
    xd, wd, bd = dev(x, mem, dtype), dev(w, mem, dtype), dev(b, mem, dtype)
    (y,) = run(kernel, chip, {"x": xd, "w": wd, "bias": bd})
    ref = F.linear(as_f32(xd), as_f32(wd), as_f32(bd))
    ref = {"linear": ref, "linear_relu": F.relu(ref), "linear_gelu": gelu(ref)}[kernel]
    check(y, ref, dtype, kernel)


@pytest.mark.parametrize("dtype", DT)
def test_layernorm_linear(dtype):
    chip = chip_for(dtype)
    mem = DeviceMemory(chip)
    x = rows(8)                                   # NaN, inf, -inf rows: NaN through the norm
    w, b = torch.randn(5, 8), torch.randn(5)
    b[3] = -INF
    xd, wd, bd = dev(x, mem, dtype), dev(w, mem, dtype), dev(b, mem, dtype)
    (y,) = run("layernorm_linear", chip, {"x": xd, "w": wd, "bias": bd}, {"eps": 1e-5})
    ref = F.linear(F.layer_norm(as_f32(xd), (8,), eps=1e-5), as_f32(wd), as_f32(bd))
    check(y, ref, dtype, "layernorm_linear")


@pytest.mark.parametrize("dtype", DT)
def test_matmul_bmm(dtype):
    chip = chip_for(dtype)
    mem = DeviceMemory(chip)
    a, b = special((2, 4, 5), 7, (0, 11)), torch.randn(2, 5, 3)
    ad, bd = dev(a, mem, dtype), dev(b, mem, dtype)
    (c,) = run("bmm", chip, {"a": ad, "b": bd})
    check(c, torch.bmm(as_f32(ad), as_f32(bd)), dtype, "bmm")
    bias = torch.tensor([INF, 0.0, NAN])
    (c,) = run("matmul", chip, {"a": dev(a[0], mem, dtype), "b": dev(b[0], mem, dtype), "bias": dev(bias, mem, dtype)})
    check(c, as_f32(dev(a[0], mem, dtype)) @ as_f32(dev(b[0], mem, dtype)) + bias, dtype, "matmul + bias")


@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize("kernel", ["conv2d", "conv2d_relu", "conv2d_add_relu", "conv2d_bn_relu"])
def test_conv_epilogues(dtype, kernel):
    chip = chip_for(dtype)
    mem = DeviceMemory(chip)
    x = special((1, 2, 5, 5), 8, (6, 37))       # a NaN and a +inf: they spread over 3x3 windows
    w = torch.randn(3, 2, 3, 3, generator=torch.Generator().manual_seed(9))
    bias = torch.randn(3)
    xd, wd, bd = dev(x, mem, dtype), dev(w, mem, dtype), dev(bias, mem, dtype)
    ins = {"x": xd, "weight": wd, "bias": bd}
    ref = F.conv2d(as_f32(xd), as_f32(wd), as_f32(bd), padding=1)
    if kernel == "conv2d_bn_relu":
        g, beta, mean, var = torch.rand(3) + 0.5, torch.randn(3), torch.randn(3), torch.rand(3) + 0.1
        bn = {"bn_weight": g, "bn_bias": beta, "running_mean": mean, "running_var": var}
        ins.update({k: dev(t, mem, dtype) for k, t in bn.items()})
        ref = F.batch_norm(ref, *(as_f32(ins[k]) for k in ("running_mean", "running_var", "bn_weight", "bn_bias")))
    if kernel == "conv2d_add_relu":
        r = torch.randn(1, 3, 5, 5)
        r[0, 0, 4, 4], r[0, 1, 4, 0], r[0, 2, 0, 4] = INF, -INF, NAN
        ins["residual"] = dev(r, mem, dtype)
        ref = ref + as_f32(ins["residual"])
    if kernel != "conv2d":
        ref = F.relu(ref)
    (y,) = run(kernel, chip, ins, {"padding": 1})
    check(y, ref, dtype, kernel)


# ---------------------------------------------------------------- elementwise

def gelu(x):
    """torch's gelu in float64: its float32 vectorised path returns NaN for +inf (float64,
    float16 and the tanh form return inf, as the formula does); the kernels follow the formula."""
    return F.gelu(x.double()).to(x.dtype)


VALUES = torch.tensor([NAN, INF, -INF, 0.0, -0.0, 1.0, -1.0, 3.5, -3.5, 1e5, -1e5])
UNARY = {
    "relu": F.relu, "gelu": gelu, "silu": F.silu, "sigmoid": torch.sigmoid, "tanh": torch.tanh,
    "neg": torch.neg, "rsqrt": torch.rsqrt, "sin": torch.sin, "cos": torch.cos, "exp": torch.exp,
    "log": torch.log, "sqrt": torch.sqrt, "abs": torch.abs, "erf": torch.erf, "hardtanh": F.hardtanh,
    "hardswish": F.hardswish, "hardsigmoid": F.hardsigmoid, "reciprocal": torch.reciprocal,
}


@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary(dtype, name):
    chip = chip_for(dtype)
    mem = DeviceMemory(chip)
    xd = dev(VALUES, mem, dtype)
    (y,) = run(name, chip, {"a": xd})
    check(y, UNARY[name](as_f32(xd)), dtype, name)


BINARY = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "pow": torch.pow}


@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary(dtype, name):
    chip = chip_for(dtype)
    mem = DeviceMemory(chip)
    a, b = torch.meshgrid(VALUES, VALUES, indexing="ij")      # every pair of special values
    ad, bd = dev(a.contiguous(), mem, dtype), dev(b.contiguous(), mem, dtype)
    (y,) = run(name, chip, {"a": ad, "b": bd})
    check(y, BINARY[name](as_f32(ad), as_f32(bd)), dtype, name)


COMPARE = {"eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge}


@pytest.mark.parametrize("dtype", DT)
def test_compare_where(dtype):
    chip = chip_for(dtype)
    mem = DeviceMemory(chip)
    a, b = torch.meshgrid(VALUES, VALUES, indexing="ij")
    ad, bd = dev(a.contiguous(), mem, dtype), dev(b.contiguous(), mem, dtype)
    for name, fn in COMPARE.items():      # NaN compares unequal to everything, itself included
        (y,) = run(name, chip, {"a": ad, "b": bd})
        assert torch.equal(torch.from_numpy(y.to_numpy()), fn(as_f32(ad), as_f32(bd))), name
    cond = fn(as_f32(ad), as_f32(bd))
    (y,) = run("where", chip, {"cond": dev(cond, mem), "a": ad, "b": bd})
    check(y, torch.where(cond, as_f32(ad), as_f32(bd)), dtype, "where")


# ---------------------------------------------------------------- attention, cast, embedding

@pytest.mark.parametrize("dtype", DT)
def test_attention(dtype):
    chip = chip_for(dtype)
    mem = DeviceMemory(chip)
    g = torch.Generator().manual_seed(10)
    q, k, v = (torch.randn(1, 2, 5, 8, generator=g) for _ in range(3))
    q[0, 0, 1, 3] = NAN                          # one query row NaN
    v[0, 1, 2, 0] = INF                          # a value of +inf: every row attending to it
    mask = torch.zeros(5, 5)
    mask[3, :] = -INF                            # a fully masked row: torch returns NaN
    mask[4, 0] = -INF
    qd, kd, vd, md = (dev(t, mem, dtype) for t in (q, k, v, mask))
    (o,) = run("attention", chip, {"q": qd, "k": kd, "v": vd, "mask": md})
    ref = F.scaled_dot_product_attention(as_f32(qd), as_f32(kd), as_f32(vd), attn_mask=as_f32(md))
    check(o, ref, dtype, "attention")


@pytest.mark.parametrize("to", ["float16", "bfloat16", "float32"])
def test_cast(to):
    chip = chip_for("float32")
    mem = DeviceMemory(chip)
    xd = dev(VALUES, mem, "float32")
    (y,) = run("cast", chip, {"x": xd}, {"to": to})
    check(y, VALUES, to, f"cast -> {to}")


def test_embedding_copies_specials():
    chip = chip_for("float16")
    mem = DeviceMemory(chip)
    w = special((5, 4), 11, (1, 6, 19))
    wd = dev(w, mem, "float16")
    (y,) = run("embedding", chip, {"weight": wd, "indices": dev(torch.tensor([[4, 0], [1, 4]]), mem)})
    check(y, F.embedding(torch.tensor([[4, 0], [1, 4]]), as_f32(wd)), "float16", "embedding")


# ---------------------------------------------------------------- group norm, scan, pad, index

@pytest.mark.parametrize("dtype", DT)
def test_group_norm(dtype):
    chip = chip_for(dtype)
    mem = DeviceMemory(chip)
    x = special((2, 4, 3, 3), 12, (4, 40, 70))       # a NaN, +inf, -inf in three different groups
    w, b = torch.rand(4) + 0.5, torch.randn(4)
    xd, wd, bd = dev(x, mem, dtype), dev(w, mem, dtype), dev(b, mem, dtype)
    (y, *_) = run("group_norm", chip, {"x": xd, "weight": wd, "bias": bd}, {"groups": 2, "eps": 1e-5})
    check(y, F.group_norm(as_f32(xd), 2, as_f32(wd), as_f32(bd), 1e-5), dtype, "group_norm")


@pytest.mark.parametrize("dtype", DT)
def test_cumsum(dtype):
    chip = chip_for(dtype)
    mem = DeviceMemory(chip)
    x = rows(6)                                       # NaN onward NaN; inf then -inf: NaN
    xd = dev(x, mem, dtype)
    (y,) = run("cumsum", chip, {"x": xd}, {"dim": -1})
    check(y, torch.cumsum(as_f32(xd), -1), dtype, "cumsum")


def test_pad_and_index_copy_specials():
    chip = chip_for("float16")
    mem = DeviceMemory(chip)
    xd = dev(special((3, 4), 13, (1, 6, 11)), mem, "float16")
    (y,) = run("constant_pad", chip, {"x": xd}, {"pad": (1, 1), "value": float("-inf")})
    check(y, F.pad(as_f32(xd), (1, 1), value=-INF), "float16", "constant_pad")
    idx = torch.tensor([2, 0, 2])
    (y,) = run("index_select", chip, {"x": xd, "index": dev(idx, mem)}, {"dim": 0})
    check(y, torch.index_select(as_f32(xd), 0, idx), "float16", "index_select")
