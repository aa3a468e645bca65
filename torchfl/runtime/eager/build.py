"""Building and loading the npu device's C++ adapter (``adapter.cpp`` beside this file).

Compiled once with ``torch.utils.cpp_extension`` (g++ and ninja, 20-40 s), into the user
cache directory under a name that carries the source's hash, the torch version and the
Python ABI, so an upgrade of either rebuilds and nothing is rebuilt otherwise. Loading a
cached build is a plain import of the shared object (milliseconds): that is all
``import torch`` ever does (see ``autoload``); a build happens only on first use
(``torchfl.runtime.eager.ensure_adapter``), with a message on stderr while it runs.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import shutil
import sys
import sysconfig
from pathlib import Path

__all__ = ["SOURCE", "MODULE", "build_dir", "load_cached", "build", "AdapterBuildError", "toolchain_problems"]

SOURCE = Path(__file__).with_name("adapter.cpp")
MODULE = "torchfl_npu_adapter"


class AdapterBuildError(RuntimeError):
    """The adapter could not be compiled (the message names the missing tool or the error)."""


def _cache_root() -> Path:
    env = os.environ.get("TORCHFL_ADAPTER_DIR")
    if env:
        return Path(env)
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("torchfl")) / "npu-adapter"


def build_dir() -> Path:
    """Where this source, torch and Python's ABI build to (their hash in the name)."""
    import torch

    digest = hashlib.sha256(SOURCE.read_bytes())
    digest.update(torch.__version__.encode())
    digest.update((sysconfig.get_config_var("EXT_SUFFIX") or "").encode())
    return _cache_root() / digest.hexdigest()[:16]


def _shared_object(folder: Path) -> Path | None:
    found = sorted(folder.glob(f"{MODULE}*.so"))
    return found[0] if found else None


def _import(path: Path):
    existing = sys.modules.get(MODULE)
    if existing is not None:
        return existing
    spec = importlib.util.spec_from_file_location(MODULE, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[MODULE] = module
    return module


@contextlib.contextmanager
def _locked(folder: Path):
    """One builder at a time per build folder (test workers, parallel first uses); a
    reader waits for a build in progress instead of importing a half-written object."""
    import fcntl

    folder.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f"{folder.name}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def load_cached():
    """The adapter module if a build of this source exists, else None (never builds)."""
    if MODULE in sys.modules:
        return sys.modules[MODULE]
    folder = build_dir()
    if not folder.is_dir():
        return None
    with _locked(folder):
        so = _shared_object(folder)
        return _import(so) if so is not None else None


def _ninja_on_path() -> str | None:
    """The ``ninja`` executable, putting the PyPI ``ninja`` package's on PATH if needed
    (torch's builder runs ``ninja`` by name; a venv's bin is on PATH only when active)."""
    found = shutil.which("ninja")
    if found:
        return found
    try:
        import ninja  # the PyPI package ships the binary

        bindir = getattr(ninja, "BIN_DIR", None)
    except ImportError:
        bindir = None
    if bindir and (Path(bindir) / "ninja").exists():
        os.environ["PATH"] = f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}"
        return str(Path(bindir) / "ninja")
    return None


def toolchain_problems() -> list[str]:
    """What a build would lack, as sentences that name the tool and how to get it."""
    problems = []
    cxx = os.environ.get("CXX", "c++")
    if not (shutil.which(cxx) or shutil.which("g++")):
        problems.append(f"no C++ compiler ({cxx!r} or 'g++' on PATH): install one, e.g. "
                        "`apt-get install g++`, or set CXX")
    if _ninja_on_path() is None:
        problems.append("no 'ninja' build tool: `pip install ninja` (a torchfl dependency) or "
                        "`apt-get install ninja-build`")
    return problems


def build(verbose: bool = False):
    """Compile the adapter (if this source has no build yet) and import it."""
    cached = load_cached()
    if cached is not None:
        return cached
    problems = toolchain_problems()
    if problems:
        raise AdapterBuildError("cannot build torchfl's npu device adapter: " + "; ".join(problems))
    folder = build_dir()
    with _locked(folder):
        so = _shared_object(folder)
        if so is not None:         # another process built it meanwhile
            return _import(so)
        return _compile(folder, verbose)


def _compile(folder: Path, verbose: bool):
    print(f"torchfl: building the npu device adapter (once, about 30 s) in {folder} ...",
          file=sys.stderr, flush=True)
    from torch.utils import cpp_extension

    try:
        module = cpp_extension.load(name=MODULE, sources=[str(SOURCE)], build_directory=str(folder),
                                    extra_cflags=["-O2"], verbose=verbose, is_python_module=True)
    except Exception as exc:   # noqa: BLE001 -- not swallowed: every way cpp_extension fails (RuntimeError
        # from the compiler or ninja, OSError, CalledProcessError, ImportError of the built
        # library) is re-raised as the one AdapterBuildError naming the folder, cause chained
        raise AdapterBuildError(f"building torchfl's npu device adapter failed in {folder}: {exc}") from exc
    print("torchfl: npu device adapter built", file=sys.stderr, flush=True)
    sys.modules[MODULE] = module
    return module
