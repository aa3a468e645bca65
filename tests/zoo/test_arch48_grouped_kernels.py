"""The grouped GEMM (kernels/grouped: grouped_mm) against the loop it replaces (transformers'
``grouped_mm_fallback``: one torch.mm per expert on its rows, zeros elsewhere) on the same
rounded inputs: float32 / float16 / bfloat16, int32 and int64 offsets, experts with no token,
rows past the last offset, a weight stored transposed (Mixtral's ``gate_up_proj`` is
[E, N, K]: the graph passes a permuted view), NaN and inf carried, empty x; resident-size and
small caches. The plan is priced at the routing's worst case (its notes give the range): the
count equals it for that routing and stays below it for any other.

Tolerance: float32 1e-5 relative to the largest |output| (BLAS's summation order against
torch's); float16 / bfloat16 one rounding of the float32 sum: 1e-3 / 8e-3 of the largest |output|."""
import pytest
import torch

from tests.kernels.helpers import dev
from torchfl.kernels import ChipModel, DeviceMemory, KernelError
from torchfl.kernels.catalog import get

TOL = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 8e-3}


def loop_reference(x, w, offs):
    """transformers.integrations.moe._grouped_mm_fallback, in float32."""
    out = torch.zeros(x.shape[0], w.shape[2])
    start = 0
    for i, end in enumerate(offs.tolist()):
        if end > start:
            out[start:end] = x[start:end].float() @ w[i].float()
        start = end
    return out


def run(chip, x, w, offs, w_layout=None):
    spec = get("grouped_mm")
    mem = DeviceMemory(chip)
    ins = {"x": dev(x, mem), "w": dev(w, mem, layout=w_layout), "offs": dev(offs, mem)}
    prob = spec.problem({k: v.shape for k, v in ins.items()}, {}, None, {k: v.layout for k, v in ins.items()},
                        {k: v.dtype for k, v in ins.items()})
    plan = spec.tile(prob, chip)
    assert plan.on_chip_bytes <= chip.cache_bytes
    (y,), counted = spec.run(chip, ins, {}, plan=plan)
    return y.to_torch().float(), plan, counted


def _close(y, ref, dtype):
    scale = max(1.0, ref.abs().max().item())
    assert (y - ref).abs().max().item() <= TOL[dtype] * scale


@pytest.mark.parametrize("cache", (8 << 20, 6 << 10))
@pytest.mark.parametrize("dtype", (torch.float32, torch.float16, torch.bfloat16))
@pytest.mark.parametrize("ids", (torch.int32, torch.int64))
def test_matches_the_per_expert_loop(cache, dtype, ids):
    g = torch.Generator().manual_seed(0)
    S, K, N, E = 40, 24, 36, 5
    x = torch.randn(S, K, generator=g).to(dtype)
    w = torch.randn(E, K, N, generator=g).to(dtype)
    offs = torch.tensor([7, 7, 30, 30, 37], dtype=ids)       # experts 1 and 3 idle; rows 37.. unrouted
    y, plan, counted = run(ChipModel(cache_bytes=cache), x, w, offs)
    ref = loop_reference(x, w, offs)
    _close(y, ref, dtype)
    assert torch.equal(y[37:], torch.zeros(3, N))
    assert counted.bytes_read <= plan.traffic.bytes_read and counted.bytes_written == plan.traffic.bytes_written
    assert plan.config.tile("weight_passes_min") <= plan.config.tile("weight_passes_max")
    assert "tokens per expert" in plan.config.notes and ".." in plan.config.notes


@pytest.mark.parametrize("cache", (8 << 20, 6 << 10))
def test_worst_routing_counts_the_plan(cache):
    """Every expert busy, one token each and the rest in whole row tiles: the bound is reached."""
    chip = ChipModel(cache_bytes=cache)
    S, K, N, E = 48, 16, 32, 4
    spec = get("grouped_mm")
    plan = spec.tile(spec.problem({"x": (S, K), "w": (E, K, N), "offs": (E,)}, {}, None, {},
                                  {"x": "float16", "w": "float16", "offs": "int32"}), chip)
    tm = plan.config.tile("m")
    counts = [1] * E
    counts[0] += S - E                        # whole row tiles on expert 0 when (S - E) % tm == 0 ...
    rest = (S - E) % tm                       # ... else the remainder rides on an idle-free expert
    counts[0] -= rest
    counts[1] += rest
    offs = torch.tensor(counts, dtype=torch.int32).cumsum(0).to(torch.int32)
    x, w = torch.randn(S, K).half(), torch.randn(E, K, N).half()
    y, plan2, counted = run(chip, x, w, offs)
    _close(y, loop_reference(x, w, offs), torch.float16)
    lo, hi = plan.config.tile("weight_passes_min"), plan.config.tile("weight_passes_max")
    passes = sum(-(-c // tm) for c in counts)
    assert lo <= passes <= hi
    if passes == hi:
        assert counted == plan.traffic
    else:
        assert counted.bytes < plan.traffic.bytes


def test_transposed_weight_nan_inf_and_decode_step():
    """Mixtral's experts keep gate_up_proj as [E, 2I, H]; the graph multiplies by its transpose.
    A decode step (2 tokens, top-2 of 8 experts): each active expert's weight read once."""
    chip = ChipModel()
    g = torch.Generator().manual_seed(3)
    E, K, N = 8, 32, 48
    stored = torch.randn(E, N, K, generator=g).half()
    w = stored.transpose(1, 2)                                  # logical [E, K, N], a permuted view
    x = torch.randn(2, K, generator=g).half()
    x[0, 3] = float("nan")
    offs = torch.tensor([0, 0, 1, 1, 1, 2, 2, 2], dtype=torch.int32)
    y, plan, counted = run(chip, x, w, offs, w_layout=(0, 2, 1))
    ref = loop_reference(x, w, offs)
    assert torch.isnan(y[0]).all() and torch.isnan(ref[0]).all()
    _close(y[1:], ref[1:], torch.float16)
    assert counted.bytes_read == 8 * 4 + 2 * K * N * 2 + 2 * K * 2 * -(-N // plan.config.tile("n"))
    assert plan.config.tile("weight_passes_max") == 2          # at most 2 experts can be active


def test_permuted_weight_layout():
    chip = ChipModel()
    E, K, N = 3, 8, 12
    stored = torch.randn(E, N, K)
    w = stored.transpose(1, 2)
    x, offs = torch.randn(6, K), torch.tensor([2, 4, 6])
    y, _, _ = run(chip, x, w, offs, w_layout=(0, 2, 1))
    _close(y, loop_reference(x, w, offs), torch.float32)


def test_empty_and_refusals():
    chip = ChipModel()
    y, plan, counted = run(chip, torch.zeros(0, 4), torch.randn(3, 4, 5), torch.zeros(3, dtype=torch.int32))
    assert y.shape == (0, 5) and counted == plan.traffic
    with pytest.raises(KernelError, match="non-decreasing"):
        run(chip, torch.randn(4, 4), torch.randn(2, 4, 5), torch.tensor([3, 2], dtype=torch.int32))
    with pytest.raises(KernelError, match="within the 4 rows"):
        run(chip, torch.randn(4, 4), torch.randn(2, 4, 5), torch.tensor([3, 9], dtype=torch.int32))
    spec = get("grouped_mm")
    with pytest.raises(KernelError, match="offs has 3 entries for 2 experts"):
        spec.problem({"x": (4, 4), "w": (2, 4, 5), "offs": (3,)}, {}, None, {},
                     {"x": "float32", "w": "float32", "offs": "int32"})
    with pytest.raises(KernelError, match="insert a cast"):
        spec.problem({"x": (4, 4), "w": (2, 4, 5), "offs": (2,)}, {}, None, {},
                     {"x": "float32", "w": "float16", "offs": "int32"})


def test_weight_stored_n_by_k():
    """``w_nk``: the weight given as stored [E, N, K] and used transposed, read in place."""
    spec = get("grouped_mm")
    chip = ChipModel(cache_bytes=6 << 10)
    mem = DeviceMemory(chip)
    E, K, N = 3, 16, 24
    stored, x, offs = torch.randn(E, N, K), torch.randn(9, K), torch.tensor([4, 4, 9])
    ins = {"x": dev(x, mem), "w": dev(stored, mem), "offs": dev(offs, mem)}
    (y,), counted = spec.run(chip, ins, {"w_nk": True})
    _close(y.to_torch(), loop_reference(x, stored.transpose(1, 2), offs), torch.float32)
    plan = spec.tile(spec.problem({k: v.shape for k, v in ins.items()}, {"w_nk": True}, None, {},
                                  {k: v.dtype for k, v in ins.items()}), chip)
    assert counted.bytes <= plan.traffic.bytes


def test_torch_operator_is_the_loop():
    """torch.ops.torchfl.grouped_mm (what core's decomposition makes of aten._grouped_mm): its
    CPU body is transformers' loop, its fake kernel any float dtype's shape."""
    from torchfl.kernels.grouped.torchop import register

    register()
    x, w, offs = torch.randn(7, 5).half(), torch.randn(3, 5, 4).half(), torch.tensor([2, 2, 6], dtype=torch.int32)
    got = torch.ops.torchfl.grouped_mm(x, w, offs)
    assert got.dtype == torch.float16 and torch.equal(got[6:], torch.zeros(1, 4, dtype=torch.float16))
    _close(got.float(), loop_reference(x, w, offs), torch.float16)
    meta = torch.ops.torchfl.grouped_mm(x.to("meta"), w.to("meta"), offs.to("meta"))
    assert meta.shape == (7, 4) and meta.dtype == torch.float16


def test_torchfl_operator_resolves_when_the_catalog_loaded_before_torch():
    """A process that loads the kernel catalog before torch (a rule query, then a plan) found no
    ``torch.ops.torchfl.grouped_mm``: the decomposition's part op stopped the plan with "not an
    ATen overload". The planner registers torchfl's own operators when it resolves one."""
    import subprocess
    import sys

    code = ("import sys\nimport torchfl.kernels.catalog, torchfl.kernels.grouped\n"
            "from torchfl.planner.decompose import _overload\n"
            "print(_overload('torchfl.grouped_mm.default'))\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip() == "torchfl.grouped_mm.default"
