"""What the kernel cache holds, for ``torchfl kernels info``: per jitted function of this
installation its compiled specialisations, size, staleness and unreadable files; where new
kernels go; whether the configured directory is ignored (a file) or its file system full.

Split from :mod:`torchfl.kernels.jitcache` (which says where the cache is and guards Numba's
use of it). ``info`` unpickles Numba's index files, which imports numba: only ``torchfl
kernels info`` does that.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

from .jitcache import (ENV, _numba_version, _read_only, _source_dirs, _writable, configure, location,
                       not_a_directory, writable_dir)

__all__ = ["CachedFunction", "CacheInfo", "info"]


def _no_room(path: Path) -> bool:
    """Whether the file system that holds (or would hold) ``path`` has no block or no inode
    left for this process: a new kernel cannot be saved there."""
    probe = path
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    try:
        st = os.statvfs(probe)
    except OSError:
        return False
    root = os.geteuid() == 0           # root may use the blocks kept for it
    return (st.f_bfree if root else st.f_bavail) == 0 or (st.f_files > 0 and (st.f_ffree if root else st.f_favail) == 0)


@dataclass
class CachedFunction:
    """One jitted function's entries in the cache."""

    family: str               # kernel family (``shared``: gemm, codecs, ... used by several)
    module: str               # source file stem
    function: str             # qualified name
    line: int
    specialisations: int      # signatures compiled (Numba's index), or .nbc files if unreadable
    bytes: int
    stale: bool = False       # written for another version of the source file
    broken: list = field(default_factory=list)  # files that cannot be read (recompiled on next use)


@dataclass
class CacheInfo:
    path: Path
    source: str
    exists: bool
    bytes: int = 0
    functions: list = field(default_factory=list)        # CachedFunction of this installation
    other_bytes: int = 0                                 # other checkouts' kernels, stray files
    other_dirs: int = 0
    read_only: bool = False                              # the directory cannot be written
    writes_to: str | None = None                         # where new kernels go (None: in memory)
    ignored: str | None = None                           # a $NUMBA_CACHE_DIR that holds no kernels, and why
    full: bool = False                                   # no room left where new kernels go: kept in memory

    def to_dict(self) -> dict:
        return {"path": str(self.path), "source": self.source, "exists": self.exists, "bytes": self.bytes,
                "other_checkouts_bytes": self.other_bytes, "other_checkouts_dirs": self.other_dirs,
                "read_only": self.read_only, "new_kernels_go_to": self.writes_to, "ignored": self.ignored,
                "full": self.full,
                "broken_files": [f"{x.family}/{name}" for x in self.functions for name in x.broken],
                "functions": [vars(f) for f in self.functions]}


class _Broken(Exception):
    """A cache file that cannot be read (truncated, overwritten, corrupted)."""


def _index(nbi: Path):
    """(source stamp, overloads: key -> data file name) from a Numba index file; None if
    another Numba wrote it (counted by files instead); :class:`_Broken` if it cannot be read."""
    import pickle

    try:
        with open(nbi, "rb") as f:
            version = pickle.load(f)            # the numba version that wrote it
            rest = f.read()
    except Exception as exc:  # noqa: BLE001 - untrusted bytes: any failure means unreadable
        raise _Broken(f"{type(exc).__name__}: {exc}") from None
    if version != _numba_version():
        return None
    try:
        stamp, overloads = pickle.loads(rest)
        return stamp, dict(overloads)
    except Exception as exc:  # noqa: BLE001 - as above
        raise _Broken(f"{type(exc).__name__}: {exc}") from None


def _readable(nbc: Path) -> bool:
    """Whether a data file unpickles (what Numba does before it rebuilds the kernel; corruption
    inside the compiled code itself shows only then, and is discarded at that load)."""
    import pickle

    try:
        pickle.loads(nbc.read_bytes())
    except Exception:  # noqa: BLE001 - untrusted bytes
        return False
    return True


def _stamp_of(source: Path):
    import functools

    @functools.lru_cache(maxsize=None)
    def digest(path: str, _mtime: float, _size: int) -> bytes:
        return hashlib.sha256(Path(path).read_bytes()).digest()

    st = source.stat()
    return digest(str(source), st.st_mtime, st.st_size), (st.st_mtime, st.st_size)


def info(path: Path | None = None, read_index: bool = True) -> CacheInfo:
    """What the kernel cache holds: per jitted function of this installation, the number of
    compiled specialisations and their size; the rest (other checkouts) in one sum."""
    ignored = None
    if path is not None:
        where, source = path, "argument"
    else:
        configure()
        where, source = location()
        ro = _read_only["dir"]
        why = None if ro is None else not_a_directory(ro)
        if why is not None:       # a file (or a path under one) holds no kernels: list where they go
            ignored = f"${ENV} {ro} {why}"
        elif ro is not None:      # a read-only cache: list what is loaded from it
            where = ro
    out = CacheInfo(where, source, where.is_dir(), read_only=ignored is None and not _writable(where),
                    ignored=ignored)
    target = writable_dir() if path is None else (where if not out.read_only else None)
    out.writes_to = None if target is None else str(target)
    out.full = target is not None and _no_room(Path(target))
    if not out.exists:
        return out
    ours = _source_dirs()
    # dot-folders (``.claims``: compilelock's claim files) are the cache's own bookkeeping, not
    # another checkout's kernels
    for sub in sorted(p for p in where.iterdir() if p.is_dir() and not p.name.startswith(".")):
        files = [f for f in sub.iterdir() if f.is_file()]
        size = sum(f.stat().st_size for f in files)
        out.bytes += size
        src_dir = ours.get(sub.name)
        if src_dir is None:
            out.other_bytes += size
            out.other_dirs += 1
            continue
        for nbi in sorted(f for f in files if f.suffix == ".nbi"):
            base = nbi.name[: -len(".nbi")]                      # impl._tile-123.py311
            stem_qual, _, _py = base.rpartition(".")
            qual_line, _, line = stem_qual.rpartition("-")
            module, _, qual = qual_line.partition(".")
            data = [f for f in files if f.name.startswith(base + ".") and f.suffix == ".nbc"]
            family = "shared" if src_dir == Path(__file__).resolve().parent else src_dir.name
            fn = CachedFunction(family=family, module=module, function=qual,
                                line=int(line) if line.isdigit() else 0, specialisations=len(data),
                                bytes=nbi.stat().st_size + sum(f.stat().st_size for f in data))
            src = src_dir / f"{module}.py"
            try:
                idx = _index(nbi) if read_index else None
            except _Broken:
                idx = None
                fn.broken.append(nbi.name)
            if idx is not None:
                stamp, overloads = idx
                fn.specialisations = len(overloads)
                if src.exists():
                    fn.stale = stamp not in _stamp_of(src)
                if not fn.stale:
                    fn.broken += [name for name in sorted(overloads.values())
                                  if not (sub / name).is_file() or not _readable(sub / name)]
            out.functions.append(fn)
    return out
