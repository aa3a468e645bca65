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
This module imports neither numba nor torch. What the cache holds (``torchfl kernels info``)
is :mod:`torchfl.kernels.cacheinfo`.
"""
from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

ENV = "NUMBA_CACHE_DIR"
_configured: Path | None = None
_from_env = False          # the user (or a parent process) chose the directory
#: a read-only kernel cache (a shared install): what it holds is loaded, what it lacks is
#: compiled into ``fallback`` (the user cache), or in memory when that is read-only too
_read_only: dict = {"dir": None, "fallback": None}
#: set when a compiled kernel could not be saved (a full disk, out of inodes, a file-size
#: limit): from then on this process compiles in memory and saves nothing (issue 52 case 2)
_save_failed: dict = {"reason": None}
LOG_NAME = "torchfl"


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
        _check_writable(_configured)
    _hook_numba()
    return Path(path)


def _writable(path: Path) -> bool:
    """Whether kernels can be written under ``path`` (created if missing): the nearest
    existing folder is writable, on a file system mounted read-write."""
    probe = path
    while not probe.exists():
        if probe.parent == probe:
            return False
        probe = probe.parent
    return probe.is_dir() and os.access(probe, os.W_OK | os.X_OK)


def _check_writable(path: Path) -> None:
    if _writable(path):
        _read_only.update(dir=None, fallback=None)
        return
    fallback = default_dir()
    _read_only.update(dir=path, fallback=fallback if fallback != path and _can_write_in(fallback) else None)


def _can_write_in(path: Path) -> bool:
    """Create ``path`` and write a file in it (only for the fallback of a read-only cache:
    ``os.access`` trusts permissions, not mounts, for root)."""
    import tempfile

    try:
        path.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=path).close()
    except OSError:
        return False
    return True


def read_only() -> Path | None:
    """The configured cache directory when it cannot be written (a shared, read-only install)."""
    configure()
    return _read_only["dir"]


def writable_dir() -> Path | None:
    """Where newly compiled kernels are saved: the cache directory, or when that is read-only
    the user cache directory, or None (compiled in memory, for this process only)."""
    path = configure()
    return path if _read_only["dir"] is None else _read_only["fallback"]


def saving() -> bool:
    """Whether compiled kernels are still saved to the cache in this process (False after a
    save failed: a full disk; the compile claims are off then, nobody would find the kernel)."""
    return _save_failed["reason"] is None


def _stop_saving(where, exc: OSError) -> None:
    """A kernel could not be saved under ``where``: keep every kernel of this process in memory
    from now on, said once (one warning per process, however many kernels follow)."""
    if _save_failed["reason"] is None:
        _save_failed["reason"] = exc.strerror or str(exc)
    _warn_once("save", f"torchfl: cannot save compiled kernels in {where} ({exc.strerror or exc}): "
                       "new kernels are compiled in memory for this process only (free space there, or set "
                       f"{ENV} to a writable directory with room)")


def holds_kernels() -> bool:
    """Whether the kernel cache (or the read-only one it falls back from) holds any compiled
    kernel of this installation: False for a new user's first run, whose first call compiles
    every kernel (:func:`torchfl.kernels.precompile.prestart` starts the compile helpers early
    then). One directory listing per source folder, stopping at the first index file."""
    configure()
    names = _source_dirs()
    for top in {p for p in (_read_only["dir"], writable_dir()) if p is not None}:
        for name in names:
            try:
                with os.scandir(top / name) as it:
                    if any(e.name.endswith(".nbi") for e in it):
                        return True
            except OSError:         # no such folder yet (or unreadable): nothing cached there
                continue
    return False


def not_a_directory(path: Path) -> str | None:
    """Why an unwritable cache path holds no kernels at all, in words ("is not a directory (it
    is a file)"), or None for a read-only directory (whose kernels are loaded)."""
    if path.is_dir():
        return None
    if path.exists():
        return "is not a directory (it is a file)"
    probe = path.parent
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    return f"cannot be created ({probe} is {'read-only' if probe.is_dir() else 'a file'})"


def location() -> tuple[Path, str]:
    """(the directory compiled kernels are cached in, where it comes from: ``NUMBA_CACHE_DIR``
    or the default; a read-only one says so, with where new kernels go; a path that is no
    directory says that nothing is loaded from it)."""
    path = configure()
    ro = _read_only["dir"]
    if ro is not None:
        fallback = _read_only["fallback"]
        why = not_a_directory(ro)
        if why is not None:
            if fallback is None:
                return ro, f"none: ${ENV} {ro} {why}; kernels are compiled in memory for each process"
            return fallback, f"the user cache directory, in place of ${ENV} {ro}, which {why}"
        if fallback is None:
            return ro, f"${ENV} (read-only: its kernels are loaded, new ones compiled in memory for each process)"
        return fallback, f"the user cache directory: ${ENV} {ro} is read-only (its kernels are loaded from it)"
    if _from_env:
        return path, f"${ENV}"
    return path, f"default: the user cache directory (set ${ENV} to move it)"


# ---------------------------------------------------------------------------- Numba's cache, guarded

def _hook_numba() -> None:
    """Guard Numba's cache once ``numba.core.caching`` is imported (now, if it was): see
    :func:`_guard`. An import hook, so that this module still imports no numba."""
    module = sys.modules.get("numba.core.caching")
    if module is not None:
        _guard(module)
    elif not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport())


class _AfterImport:
    """A meta-path finder that runs :func:`_guard` right after ``numba.core.caching`` loads."""

    def find_spec(self, name, path=None, target=None):
        if name != "numba.core.caching":
            return None
        import importlib.util

        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            spec.loader = _GuardingLoader(spec.loader)
        return spec


class _GuardingLoader:
    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        _guard(module)


_said: set = set()


def _warn_once(key, message: str) -> None:
    if key not in _said:
        _said.add(key)
        import logging

        logging.getLogger(LOG_NAME).warning("%s", message)


def _read_only_locator(base):
    """Numba's cache locator for a read-only kernel cache (``_guard``): loads from it, saves into
    the writable fallback, or keeps kernels in memory when there is none."""

    class ReadOnlyCacheLocator(base):
        """Saves into the writable fallback (None: nowhere), loads the read-only directory too."""

        def __init__(self, py_func, py_file):
            super().__init__(py_func, py_file)
            sub = self.get_suitable_cache_subpath(py_file)
            self.read_only_path = os.path.join(str(_read_only["dir"]), sub)
            fallback = _read_only["fallback"]
            self.in_memory = fallback is None
            self._cache_path = self.read_only_path if self.in_memory else os.path.join(str(fallback), sub)

        def ensure_cache_path(self):
            if self.in_memory:
                raise OSError(30, "read-only kernel cache", self.read_only_path)
            super().ensure_cache_path()

        @classmethod
        def from_function(cls, py_func, py_file):
            if _read_only["dir"] is None or not os.path.exists(py_file):
                return None
            self = cls(py_func, py_file)
            if not self.in_memory:
                try:
                    base.ensure_cache_path(self)
                except OSError:
                    self.in_memory, self._cache_path = True, self.read_only_path
            where = "compiled in memory for each process" if self.in_memory else \
                f"compiled into {_read_only['fallback']}"
            ro = _read_only["dir"]
            why = not_a_directory(ro)
            what = f"{why}: no kernels are loaded from it, new ones are" if why else \
                "is read-only: the kernels it holds are loaded from it, the others are"
            _warn_once("read-only", f"torchfl: the kernel cache {ro} {what} {where} (set {ENV} to a "
                                    "writable directory to keep them)")
            return self

    return ReadOnlyCacheLocator


def _unwritable_locator(base):
    """Numba's cache locator for a cache directory in which no file can be created (a full
    file system, out of inodes): Numba's own locator then gave up silently and compiled into
    the source tree's ``__pycache__``; this one loads what the directory holds and saves
    nothing (:func:`_stop_saving`)."""

    class UnwritableCacheLocator(base):
        in_memory = True

        def ensure_cache_path(self):
            raise OSError(28, "kernel cache cannot be written", self.get_cache_path())

        @classmethod
        def from_function(cls, py_func, py_file):
            if _read_only["dir"] is not None or not os.path.exists(py_file):
                return None
            self = cls(py_func, py_file)
            try:
                base.ensure_cache_path(self)        # what the user-provided locator tried
            except OSError as exc:
                _stop_saving(configure(), exc)
                return self
            return base.from_function(py_func, py_file)     # writable again (freed meanwhile)

    return UnwritableCacheLocator


def _guard(caching) -> None:
    """Make Numba's cache survive what a shared or damaged cache directory does to it.

    - An entry that cannot be read (an ``.nbi``/``.nbc`` truncated, overwritten, with
      flipped bytes: ``EOFError``, ``UnpicklingError``, an LLVM bitcode error) is discarded
      and compiled again, with one warning naming the file; it made every later run crash
      with Numba's traceback.
    - A read-only cache directory is read: what it holds is loaded, what it lacks is compiled
      into the user cache directory (or in memory), said once; Numba silently compiled into
      another directory (the source tree's ``__pycache__``) instead.
    - A save that fails (a full disk, out of inodes, a file-size limit) stops saving for the
      process: that kernel and every later one stay in memory, said once (one warning per
      process), and the compile claims are off (no other process will find the kernel). A
      cache directory in which no file can be created is loaded and never written (Numba
      compiled into the source tree's ``__pycache__`` instead).
    """
    if getattr(caching, "_torchfl_guarded", False):
        return
    caching._torchfl_guarded = True
    base = caching.UserProvidedCacheLocator

    ReadOnlyCacheLocator = _read_only_locator(base)
    caching.CacheImpl._locator_classes.insert(0, ReadOnlyCacheLocator)
    # right after the user-provided locator (NUMBA_CACHE_DIR, always set by configure): what
    # takes over when that one finds no file can be created there
    at = caching.CacheImpl._locator_classes.index(base) + 1
    caching.CacheImpl._locator_classes.insert(at, _unwritable_locator(base))
    load, save = caching.Cache.load_overload, caching.Cache.save_overload

    def load_overload(self, sig, target_context):
        try:
            data = load(self, sig, target_context)
        except Exception as exc:  # noqa: BLE001 - a cache file is untrusted bytes: any failure to read it
            data = None            # means "no usable entry"; the kernel is compiled again
            if os.path.isfile(self._cache_file._index_path):   # else no entry at all (a path not a folder)
                _discard(caching, self, self._cache_file, sig, target_context, exc)
        locator = self._impl.locator
        if data is None and isinstance(locator, ReadOnlyCacheLocator) and not locator.in_memory:
            shared = caching.IndexDataCacheFile(locator.read_only_path, self._impl.filename_base,
                                                locator.get_source_stamp())
            try:
                payload = shared.load(self._index_key(sig, target_context.codegen()))
                data = None if payload is None else self._impl.rebuild(target_context, payload)
            except Exception as exc:  # noqa: BLE001 - as above; a read-only file stays as it is
                data = None
                if os.path.isfile(shared._index_path):
                    _discard(caching, self, shared, sig, target_context, exc)
        return data

    def save_overload(self, sig, data):
        if getattr(self._impl.locator, "in_memory", False) or _save_failed["reason"] is not None:
            return
        try:
            save(self, sig, data)
        except OSError as exc:       # ENOSPC, EDQUOT, EFBIG...: Numba removed its partial file
            _stop_saving(writable_dir() or self._cache_path, exc)

    caching.Cache.load_overload, caching.Cache.save_overload = load_overload, save_overload


def _discard(caching, cache, cache_file, sig, target_context, exc) -> None:
    """Name and remove the unreadable file of ``cache``'s entry for ``sig`` (the index, or the
    entry's data file), warning once per file; a file that cannot be removed is left."""
    bad = Path(cache_file._index_path)
    try:
        overloads = cache_file._load_index()
    except Exception:  # noqa: BLE001 - the index itself is what cannot be read
        overloads = None
    if overloads is not None:
        name = overloads.get(cache._index_key(sig, target_context.codegen()))
        if name is not None:
            bad = Path(cache_file._data_path(name))
    try:
        bad.unlink()
        done = "discarded; the kernel is compiled again"
    except FileNotFoundError:
        done = "discarded; the kernel is compiled again"
    except OSError:
        done = "left in place (cannot be removed); the kernel is compiled again in memory"
    first = (str(exc).strip().splitlines() or [""])[0][:200]
    _warn_once(("broken", str(bad)), f"torchfl: kernel cache file {bad} is unreadable ({type(exc).__name__}: "
                                     f"{first}); {done}")


def _source_dirs() -> dict[str, Path]:
    """Numba's cache sub-directory name -> this installation's kernel source directory."""
    root = Path(__file__).resolve().parent
    dirs = [root] + [p for p in root.iterdir() if p.is_dir() and (p / "__init__.py").exists()]
    return {f"{d.name}_{hashlib.sha1(str(d).encode()).hexdigest()}": d for d in dirs}
