"""Issue 52 case 2: the kernel cache on a full file system.

Before: ``NUMBA_CACHE_DIR`` on a full file system crashed the run with ``OSError: [Errno 28]
No space left on device`` from the compile claim's ``os.write`` (``kernels/compilelock.py``);
out of inodes, Numba silently compiled into the source tree's ``__pycache__``. Now the run
gives the right answer, kernels the cache holds are loaded, new ones are compiled in memory,
and the process says so in ONE warning (however many kernels follow); nothing half-written is
left in the cache.

The file system is really full: a small tmpfs filled to the last block (or its last inode),
mounted in a private mount namespace (``unshare``: as root, or as a user where user
namespaces are allowed), so nothing outlives the test. Where that cannot be mounted, the
file-size limit (``ulimit -f 0``: writes fail with EFBIG, the kernel's own refusal) runs
the same checks. Each case runs in fresh processes on a kernel module of its own, real Numba.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.kernels.test_cache_faults import KERNEL

ROOT = Path(__file__).resolve().parents[2]

RUN = """
import sys
import numpy as np
from torchfl.kernels import compilelock
compilelock.install("wait")                 # the claim's pid write raised ENOSPC before
import kmod
for name in sys.argv[1:]:
    fn = getattr(kmod, name)
    assert fn(np.int64(3)) == (6 if name == "twice" else 9)
    print("RESULT", name, sum(fn.stats.cache_hits.values()), sum(fn.stats.cache_misses.values()))
"""

# Mount a small tmpfs at $M, copy the prepared cache into it, fill what is left, run the rest.
FILL = {
    "blocks": 'dd if=/dev/zero of="$M/fill" bs=4k 2>/dev/null; true',
    "inodes": 'i=0; while touch "$M/f$i" 2>/dev/null; do i=$((i+1)); done',
}
MOUNT = ('mount -t tmpfs -o size=1m,nr_inodes={inodes} tmpfs "$M" && cp -a "$SRC/." "$M/" && {fill} && '
         'exec env NUMBA_CACHE_DIR="$M" "$@"')


def _setup(tmp_path) -> dict:
    kdir = tmp_path / "k"
    kdir.mkdir()
    (kdir / "kmod.py").write_text(KERNEL)
    (kdir / "run.py").write_text(RUN)
    (tmp_path / "cache").mkdir()
    (tmp_path / "mnt").mkdir()
    return dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"), XDG_CACHE_HOME=str(tmp_path / "xdg"),
                PYTHONPATH=f"{ROOT}{os.pathsep}{kdir}", SRC=str(tmp_path / "cache"), M=str(tmp_path / "mnt"))


def _full_prefix(how: str, at: Path) -> list[str]:
    """The command prefix that runs a process with its kernel cache on a full file system."""
    if how == "fsize":
        return ["sh", "-c", 'ulimit -f 0 && exec "$@"', "sh"]
    if not shutil.which("unshare"):
        pytest.skip("unshare is not available to mount a small tmpfs (the fsize case covers this)")
    flags = "-m" if os.geteuid() == 0 else "-rm"
    probe = subprocess.run(["unshare", flags, "sh", "-c", 'mount -t tmpfs -o size=1m tmpfs "$1"', "sh", str(at)],
                           capture_output=True, text=True)
    if probe.returncode:
        pytest.skip(f"cannot mount a tmpfs here (the fsize case covers this): {probe.stderr.strip()[:200]}")
    script = MOUNT.format(inodes=2000 if how == "blocks" else 64, fill=FILL[how])
    return ["unshare", flags, "sh", "-c", script, "sh"]


def _run(env, names, prefix=()):
    out = subprocess.run([*prefix, sys.executable, str(Path(env["PYTHONPATH"].split(os.pathsep)[1]) / "run.py"),
                          *names], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    results = {x.split()[1]: (int(x.split()[2]), int(x.split()[3])) for x in out.stdout.splitlines()
               if x.startswith("RESULT")}
    warnings = [x for x in out.stderr.splitlines() if x.startswith("torchfl:")]
    return results, warnings


@pytest.mark.parametrize("how", ["blocks", "inodes", "fsize"])
def test_a_full_cache_loads_what_it_holds_and_compiles_the_rest_in_memory(tmp_path, how):
    env = _setup(tmp_path)
    assert _run(env, ["twice"])[0] == {"twice": (0, 1)}          # compiled into the cache
    prefix = _full_prefix(how, tmp_path / "mnt")
    results, warnings = _run(env, ["twice", "thrice"], prefix)    # OSError ENOSPC before
    assert results == {"twice": (1, 0), "thrice": (0, 1)}        # loaded; compiled in memory
    assert len(warnings) == 1, warnings                          # one warning, naming why and what to do
    assert "cannot save compiled kernels" in warnings[0] and "in memory" in warnings[0], warnings
    assert ("No space left on device" if how != "fsize" else "File too large") in warnings[0], warnings
    assert "NUMBA_CACHE_DIR" in warnings[0]
    cache = tmp_path / "cache"
    if how == "fsize":                                           # the cache itself: nothing half-written
        assert not [p for p in cache.rglob("*") if ".tmp." in p.name or p.name.startswith("kmod.thrice")]
    # and with room again, the same cache saves as before
    assert _run(env, ["thrice"]) == ({"thrice": (0, 1)}, [])
    assert _run(env, ["thrice"]) == ({"thrice": (1, 0)}, [])


# ---------------------------------------------------------------- `kernels info` says what happens (case 15a)

COMPILE_ONE = ("import numpy as np\nfrom torchfl.kernels import codecs\n"
               "assert codecs.bf16_to_f32(np.uint16(0x3f80)) == 1.0\n")


def _cli(env, *args, prefix=()):
    out = subprocess.run([*prefix, sys.executable, "-m", "torchfl.cli", "kernels", "info", *args], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr[-2000:]
    return out.stdout


def _info(env, prefix=()):
    import json

    return json.loads(_cli(env, "--json", prefix=prefix))


def test_kernels_info_of_a_cache_path_that_is_a_file(tmp_path):
    """Before: "read-only (its kernels are loaded from it)" of a plain file, while the kernels
    went to the user cache. Now info names where they go, and that the file is ignored."""
    (tmp_path / "file").write_text("not a directory\n")
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "file"), XDG_CACHE_HOME=str(tmp_path / "xdg"),
               PYTHONPATH=str(ROOT))
    text = " ".join(_cli(env).split())
    assert "read-only" not in text and "loaded from it)" not in text, text
    assert f"ignored: $NUMBA_CACHE_DIR {tmp_path / 'file'} is not a directory (it is a file)" in text, text
    info = _info(env)
    assert not info["read_only"] and "is not a directory" in info["ignored"]
    goes_to = Path(info["new_kernels_go_to"])
    assert goes_to.is_relative_to(tmp_path / "xdg") and Path(info["path"]) == goes_to
    run = subprocess.run([sys.executable, "-c", COMPILE_ONE], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert [w for w in run.stderr.splitlines() if w.startswith("torchfl:")] != []     # said once, by the run
    compiled = {f["function"]: f["specialisations"] for f in _info(env)["functions"]}
    assert compiled.get("bf16_to_f32") == 1          # the kernel is where info said it goes


def test_kernels_info_of_a_cache_path_under_a_file_with_no_user_cache(tmp_path):
    (tmp_path / "file").write_text("")
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "file" / "numba"), XDG_CACHE_HOME="/proc/torchfl-no-dir",
               PYTHONPATH=str(ROOT))
    text = " ".join(_cli(env).split())
    assert text.startswith("kernel cache: none (kernels are compiled in memory, for each process)"), text
    assert "cannot be created" in text and "read-only" not in text, text
    info = _info(env)
    assert info["new_kernels_go_to"] is None and info["ignored"] and not info["read_only"]


def test_kernels_info_says_a_full_cache_is_full(tmp_path):
    env = _setup(tmp_path)
    prefix = _full_prefix("blocks", tmp_path / "mnt")
    info = _info(dict(env, PYTHONPATH=str(ROOT)), prefix)
    assert info["full"] and info["new_kernels_go_to"] == str(tmp_path / "mnt")
    text = " ".join(_cli(dict(env, PYTHONPATH=str(ROOT)), prefix=prefix).split())
    assert "full: no space left on the file system where new kernels go" in text, text
