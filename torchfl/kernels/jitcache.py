"""Where compiled kernels are cached: one directory for every entry point.

The Numba kernels are compiled on first use (``cache=True``) into one directory, so the
CLI, ``torch.compile``, the eager device, tests and benchmarks share what any of them
compiled: ``$NUMBA_CACHE_DIR`` when set, else platformdirs' user cache directory,
``<user cache>/torchfl/numba/<key>``. The key names the torchfl, Numba and Python
versions, so an upgrade of either starts a fresh directory instead of mixing with the old
one (Numba also drops entries whose source changed or that another Numba wrote).

Numba reads ``NUMBA_CACHE_DIR`` at import and binds a cache to a function when the module
defining it is imported, so :func:`configure` runs when ``torchfl.kernels`` is imported,
before any kernel module; if numba was imported earlier it reloads Numba's configuration.
This module imports neither numba nor torch (``info`` unpickles Numba's index files, which
imports numba: only ``torchfl kernels info`` does that).
"""
from __future__ import annotations

import hashlib
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

ENV = "NUMBA_CACHE_DIR"
_configured: Path | None = None
_from_env = False          # the user (or a parent process) chose the directory


def _numba_version() -> str:
    """Numba's version from its dist-info name (importlib.metadata costs ~0.1 s at CLI start)."""
    import importlib.util

    spec = importlib.util.find_spec("numba")
    if spec is None or not spec.origin:
        return "none"
    site = Path(spec.origin).parent.parent
    found = sorted(site.glob("numba-*.dist-info"))
    return found[-1].name[len("numba-"):-len(".dist-info")] if found else "unknown"


def version_key() -> str:
    from torchfl.version import __version__

    return f"torchfl-{__version__}_numba-{_numba_version()}_py{sys.version_info[0]}{sys.version_info[1]}"


def default_dir() -> Path:
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("torchfl", appauthor=False)) / "numba" / version_key()


def configure() -> Path:
    """Make ``NUMBA_CACHE_DIR`` name the kernel cache (the user's choice wins); idempotent."""
    global _configured, _from_env
    path = os.environ.get(ENV)
    if _configured is None:
        _from_env = bool(path) and path != str(default_dir())
    if not path:
        path = str(default_dir())
        os.environ[ENV] = path   # child processes (the demo's compile worker) inherit it
    if _configured != Path(path):
        _configured = Path(path)
        config = sys.modules.get("numba.core.config")
        if config is not None and config.CACHE_DIR != path:
            config.reload_config()
    return Path(path)


def location() -> tuple[Path, str]:
    """(cache directory, where it comes from: ``NUMBA_CACHE_DIR`` or the default)."""
    path = configure()
    if _from_env:
        return path, f"${ENV}"
    return path, f"default: the user cache directory (set ${ENV} to move it)"


def _source_dirs() -> dict[str, Path]:
    """Numba's cache sub-directory name -> this installation's kernel source directory."""
    root = Path(__file__).resolve().parent
    dirs = [root] + [p for p in root.iterdir() if p.is_dir() and (p / "__init__.py").exists()]
    return {f"{d.name}_{hashlib.sha1(str(d).encode()).hexdigest()}": d for d in dirs}


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


@dataclass
class CacheInfo:
    path: Path
    source: str
    exists: bool
    bytes: int = 0
    functions: list = field(default_factory=list)        # CachedFunction of this installation
    other_bytes: int = 0                                 # other checkouts' kernels, stray files
    other_dirs: int = 0

    def to_dict(self) -> dict:
        return {"path": str(self.path), "source": self.source, "exists": self.exists, "bytes": self.bytes,
                "other_checkouts_bytes": self.other_bytes, "other_checkouts_dirs": self.other_dirs,
                "functions": [vars(f) for f in self.functions]}


def _index(nbi: Path):
    """(source stamp, number of overloads) from a Numba index file, None if unreadable."""
    import pickle

    try:
        with open(nbi, "rb") as f:
            pickle.load(f)                      # the numba version that wrote it
            stamp, overloads = pickle.loads(f.read())
        return stamp, len(overloads)
    except Exception:  # noqa: BLE001 - a cache file of another numba: counted by files instead
        return None


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
    where, source = (path, "argument") if path is not None else location()
    out = CacheInfo(where, source, where.is_dir())
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
            idx = _index(nbi) if read_index else None
            if idx is not None:
                stamp, fn.specialisations = idx
                if src.exists():
                    fn.stale = stamp not in _stamp_of(src)
            out.functions.append(fn)
    return out
