"""Issue 53 point 6: `make demo`'s warmup printed torchao's "Failed to load ..." lines and
torch's _pytree deprecations (228-280 columns): its workers are spawned processes, which run
the `torchfl` console script again as their ``__mp_main__`` and never call ``main()``. The CLI
module silences those loggers when it is imported, so a spawned worker is quiet too."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# what pip writes as the `torchfl` console script, plus a spawned child that reports its loggers
SCRIPT = """\
import sys
from torchfl.cli.main import main


def child(queue):
    import logging
    queue.put([logging.getLogger(n).getEffectiveLevel() for n in ("torchao", "torch.utils._pytree")])


if __name__ == "__main__":
    import multiprocessing
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=child, args=(queue,))
    proc.start()
    print(queue.get(timeout=300))
    proc.join()
"""


def test_a_spawned_worker_of_the_cli_is_quiet(tmp_path):
    import logging

    script = tmp_path / "torchfl"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHFL_")}
    env["PYTHONPATH"] = str(ROOT)
    res = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == str([logging.ERROR, logging.ERROR]), res.stdout


def test_torchfl_itself_leaves_other_programs_logging_alone(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHFL_")}
    env["PYTHONPATH"] = str(ROOT)
    code = "import logging, torchfl; print(logging.getLogger('torchao').getEffectiveLevel())"
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert res.stdout.strip() == "30", res.stdout + res.stderr           # WARNING: as Python configures it
