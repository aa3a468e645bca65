"""Tasks called through their address (``kernels/taskcall.py``) are compiled once, never linked
into their parallel callers: linked, a task's body is optimised and code-generated again in the
caller's gufunc library and in the caller's own (attention's parallel K/V pre-pack linked its
per-head body and row decoder: 1.7 s more compile CPU on a BERT layer's first call; the GEMM's
per-thread tile body inside its prange loop cost 2.9 s more; both weight-stationary convs linked the
block loop ``_mm_store``: 4.9 s more on ResNet-50's). Here each
caller, compiled fresh, must not name its task at all in its LLVM IR."""
import textwrap

from .helpers import run_fresh_cache

SCRIPT = textwrap.dedent("""
    import torch
    import torchfl.kernels.threads as threads
    from torchfl.kernels import DeviceMemory
    from tests.kernels.helpers import chip_for, dev, run_checked, run_weight_stationary_convs

    threads.SMALL_FLOPS = 0
    chip = chip_for("float16")
    mem = DeviceMemory(chip)
    f16 = lambda *s: dev(torch.randn(*s), mem, "float16")
    run_checked("attention", chip, {"q": f16(1, 2, 40, 16), "k": f16(1, 2, 40, 16), "v": f16(1, 2, 40, 16)},
                {"causal": False})
    run_checked("linear_gelu", chip, {"x": f16(97, 61), "w": f16(300, 61), "bias": f16(300)})
    run_weight_stationary_convs(chip)                 # one tile, many tiles

    from torchfl.kernels import gemm
    from torchfl.kernels.attention import impl
    from torchfl.kernels.conv import fused

    def mangled(fn):
        mod = fn.__module__.rsplit(".", 1)[-1]
        return f"{len(mod)}{mod}{len(fn.__name__)}{fn.__name__}"

    PAIRS = [(impl._prepack, [impl._prepack_head, impl._decode_row]),
             (impl._attend, [impl._attend_task, impl._decode_row]),
             (gemm._tile, [gemm._tile_task, gemm._epilogue_row]),
             (fused.conv_tile_fused, [fused._mm_store]),
             (fused.conv_tiles, [fused._mm_store])]
    for caller, tasks in PAIRS:
        assert caller.signatures, f"{caller.__name__} did not compile here"
        text = "".join(caller.inspect_llvm(sig) for sig in caller.signatures)
        named = sorted({t.__name__ for t in tasks if mangled(t.py_func) in text})
        print("CALLER", caller.__name__, "NAMES", named)
""")


def test_tasks_called_by_address_are_not_linked_into_their_callers(tmp_path):
    out = run_fresh_cache(SCRIPT, tmp_path, timeout=900)
    callers = [line for line in out.splitlines() if line.startswith("CALLER")]
    assert len(callers) == 5, out
    assert all(line.endswith("NAMES []") for line in callers), "\n".join(callers)
