"""Elementwise breadth vs torch: unary math, hard activations, comparisons and logical ops
(bool results), integer index math, fill and masked_fill, over special values (nan, +-inf,
-0), empty tensors and permuted (non-contiguous) layouts.

Tolerances are the per-dtype ones of tolerances.py (one RNE rounding on store; the math
itself is float64 libm or the float32 helpers of mathfn.py); integer, bool and comparison
results are exact."""
import pytest
import torch
import torch.nn.functional as F

from torchfl.kernels import DeviceMemory, KernelError
from torchfl.kernels.catalog import CATALOG

from .helpers import as_f32, assert_close, chip_for, dev, run_checked

DT = ["float32", "float16", "bfloat16"]
SPECIAL = torch.tensor([0.0, -0.0, 1.0, -1.0, 2.5, -3.5, 7.0, -7.0, float("inf"), float("-inf"), float("nan"),
                        1e-3, 100.0])

UNARY = {
    "sin": (torch.sin, {}), "cos": (torch.cos, {}), "exp": (torch.exp, {}), "log": (torch.log, {}),
    "sqrt": (torch.sqrt, {}), "abs": (torch.abs, {}), "erf": (torch.erf, {}), "reciprocal": (torch.reciprocal, {}),
    "hardswish": (F.hardswish, {}), "hardsigmoid": (F.hardsigmoid, {}),
    "hardtanh": (F.hardtanh, {}),
    "relu6": (F.relu6, {"min_val": 0.0, "max_val": 6.0}),
    "clamp_min": (lambda x: torch.clamp(x, min=-0.5), {"min_val": -0.5, "max_val": None}),
}


def _values(shape, g):
    x = torch.randn(*shape, generator=g) * 4
    flat = x.reshape(-1)
    k = min(flat.numel(), SPECIAL.numel())
    flat[:k] = SPECIAL[:k]
    return x


@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize("name", list(UNARY))
@pytest.mark.parametrize("shape,layout", [((2, 3, 4, 5), "NHWC"), ((37,), None), ((0, 3), None)])
def test_unary_math_and_hard_activations(dtype, name, shape, layout):
    ref_fn, attrs = UNARY[name]
    kernel = "hardtanh" if name in ("relu6", "clamp_min") else name
    chip = chip_for(dtype, 4 << 10)   # a small cache: several tiles
    mem = DeviceMemory(chip)
    x = dev(_values(shape, torch.Generator().manual_seed(2)), mem, dtype, layout)
    (y,), _ = run_checked(kernel, chip, {"a": x}, attrs)
    assert y.layout == x.layout
    assert_close(as_f32(y), ref_fn(as_f32(x)), dtype, what=name)


CMP = {"eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge}


@pytest.mark.parametrize("dtype", DT + ["int64", "int32", "bool"])
@pytest.mark.parametrize("name", list(CMP))
def test_comparisons_give_bool_exactly(dtype, name):
    chip = chip_for("float32")
    mem = DeviceMemory(chip)
    g = torch.Generator().manual_seed(3)
    if dtype in ("int64", "int32"):
        a = torch.randint(-3, 3, (3, 1, 5), generator=g).to(getattr(torch, dtype))
        b = torch.randint(-3, 3, (4, 5), generator=g).to(getattr(torch, dtype))
        scalar = 1
    elif dtype == "bool":
        a = torch.randint(0, 2, (3, 1, 5), generator=g).bool()
        b = torch.randint(0, 2, (4, 5), generator=g).bool()
        scalar = 1
    else:
        a = torch.cat([SPECIAL, SPECIAL[:2]]).reshape(3, 1, 5)
        b = torch.cat([SPECIAL.flip(0), SPECIAL[:7]]).reshape(4, 5)
        scalar = 1.0
    da, db = dev(a, mem, dtype), dev(b, mem, dtype)
    (y,), _ = run_checked(name, chip, {"a": da, "b": db})
    assert y.dtype == "bool"
    ta, tb = as_f32(da), as_f32(db)
    assert torch.equal(as_f32(y), CMP[name](ta, tb))
    (y,), _ = run_checked(name, chip, {"a": da}, {"scalar": scalar})
    assert torch.equal(as_f32(y), CMP[name](ta, scalar))


@pytest.mark.parametrize("dtype", ["bool", "int64", "float16"])
def test_logical_ops(dtype):
    chip = chip_for("float32")
    mem = DeviceMemory(chip)
    g = torch.Generator().manual_seed(4)
    a = torch.randint(0, 2, (2, 1, 6), generator=g)
    b = torch.randint(0, 2, (3, 6), generator=g)
    if dtype == "float16":
        a = a.float() * float("nan")   # nan is true, 0*nan is nan: use where to keep zeros
        a = torch.where(torch.randint(0, 2, (2, 1, 6), generator=g).bool(), a, torch.zeros(()))
        b = b.float()
    da, db = dev(a.to(getattr(torch, dtype)), mem, dtype), dev(b.to(getattr(torch, dtype)), mem, dtype)
    ta, tb = torch.from_numpy(da.to_numpy()), torch.from_numpy(db.to_numpy())
    for name, ref in (("logical_and", torch.logical_and), ("logical_or", torch.logical_or)):
        (y,), _ = run_checked(name, chip, {"a": da, "b": db})
        assert torch.equal(as_f32(y), ref(ta, tb)), name
    (y,), _ = run_checked("logical_not", chip, {"a": da})
    assert torch.equal(as_f32(y), torch.logical_not(ta))


@pytest.mark.parametrize("dtype", ["int64", "int32"])
def test_integer_index_math_is_exact(dtype):
    """Position ids as transformers builds them: (cumsum(mask) * mask) + padding_idx, with
    values beyond float32's 2^24 exactly kept."""
    chip = chip_for("float32", 4 << 10)
    mem = DeviceMemory(chip)
    g = torch.Generator().manual_seed(5)
    hi = 100 if dtype == "int8" else (1 << 30)
    tdt = getattr(torch, dtype)
    a = torch.randint(-hi, hi, (3, 40), generator=g).to(tdt)
    b = torch.randint(-10, 10, (40,), generator=g).to(tdt)
    if dtype == "int8":
        a, b = a // 2, b
    da, db = dev(a, mem, dtype), dev(b, mem, dtype)
    for name, ref in (("add", a + b), ("sub", a - b), ("mul", a * b)):
        (y,), _ = run_checked(name, chip, {"a": da, "b": db})
        assert y.dtype == dtype
        assert torch.equal(torch.from_numpy(y.to_numpy()), ref), name
    (y,), _ = run_checked("add", chip, {"a": da}, {"scalar": 3})
    assert torch.equal(torch.from_numpy(y.to_numpy()), a + 3)
    (y,), _ = run_checked("neg", chip, {"a": da})
    assert torch.equal(torch.from_numpy(y.to_numpy()), -a)


def test_integer_op_with_a_fractional_scalar_is_refused():
    chip = chip_for("float32")
    mem = DeviceMemory(chip)
    with pytest.raises(KernelError, match="not an integer.*cast the input to a float"):
        CATALOG["mul"].run(chip, {"a": dev(torch.arange(4), mem, "int64")}, {"scalar": 0.5})
    with pytest.raises(KernelError, match="does not compute in int64"):
        CATALOG["sin"].run(chip, {"a": dev(torch.arange(4), mem, "int64")})


@pytest.mark.parametrize("to,value", [(None, 0.0), ("float16", 1.0), ("bool", 1.0), ("int64", -7.0),
                                      ("float32", float("-inf"))])
def test_fill_reads_nothing(to, value):
    chip = chip_for("float32")
    mem = DeviceMemory(chip)
    x = dev(torch.randn(2, 3, 4, 5), mem, "float16", "NHWC")
    (y,), plan = run_checked("fill", chip, {"a": x}, {"scalar": value, "to": to})
    assert plan.traffic.bytes_read == 0
    want = torch.full((2, 3, 4, 5), value, dtype=getattr(torch, to or "float16"))
    assert torch.equal(y.to_torch(), want)


@pytest.mark.parametrize("dtype", ["float16", "float32", "int64", "bool"])
def test_masked_fill_and_where_scalar(dtype):
    chip = chip_for("float32")
    mem = DeviceMemory(chip)
    g = torch.Generator().manual_seed(6)
    a = torch.randint(-5, 5, (2, 3, 4), generator=g).to(getattr(torch, dtype))
    if dtype.startswith("float"):
        a = a.float().masked_fill(a == 0, float("nan")).to(getattr(torch, dtype))
    mask = torch.randint(0, 2, (2, 1, 4), generator=g).bool()
    value = 1 if dtype == "bool" else (-3 if dtype == "int64" else float("-inf"))
    da, dm = dev(a, mem, dtype), dev(mask, mem)
    (y,), _ = run_checked("masked_fill", chip, {"a": da, "mask": dm}, {"scalar": value})
    ref = a.masked_fill(mask, value)
    got = y.to_torch()
    torch.testing.assert_close(got, ref, equal_nan=True, rtol=0, atol=0)
    (y,), _ = run_checked("masked_fill", chip, {"a": da, "mask": dm}, {"scalar": value, "fill_if": False})
    got = y.to_torch()
    torch.testing.assert_close(got, torch.where(mask, a, torch.tensor(value, dtype=a.dtype)), equal_nan=True,
                               rtol=0, atol=0)


def test_int_where_with_broadcast_condition():
    chip = chip_for("float32")
    mem = DeviceMemory(chip)
    g = torch.Generator().manual_seed(7)
    c = torch.randint(0, 2, (1, 5), generator=g).bool()
    a = torch.randint(0, 1 << 40, (3, 5), generator=g)
    b = torch.randint(0, 1 << 40, (3, 1), generator=g)
    (y,), _ = run_checked("where", chip, {"cond": dev(c, mem), "a": dev(a, mem, "int64"), "b": dev(b, mem, "int64")})
    assert torch.equal(torch.from_numpy(y.to_numpy()), torch.where(c, a, b))


MINMAX = {"minimum": torch.minimum, "maximum": torch.maximum}


@pytest.mark.parametrize("dtype", DT + ["int64", "int32"])
@pytest.mark.parametrize("name", list(MINMAX))
def test_minimum_maximum_propagate_nan_and_broadcast(dtype, name):
    """torch.minimum / maximum: nan in either operand gives nan (unlike min/max of Python), a
    tie gives the first operand (0.0 vs -0.0), operands broadcast; integers exact. Float
    results are one of the inputs: exact, no rounding (tolerance 0)."""
    chip = chip_for("float32", 4 << 10)
    mem = DeviceMemory(chip)
    g = torch.Generator().manual_seed(6)
    if dtype in ("int64", "int32"):
        a = torch.randint(-(1 << 30), 1 << 30, (3, 1, 40), generator=g).to(getattr(torch, dtype))
        b = torch.randint(-(1 << 30), 1 << 30, (4, 40), generator=g).to(getattr(torch, dtype))
    else:
        a = _values((3, 1, 40), g)
        b = _values((4, 40), g).flip(-1)
    da, db = dev(a, mem, dtype), dev(b, mem, dtype)
    (y,), _ = run_checked(name, chip, {"a": da, "b": db})
    assert y.dtype == dtype and y.shape == (3, 4, 40)
    ref = MINMAX[name](torch.from_numpy(da.to_numpy()) if dtype in ("int64", "int32") else as_f32(da),
                       torch.from_numpy(db.to_numpy()) if dtype in ("int64", "int32") else as_f32(db))
    got = torch.from_numpy(y.to_numpy()) if dtype in ("int64", "int32") else as_f32(y)
    assert torch.equal(got.isnan(), ref.isnan())
    assert torch.equal(torch.nan_to_num(got), torch.nan_to_num(ref))
    if dtype not in ("int64", "int32"):
        num = ~ref.isnan()                          # a nan's sign bit is not specified
        assert torch.equal(torch.signbit(got)[num], torch.signbit(ref)[num])
        za, zb = torch.tensor([0.0, -0.0, float("nan"), 1.0]), torch.tensor([-0.0, 0.0, 1.0, float("nan")])
        (z,), _ = run_checked(name, chip, {"a": dev(za, mem, dtype), "b": dev(zb, mem, dtype)})
        assert torch.signbit(as_f32(z))[:2].tolist() == [False, True]      # a tie keeps the first operand's zero
        assert as_f32(z)[2:].isnan().all()


@pytest.mark.parametrize("name", list(MINMAX))
def test_minimum_maximum_on_a_permuted_layout_and_empty(name):
    chip = chip_for("float16", 4 << 10)
    mem = DeviceMemory(chip)
    g = torch.Generator().manual_seed(7)
    a, b = _values((2, 3, 4, 5), g), _values((2, 3, 4, 5), g).flip(0)
    da, db = dev(a, mem, "float16", "NHWC"), dev(b, mem, "float16", "NHWC")
    (y,), _ = run_checked(name, chip, {"a": da, "b": db})
    assert y.layout == da.layout
    ref = MINMAX[name](as_f32(da), as_f32(db))
    assert torch.equal(torch.nan_to_num(as_f32(y)), torch.nan_to_num(ref))
    (e,), _ = run_checked(name, chip, {"a": dev(torch.zeros(0, 3), mem, "float16"), "b": dev(torch.zeros(3), mem, "float16")})
    assert e.shape == (0, 3)
