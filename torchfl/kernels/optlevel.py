"""LLVM's optimisation level per jitted function, where the default (3) buys no speed.

Numba optimises every function's IR at one process-wide level (``numba.core.config.OPT``, 3),
and its machine code at the level its target machine was made with. A kernel whose hot loops
are hand-written vector IR (the conv micro-kernels) runs as fast at level 1, and its module
optimisation is a third of its compile (``conv.fused.conv_tile_fused``: module passes 5.4 s
at 3, 3.3 s at 1; the whole stem conv's compile 27.1 -> 21.1 s CPU, warm equal, outputs
bit-identical). ``@opt_level(n)`` above a function's ``@njit`` compiles it at IR level ``n``
(its parallel gufunc too, which is lowered inside its compile); every other function of the
process keeps the configured level (a callee typed while a lowered-level caller compiles is
compiled at its own). Machine code keeps its level. Numba's cache key does not hold the level:
a changed level reaches a cache through the source file's stamp, as any edit does.

    @opt_level(1)
    @njit(cache=True, parallel=True)
    def kernel(...): ...
"""
from __future__ import annotations

__all__ = ["opt_level"]

_state = {"original": None, "default": None}


def opt_level(level: int):
    """Compile the decorated dispatcher's IR at LLVM optimisation ``level`` (0-3)."""
    if level not in (0, 1, 2, 3):
        raise ValueError(f"opt_level({level!r}): LLVM optimisation levels are 0, 1, 2 and 3")

    def apply(dispatcher):
        _install()
        dispatcher._torchfl_opt_level = level
        return dispatcher

    return apply


def _install() -> None:
    """Wrap ``Dispatcher.compile`` once: each compile runs at its function's level, then
    restores the level of the compile around it."""
    if _state["original"] is not None:
        return
    from numba.core import config
    from numba.core.dispatcher import Dispatcher

    original = Dispatcher.compile
    _state["original"], _state["default"] = original, config.OPT

    def compile(self, sig):
        level = getattr(self, "_torchfl_opt_level", None)
        outer = config.OPT
        config.OPT = _state["default"] if level is None else config._OptLevel(level)
        try:
            return original(self, sig)
        finally:
            config.OPT = outer

    Dispatcher.compile = compile
