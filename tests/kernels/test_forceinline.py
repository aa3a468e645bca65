"""Helpers inlined by LLVM (``forceinline=True``), not by Numba: compiled once, no call left.

Numba's ``inline="always"`` copies a helper's IR into every call site and types it there again:
``conv.fused._mm_store`` spent 6 s of its 10 s compile in that pass (its epilogue, the epilogue's
three scatters, each scatter's run checks), ``gemv.gemv_nk`` 5 s, ``gemm._epilogue_row`` 1.9 s of 2.5
(GELU twice, encode16 twice), attention's task 1.5 s (exp32 twice, encode16); encode16 (``codecs.enc16``)
in a conv epilogue, pool, reduction and GEMV store, 0.6-1.2 s a caller (ResNet-50's first call -4.9 s of
compile CPU). With ``forceinline=True`` the
helper is compiled once per signature and marked ``alwaysinline`` for LLVM, which inlines it at
every call site all the same (a call left in a block loop costs ~100 cycles: the comment at
``conv.pointwise._store_rows``). Here each caller, compiled fresh, must hold no call to its
helpers, and the helpers must have been compiled as functions of their own (not IR-copied)."""
import textwrap

from .helpers import run_fresh_cache

SCRIPT = textwrap.dedent("""
    import re
    import torch
    import torchfl.kernels.threads as threads
    from torchfl.kernels import DeviceMemory
    from tests.kernels.helpers import chip_for, dev, run_checked

    threads.SMALL_FLOPS = 0
    chip = chip_for("float16")
    mem = DeviceMemory(chip)
    f16 = lambda *s: dev(torch.randn(*s), mem, "float16")
    bn = {"bn_weight": f16(16), "bn_bias": f16(16), "running_mean": f16(16), "running_var": dev(torch.rand(16) + 0.5, mem, "float16")}
    run_checked("conv2d_bn_relu", chip, {"x": f16(1, 8, 12, 12), "weight": f16(16, 8, 3, 3), **bn}, {"padding": (1, 1)})
    run_checked("conv2d_bn_relu", chip, {"x": f16(1, 32, 12, 12), "weight": f16(16, 32, 1, 1), **bn})     # 1x1: rows path
    run_checked("linear_gelu", chip, {"x": f16(1, 61), "w": f16(300, 61), "bias": f16(300)})              # one row: gemv
    run_checked("linear_gelu", chip, {"x": f16(16, 61), "w": f16(300, 61), "bias": f16(300)})             # rows: the tiled GEMM
    run_checked("avg_pool2d", chip, {"x": f16(1, 8, 16, 16)}, {"kernel_size": 3, "stride": 2, "padding": 1})
    run_checked("layer_norm", chip, {"x": f16(4, 128), "weight": f16(128), "bias": f16(128)}, {"normalized_shape": (128,)})
    run_checked("layer_norm", chip, {"x": dev(torch.randn(4, 5, 32), mem, "float16", "CLN"), "weight": f16(32), "bias": f16(32)},
                {"normalized_shape": (32,)})   # strided rows: the general task, with _load/_store
    run_checked("attention", chip, {"q": f16(1, 2, 40, 16), "k": f16(1, 2, 40, 16), "v": f16(1, 2, 40, 16)})

    from torchfl.kernels import codecs, gemm, gemv
    from torchfl.kernels.attention import impl as attention
    from torchfl.kernels.conv import fused, pointwise, tiles
    from torchfl.kernels.norm import bodies
    from torchfl.kernels.pool import impl as pool

    def calls(disp):
        text = "".join(disp.inspect_llvm(sig) for sig in disp.signatures)
        return [line for line in text.splitlines() if re.search(r"\\bcall\\b", line)]

    def mangled(fn):
        mod = fn.__module__.rsplit(".", 1)[-1]
        return f"{len(mod)}{mod}{len(fn.__name__)}{fn.__name__}"

    PAIRS = [(fused._mm_store, [fused._epilogue_store, fused._scatter, fused._run6, codecs.enc16]),
             (pointwise._rows_chunk, [pointwise._store_rows, tiles._dec, codecs.enc16]),
             (gemv.gemv_nk, [gemv._store, codecs.enc16]),
             (bodies._normalize_task, [bodies._load, bodies._store]),
             (gemm._epilogue_row, [gemm._gelu_erf, gemm._gelu_tanh, codecs.enc16]),
             (attention._attend_task, [attention._exp, codecs.enc16])]
    for caller, helpers in PAIRS:
        assert caller.signatures, f"{caller.__name__} did not compile here"
        left = [line.strip()[:160] for line in calls(caller) for h in helpers if mangled(h.py_func) in line]
        print("CALLER", caller.__name__, "LEFT", left)
        for h in helpers:
            print("HELPER", h.__name__, h.targetoptions.get("forceinline"), len(h.signatures))
    inlined = (pool._win, pool._avg_window)
    pool_callers = [d for d in vars(pool).values() if hasattr(d, "signatures") and d.signatures and d not in inlined]
    left = [c.__name__ for c in pool_callers for line in calls(c) for h in inlined if mangled(h.py_func) in line]
    print("CALLER pool LEFT", left)
    for h in inlined:
        print("HELPER", h.__name__, h.targetoptions.get("forceinline"), len(h.signatures))
""")


def test_llvm_inlined_helpers_compile_once_and_leave_no_call(tmp_path):
    out = run_fresh_cache(SCRIPT, tmp_path, timeout=900)
    lines = out.splitlines()
    callers = [line for line in lines if line.startswith("CALLER")]
    helpers = [line.split() for line in lines if line.startswith("HELPER")]
    assert len(callers) == 7 and len(helpers) == 18, out
    assert all(line.endswith("LEFT []") for line in callers), "\n".join(callers)
    # forceinline, and compiled as a function of its own (a Numba-IR-inlined helper has no signatures)
    assert all(h[2] == "True" and int(h[3]) >= 1 for h in helpers), "\n".join(map(" ".join, helpers))
