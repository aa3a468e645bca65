"""What the CPU that Numba compiles for can do (kernels pick code paths by it)."""
from __future__ import annotations


def has_feature(name: str) -> bool:
    """Whether Numba compiles for a CPU with feature ``name`` (LLVM's spelling: "avx512f",
    "f16c"). An explicit NUMBA_CPU_NAME other than "host" is a portable target: only the
    features NUMBA_CPU_FEATURES lists."""
    from numba.core import config

    if config.CPU_NAME and config.CPU_NAME != "host":
        return f"+{name}" in (config.CPU_FEATURES or "")
    import llvmlite.binding as llvm

    return f"+{name}" in llvm.get_host_cpu_features().flatten()
