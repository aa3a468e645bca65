"""What a normalisation's first call compiles (issue 38: a cold first call is mostly Numba compiles).

A layer norm over contiguous rows (every transformer's) runs ``bodies._normalize_rows_task`` only;
it used to be a branch of ``_normalize_task``, whose general path (the row load/store helpers
``_load``/``_store`` and their codecs, ~1.6 s of compile CPU on a BERT layer's first call) was
compiled and never ran. The general task passed a literal ``0`` to ``_load``/``_store``, which
compiled them for ``Literal[int](0)`` beside the ``int64`` signature the segment kernels use.
Both checked in a fresh process with an empty Numba cache (a cached function compiles nothing);
the outputs of both tasks against torch."""
import textwrap

from .helpers import run_fresh_cache

SCRIPT = textwrap.dedent("""
    import torch
    import torch.nn.functional as F
    from torchfl.kernels import DeviceMemory
    from torchfl.kernels.norm import bodies
    from tests.kernels.helpers import as_f32, assert_close, chip_for, dev, run_checked

    torch.manual_seed(0)
    chip = chip_for("float16")
    mem = DeviceMemory(chip)
    x, w, b = torch.randn(6, 128), torch.randn(128), torch.randn(128)
    (y, *_), _ = run_checked("layer_norm", chip, {"x": dev(x, mem, "float16"), "weight": dev(w, mem, "float16"),
                                                  "bias": dev(b, mem, "float16")}, {"normalized_shape": (128,)})
    r16 = lambda t: t.half().float()
    assert_close(as_f32(y), F.layer_norm(r16(x), (128,), r16(w), r16(b)), "float16", what="rows task")
    print("ROWS", [len(f.signatures) for f in (bodies._normalize_rows_task, bodies._normalize_task,
                                                bodies._load, bodies._store)])
    x3 = torch.randn(4, 5, 32)
    (y3, *_), _ = run_checked("layer_norm", chip, {"x": dev(x3, mem, "float16", "CLN"), "weight": dev(w[:32], mem, "float16"),
                                                   "bias": dev(b[:32], mem, "float16")}, {"normalized_shape": (32,)})
    assert_close(as_f32(y3), F.layer_norm(r16(x3), (32,), r16(w[:32]), r16(b[:32])), "float16", what="general task")
    print("GENERAL", len(bodies._normalize_task.signatures))
    print("SIGS", [str(t) for f in (bodies._load, bodies._store) for s in f.signatures for t in s])
""")


def test_layer_norm_rows_compile_no_general_path_and_no_literal(tmp_path):
    out = run_fresh_cache(SCRIPT, tmp_path, timeout=600)
    rows = next(line for line in out.splitlines() if line.startswith("ROWS"))
    assert rows == "ROWS [1, 0, 0, 0]", out          # only the rows task compiled for contiguous rows
    assert "GENERAL 1" in out, out                    # a strided layout takes the general task
    sigs = next(line for line in out.splitlines() if line.startswith("SIGS"))
    assert "Literal" not in sigs, sigs
