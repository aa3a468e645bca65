"""Issue 39: the kernel cache under faults (torchfl.kernels.jitcache guards Numba's cache).

- An ``.nbc`` or ``.nbi`` truncated, overwritten or with 8 flipped bytes made every later run
  crash with Numba's traceback (``EOFError``, ``UnpicklingError``, "LLVM bitcode parsing
  error") naming no file; ``kernels info`` reported the entries as normal. Now the entry is
  discarded and compiled again with one warning naming the file, and ``info`` lists it.
- A read-only cache (a shared install) raised ``OSError: [Errno 30] ... .claims``, or compiled
  silently elsewhere while saying "cached in <the read-only one>". Now what it holds is
  loaded, what it lacks is compiled into the user cache (or in memory), said once.

Each case runs in fresh processes on a kernel module and cache of its own, real Numba."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

KERNEL = """
from numba import njit

@njit(cache=True)
def twice(x):
    return 2 * x

@njit(cache=True)
def thrice(x):
    return 3 * x
"""

RUN = """
import sys
import numpy as np
from torchfl.kernels import compilelock, jitcache
compilelock.install("wait")          # claims beside the cache: OSError on a read-only one before
import kmod
fn = getattr(kmod, sys.argv[1])
assert fn(np.int64(3)) == (6 if fn is kmod.twice else 9)
print("RESULT", sum(fn.stats.cache_hits.values()), sum(fn.stats.cache_misses.values()), jitcache.location()[0])
"""


def _setup(tmp_path) -> dict:
    kdir = tmp_path / "k"
    kdir.mkdir()
    (kdir / "kmod.py").write_text(KERNEL)
    (kdir / "run.py").write_text(RUN)
    return dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"), XDG_CACHE_HOME=str(tmp_path / "xdg"),
                PYTHONPATH=f"{ROOT}{os.pathsep}{kdir}")


def _run(env, fn="twice", prefix=()):
    out = subprocess.run([*prefix, sys.executable, str(Path(env["PYTHONPATH"].split(os.pathsep)[1]) / "run.py"), fn],
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    (line,) = [x for x in out.stdout.splitlines() if x.startswith("RESULT")]
    hits, misses, where = line.split()[1:]
    warnings = [x for x in out.stderr.splitlines() if x.startswith("torchfl:")]
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    return int(hits), int(misses), where, warnings


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    for i in range(8):
        data[middle + i] ^= 0xFF
    path.write_bytes(bytes(data))


CORRUPTIONS = {
    "nbc-truncated": (".nbc", lambda p: p.write_bytes(p.read_bytes()[:100])),
    "nbc-overwritten": (".nbc", lambda p: p.write_bytes(os.urandom(5000))),
    "nbc-8-bytes-flipped": (".nbc", _flip),
    "nbi-truncated": (".nbi", lambda p: p.write_bytes(p.read_bytes()[:20])),
    "nbi-overwritten": (".nbi", lambda p: p.write_bytes(b"\xc0" + os.urandom(300))),
}


@pytest.mark.parametrize("case", list(CORRUPTIONS))
def test_a_broken_cache_entry_is_discarded_and_compiled_again_with_one_warning(tmp_path, case):
    env = _setup(tmp_path)
    assert _run(env)[:2] == (0, 1)                  # compiled, cached
    assert _run(env)[:2] == (1, 0)                  # loaded
    suffix, damage = CORRUPTIONS[case]
    (victim,) = (tmp_path / "cache").glob(f"*/kmod.twice*{suffix}")
    damage(victim)
    hits, misses, _, warnings = _run(env)           # crashed with Numba's traceback before
    assert (hits, misses) == (0, 1)
    assert len(warnings) == 1 and str(victim) in warnings[0] and "unreadable" in warnings[0], warnings
    assert _run(env)[:2] == (1, 0) and not _run(env)[3]   # cached again, silent


def test_kernels_info_lists_broken_entries(tmp_path):
    """A real torchfl kernel (a codec) compiled into a fresh cache, then damaged."""
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=str(ROOT))
    compile_one = ("import numpy as np\nfrom torchfl.kernels import codecs\n"
                   "assert codecs.bf16_to_f32(np.uint16(0x3f80)) == 1.0\n")
    subprocess.run([sys.executable, "-c", compile_one], env=env, check=True, timeout=300)

    def info():
        out = subprocess.run([sys.executable, "-m", "torchfl.cli", "kernels", "info", "--json"], env=env,
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    assert info()["broken_files"] == []
    (nbc,) = (tmp_path / "cache").glob("*/codecs.bf16_to_f32*.nbc")
    nbc.write_bytes(nbc.read_bytes()[:64])
    assert info()["broken_files"] == [f"shared/{nbc.name}"]      # reported as normal before
    text = subprocess.run([sys.executable, "-m", "torchfl.cli", "kernels", "info"], env=env,
                          capture_output=True, text=True, timeout=300).stdout
    assert "broken:     1 unreadable file(s)" in text and str(nbc) in text, text
    run = subprocess.run([sys.executable, "-c", compile_one], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stderr.count(str(nbc)) == 1, run.stderr
    assert info()["broken_files"] == []


def _read_only_prefix(cache: Path) -> list[str]:
    """Run a command with ``cache`` mounted read-only (a private mount namespace)."""
    if not shutil.which("unshare"):
        pytest.skip("unshare is not available to mount the cache read-only")
    script = f'mount --bind "{cache}" "{cache}" && mount -o remount,bind,ro "{cache}" && exec "$@"'
    flags = "-m" if os.geteuid() == 0 else "-rm"
    probe = subprocess.run(["unshare", flags, "sh", "-c", script, "sh", "touch", f"{cache}/x"],
                           capture_output=True, text=True)
    if "Read-only file system" not in probe.stderr:
        pytest.skip(f"cannot mount read-only here: {probe.stderr.strip()[:200]}")
    return ["unshare", flags, "sh", "-c", script, "sh"]


def test_a_read_only_cache_is_read_and_new_kernels_go_to_the_user_cache(tmp_path):
    env = _setup(tmp_path)
    cache = tmp_path / "cache"
    assert _run(env, "twice")[:2] == (0, 1)
    before = sorted(p.name for p in cache.rglob("*"))
    ro = _read_only_prefix(cache)
    hits, misses, where, warnings = _run(env, "twice", ro)    # OSError on .claims before
    assert (hits, misses) == (1, 0)                            # what it holds is loaded
    assert len(warnings) == 1 and "is read-only" in warnings[0] and str(cache) in warnings[0], warnings
    hits, misses, where, warnings = _run(env, "thrice", ro)
    assert (hits, misses) == (0, 1) and len(warnings) == 1
    fallback = Path(where)
    assert fallback.is_relative_to(tmp_path / "xdg")           # "cached in" names where it really went
    assert list(fallback.glob("*/kmod.thrice*.nbc"))
    assert _run(env, "thrice", ro)[:2] == (1, 0)               # and is loaded from there next time
    assert sorted(p.name for p in cache.rglob("*")) == before  # the read-only cache untouched
    out = subprocess.run([*ro, sys.executable, "-m", "torchfl.cli", "kernels", "info"], env=env,
                         capture_output=True, text=True, timeout=300)
    # kernels info wraps at the pipe's 100 columns (a path stays whole on its line)
    assert (f"read-only: its kernels are loaded; new ones go to {fallback}" in " ".join(out.stdout.split())
            ), out.stdout + out.stderr


def test_a_read_only_cache_without_a_writable_one_compiles_in_memory(tmp_path):
    env = _setup(tmp_path)
    cache = tmp_path / "cache"
    assert _run(env, "twice")[:2] == (0, 1)
    env["XDG_CACHE_HOME"] = "/proc/torchfl-no-such-dir"        # the user cache cannot be written either
    ro = _read_only_prefix(cache)
    hits, misses, where, warnings = _run(env, "thrice", ro)
    assert (hits, misses) == (0, 1) and where == str(cache)
    assert len(warnings) == 1 and "compiled in memory" in warnings[0], warnings
    assert _run(env, "twice", ro)[:2] == (1, 0)


def test_a_cache_path_that_is_a_file_compiles_into_the_user_cache(tmp_path):
    env = _setup(tmp_path)
    (tmp_path / "cache").write_text("not a directory\n")
    hits, misses, where, warnings = _run(env, "twice")
    assert (hits, misses) == (0, 1) and Path(where).is_relative_to(tmp_path / "xdg")
    assert len(warnings) == 1 and "is not a directory" in warnings[0], warnings
    assert _run(env, "twice")[:2] == (1, 0)
