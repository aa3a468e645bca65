"""Issue 39: the what-if commands on bad input. Each case gave a traceback (39 to 283 lines),
allocated example inputs before checking the batch (409 GB at --batch 100000000), checked
-o only after planning, truncated the old report on a full disk, or exited 0 on
``--models ,``. Now: one line on stderr, exit 1 (2 for a usage error), -o checked first,
the report written by rename."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from torchfl.cli.main import cli

ROOT = Path(__file__).resolve().parents[2]

MODELS = '''
import pathlib, torch

def _called():
    pathlib.Path(__file__).with_suffix(".called").touch()

def raises():
    _called()
    raise ValueError("boom in the factory")

def nonmodule():
    _called()
    return "not a module", (torch.randn(2, 16),)

def no_tensors():
    _called()
    return torch.nn.Linear(16, 8), ("x",)

def wrong_shape():
    _called()
    return torch.nn.Linear(16, 8), (torch.randn(4, 10),)

def ok(batch=4):
    _called()
    return torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU()), (torch.randn(batch, 16),)
'''


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    from torchfl.registry import Registry

    tmp = tmp_path_factory.mktemp("whatif-faults")
    url = f"sqlite:///{tmp / 'registry.db'}"
    Registry(url).init(seed=True)
    (tmp / "models.py").write_text(MODELS)
    return url, tmp / "models.py"


def plan(url, *args):
    res = CliRunner().invoke(cli, ["plan", *args, "--registry", url])
    return res.exit_code, res.stderr, res.stdout


@pytest.mark.parametrize("factory,words", [
    ("raises", "the model factory {m}:raises raised ValueError: boom in the factory (at {m}:"),
    ("nonmodule", "{m}:nonmodule returned str as the module"),
    ("no_tensors", "{m}:no_tensors returned tuple as example_inputs"),
    ("wrong_shape", "forward fails on its example inputs ((4, 10) float32): RuntimeError: a and b must have same "
                    "reduction dim"),
])
@pytest.mark.parametrize("command", [["memory", "--chip", "TFL-X1"], ["memory", "--chip", "TFL-X1", "--training"],
                                     ["compare", "--chips", "TFL-X1,NPU-V3"]])
def test_a_bad_user_model_is_one_line(env, factory, words, command):
    url, models = env
    code, err, out = plan(url, command[0], f"{models}:{factory}", *command[1:])
    assert code == 1, err + out
    assert err.count("\n") == 1 and err.startswith("Error: "), err
    assert words.format(m=models) in err, err
    assert "Traceback" not in err + out


def test_a_huge_batch_is_refused_before_the_inputs_are_built(env):
    url, _ = env
    start = time.perf_counter()
    peak0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    code, err, _ = plan(url, "memory", "resnet18", "--chip", "NPU-V3", "--batch", "100000000")
    assert code == 1 and err.count("\n") == 1, err
    assert "Batch size 100,000,000 exceeds max_batch_size 512 of NPU-V3" in err and "--batch 512" in err, err
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak0 < 200_000  # KiB: no 409 GB attempt
    assert time.perf_counter() - start < 60
    code, err, _ = plan(url, "compare", "resnet18", "--chips", "NPU-V2,NPU-V3", "--batch", "100000000")
    assert code == 1 and "exceeds max_batch_size" in err and "every chip given" in err, err


def test_a_huge_sequence_is_refused_before_the_inputs_are_built(env):
    url, _ = env
    code, err, _ = plan(url, "memory", "bert-base", "--chip", "NPU-V3", "--seq-len", "100000000")
    assert code == 1 and err.count("\n") == 1, err
    assert "Sequence length 100,000,000 exceeds max_sequence_length 8,192 of NPU-V3" in err, err
    code, err, _ = plan(url, "max-batch", "bert-base", "--chip", "NPU-V3", "--seq-len", "100000000")
    assert code == 1 and "exceeds max_sequence_length" in err, err


def test_impact_with_no_model_is_a_usage_error(env):
    url, _ = env
    for models in (",", " , ,"):
        code, err, _ = plan(url, "impact", "--chip", "NPU-V3", "--from", "1.0.0", "--to", "1.0.0", "--models", models)
        assert code == 2 and err.count("\n") == 1 and "names no model" in err, (code, err)


@pytest.mark.parametrize("where", ["missing/dir/report.html", "/proc/self/report.html"])
def test_an_unwritable_output_is_refused_before_planning(env, tmp_path, where):
    url, models = env
    marker = models.with_suffix(".called")
    marker.unlink(missing_ok=True)
    output = where if where.startswith("/") else str(tmp_path / where)
    code, err, _ = plan(url, "report", f"{models}:ok", "--chip", "TFL-X1", "-o", output)
    assert code == 1 and err.count("\n") == 1 and output.rstrip("/") in err, err
    assert not marker.exists()    # the model was never loaded, let alone planned


def _limit_file_size(limit: int):
    def apply():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)    # a write past the limit fails with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def test_a_full_disk_leaves_the_old_report_intact(env, tmp_path):
    url, models = env
    output = tmp_path / "report.html"
    old = "<html>the old report</html>\n" * 10
    output.write_text(old)
    run = subprocess.run([sys.executable, "-m", "torchfl.cli", "plan", "report", f"{models}:ok", "--chip", "TFL-X1",
                          "-o", str(output), "--registry", url], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, preexec_fn=_limit_file_size(64 << 10),
                         timeout=600)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "could not write" in run.stderr and "the old file is unchanged" in run.stderr, run.stderr
    assert "Traceback" not in run.stderr
    assert output.read_text() == old                       # truncated to the limit before
    assert [p.name for p in tmp_path.iterdir()] == ["report.html"]   # no temporary file left


def test_the_report_is_written_by_rename_with_the_old_mode(env, tmp_path):
    url, models = env
    output = tmp_path / "report.html"
    output.write_text("old")
    output.chmod(0o640)
    inode = output.stat().st_ino
    code, err, out = plan(url, "report", f"{models}:ok", "--chip", "TFL-X1", "-o", str(output))
    assert code == 0, err
    assert output.stat().st_ino != inode and (output.stat().st_mode & 0o777) == 0o640
    assert output.read_text().lstrip().lower().startswith("<!doctype html")
