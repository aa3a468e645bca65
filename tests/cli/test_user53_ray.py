"""Issue 53 point 5: the one-machine Ray recipe (docs/CLUSTER.md, run verbatim with Ray by
tests/test_readme.py) must stop when *its* head did not start: on a host where the port was
taken, the old recipe sent `--cluster` to another user's cluster and left its temporary folder.
Here `ray start` fails as it does on a taken port; the recipe must exit non-zero, never call
torchfl, and remove its folder. (The stand-ins are two shell scripts on PATH: the recipe's
control flow is what is tested; its success path runs against a real Ray in test_readme.)"""
from __future__ import annotations

import os
import stat
import subprocess
import sys

from tests.test_readme import BLOCKS


def _recipe() -> str:
    (block,) = [b for b in BLOCKS if b.page == "docs/CLUSTER.md" and b.lang == "sh"]
    return block.text


def _stub(path, text):
    path.write_text("#!/bin/sh\n" + text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def test_recipe_picks_a_free_port_and_cleans_up():
    text = _recipe()
    assert "6390" not in text and 'socket.socket()' in text and "trap stop EXIT" in text
    assert '--cluster "127.0.0.1:$PORT"' in text


def test_recipe_stops_when_its_head_did_not_start(tmp_path):
    bin_dir, tmp = tmp_path / "bin", tmp_path / "tmp"
    bin_dir.mkdir()
    tmp.mkdir()
    _stub(bin_dir / "ray", 'echo "ConnectionError: GCS port already in use"; exit 1\n')
    _stub(bin_dir / "torchfl", f'touch {tmp_path}/torchfl-called\n')
    _stub(bin_dir / "python", f'exec {sys.executable} "$@"\n')
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", TMPDIR=str(tmp))
    res = subprocess.run(["bash", "-e", "-c", _recipe()], env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode != 0, res.stdout + res.stderr
    assert "the Ray head did not start" in res.stdout and "already in use" in res.stdout, res.stdout
    assert not (tmp_path / "torchfl-called").exists()     # no sweep sent to someone else's cluster
    assert list(tmp.iterdir()) == []                       # RAY_TMPDIR removed
