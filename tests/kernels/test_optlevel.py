"""``optlevel.opt_level``: a function's IR is optimised at its own level; its callees, compiled
while it is typed, and everything compiled after it keep the process's level."""
import numpy as np
import pytest
from numba import njit
from numba.core import config, event

from torchfl.kernels.optlevel import opt_level


def test_each_function_lowers_at_its_own_level_and_the_process_level_is_restored():
    default = int(config.OPT)

    @njit
    def callee(x):
        return x * 2.0

    @opt_level(1)
    @njit
    def caller(a):
        s = 0.0
        for i in range(a.shape[0]):
            s += callee(a[i])
        return s

    seen = {}

    class Passes(event.Listener):
        def on_start(self, ev):
            name = ev.data["name"]
            if name.startswith("native_lowering") or name.startswith("nopython_type_inference"):
                seen.setdefault(ev.data["qualname"].rsplit(".", 1)[-1], set()).add(int(config.OPT))

        def on_end(self, ev):
            pass

    listener = Passes()
    event.register("numba:run_pass", listener)
    try:
        assert caller(np.arange(4.0)) == 12.0
    finally:
        event.unregister("numba:run_pass", listener)
    assert seen["caller"] == {1}, seen
    assert seen["callee"] == {default}, seen      # typed inside caller's compile, at its own level
    assert int(config.OPT) == default


def test_a_level_llvm_does_not_have_is_refused():
    with pytest.raises(ValueError, match="levels are 0, 1, 2 and 3"):
        opt_level(4)
