"""The host as its OS describes it: CPU model, cache levels (sysfs, else sysconf), the widest
vector register and physical memory. Read by the probe; nothing here is measured."""
from __future__ import annotations

import os
import platform
import re
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class CacheLevel:
    level: int
    kind: str        # Data, Instruction, Unified
    size_bytes: int
    shared_cpus: str


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def _size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)B?\s*", text, flags=re.I)
    if not m:
        raise ValueError(f"cache size {text!r} is not a number of K/M/G bytes")
    return int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[m.group(2).upper()]


def os_caches(root: str = "/sys/devices/system/cpu/cpu0/cache") -> list[CacheLevel]:
    """CPU 0's caches from sysfs (Linux), smallest level first; empty where the OS has none.
    glibc's ``sysconf`` is the fallback for the last level."""
    out = []
    base = Path(root)
    for d in sorted(base.glob("index*")) if base.is_dir() else ():
        try:
            level = int((d / "level").read_text())
            kind = (d / "type").read_text().strip()
            size = _size((d / "size").read_text())
            shared = (d / "shared_cpu_list").read_text().strip() if (d / "shared_cpu_list").exists() else "?"
        except (OSError, ValueError):
            continue
        out.append(CacheLevel(level, kind, size, shared))
    if not out:
        for level, key in ((3, "SC_LEVEL3_CACHE_SIZE"), (2, "SC_LEVEL2_CACHE_SIZE")):
            try:
                size = os.sysconf(key)
            except (ValueError, OSError, AttributeError):
                size = 0
            if size and size > 0:
                out.append(CacheLevel(level, "Unified", int(size), "?"))
                break
    return sorted(out, key=lambda c: (c.level, c.kind))


def vector_bytes() -> int:
    try:
        flags = next((ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("flags")), "")
    except OSError:
        flags = ""
    fl = set(flags.split())
    return 64 if "avx512f" in fl else 32 if "avx" in fl else 16


def memory_bytes() -> int | None:
    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None
