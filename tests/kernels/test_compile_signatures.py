"""No kernel function is compiled twice for one meaning.

Numba compiles a callee once per argument-type signature. Two signatures that differ only
by an integer's spelling -- a literal (``Literal[int](0)``: a constant passed from jitted
code) against ``int64``, or the ``uint64`` a parallel loop gives its prange index against
the ``int64`` that typing saw -- are the same machine code compiled twice: seconds of a
user's first call each (FINDINGS: kernel compile time dominates a cold first call). Here
the GEMM (tiled and few-row), attention (tiled and decode) and both weight-stationary conv paths run with their parallel paths
forced, in a fresh process with an empty Numba cache (a function loaded from the cache
never compiles its callees, so only a cold run shows them), then every compiled torchfl
kernel function is checked."""
import textwrap

from .helpers import run_fresh_cache

SCRIPT = textwrap.dedent("""
    import gc, re
    import torch
    from numba.core.registry import CPUDispatcher
    import torchfl.kernels.threads as threads
    from torchfl.kernels import DeviceMemory
    from tests.kernels.helpers import chip_for, dev, run_checked, run_weight_stationary_convs

    threads.SMALL_FLOPS = 0
    chip = chip_for("float16")
    mem = DeviceMemory(chip)
    f16 = lambda *s: dev(torch.randn(*s), mem, "float16")
    run_checked("linear_gelu", chip, {"x": f16(97, 61), "w": f16(300, 61), "bias": f16(300)})
    run_checked("attention", chip, {"q": f16(1, 2, 40, 16), "k": f16(1, 2, 40, 16), "v": f16(1, 2, 40, 16)})
    run_checked("linear", chip, {"x": f16(1, 61), "w": f16(300, 61), "bias": f16(300)})          # few rows: gemv
    run_checked("attention", chip, {"q": f16(1, 4, 1, 16), "k": f16(1, 2, 40, 16), "v": f16(1, 2, 40, 16)})  # decode
    run_weight_stationary_convs(chip)                 # one tile, many tiles
    import torchfl.kernels.elementwise.split as ew_split
    import torchfl.kernels.layout.split as lay_split
    for split in (False, True):     # the tile loops, then the host's one-region splits (issue 38)
        ew_split.PAR_BYTES = lay_split.PAR_BYTES = 0 if split else 1 << 62
        run_checked("add", chip, {"a": f16(3, 40, 16), "b": f16(3, 40, 16)})
        run_checked("gelu", chip, {"a": f16(3, 40, 16)})
        run_checked("layout_transform", chip, {"x": f16(1, 40, 2, 16)}, {"layout": [0, 2, 1, 3]})
        run_checked("copy", chip, {"x": f16(3, 40, 16)})
    run_checked("layer_norm", chip, {"x": f16(1, 40, 16), "weight": f16(16), "bias": f16(16)},
                {"normalized_shape": [16], "eps": 1e-5})
    from numba import get_num_threads
    assert ew_split._part.signatures or get_num_threads() == 1, "the elementwise split ran"
    assert lay_split._gather_parts.signatures or get_num_threads() == 1, "the layout split ran"
    from torchfl.kernels.attention import impl as attention_impl
    from torchfl.kernels.conv import fused as conv_fused
    assert conv_fused.conv_tile_fused.signatures and conv_fused.conv_tiles.signatures, "both conv paths ran"
    assert attention_impl._attend_task.signatures, "compiled, not loaded from a cache"

    def canonical(sig):   # every integer spelled int64: what one compile would serve
        return tuple(re.sub(r"^(Literal\\[int\\]\\(-?\\d+\\)|u?int(8|16|32|64))$", "int64", str(t)) for t in sig)

    n = 0
    for o in gc.get_objects():
        if isinstance(o, CPUDispatcher) and o.py_func.__module__.startswith("torchfl.kernels"):
            n += 1
            seen = {}
            for sig in o.signatures:
                key = canonical(sig)
                if key in seen:
                    print("DUPLICATE", o.py_func.__module__ + "." + o.py_func.__name__, seen[key], "and", sig)
                seen[key] = sig
    print("checked", n, "kernel functions")
""")


def test_no_kernel_compiled_twice_for_integer_spelling(tmp_path):
    out = run_fresh_cache(SCRIPT, tmp_path, timeout=600)
    assert "checked" in out
    dups = [line for line in out.splitlines() if line.startswith("DUPLICATE")]
    assert dups == [], "\n".join(dups)
