"""Issue 35's point for the eager device: no ``except Exception`` turns a bug or a user's
mistake into a silent eager/host fallback or into "not available".

* A ``TORCHFL_DEVICES`` naming a chip the registry lacks: ``torch.npu.is_available()``
  raises the ValueError that names it (was: False), and an npu tensor's "npu:0 does not
  exist" error says why the list is empty, after one RuntimeWarning from the adapter's
  device count (which must stay noexcept; was: 0 devices, silently).
* Tracing an op alone: only what tracing refuses (RuntimeError: no fake kernel, data-dependent
  shapes) becomes a host fallback; torch's own refusal of the arguments (IndexError for a dim
  out of range) reaches the user as torch's error, also under strict mode (was: "strict"
  refusing a host fallback), and a bug in the tracer propagates.
* Lazy mode: a bug while computing an op's outputs from its meta kernel propagates (was: the
  op silently ran eagerly).
"""
import subprocess
import sys

import pytest
import torch

from tests.eager.test_autoload import _probe_env

BAD_DEVICES = r"""
import warnings
warnings.simplefilter("always")
import torch
try:
    print("available", torch.npu.is_available())
except ValueError as exc:
    print("available", "ValueError", "NO-SUCH-CHIP" in str(exc) and "registered chips" in str(exc))
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    try:
        torch.empty(2, device="npu:0")
        print("empty", "ok")
    except RuntimeError as exc:
        print("empty", "RuntimeError", "does not exist" in str(exc) and "NO-SUCH-CHIP" in str(exc))
print("warned", sum("NO-SUCH-CHIP" in str(w.message) and w.category is RuntimeWarning for w in caught))
"""


def test_bad_torchfl_devices_is_a_clear_error_not_unavailable(tmp_path):
    from torchfl.runtime.eager.build import build_dir

    env = _probe_env(tmp_path, TORCHFL_ADAPTER_DIR=str(build_dir().parent), TORCHFL_DEVICES="NO-SUCH-CHIP")
    out = subprocess.run([sys.executable, "-c", BAD_DEVICES], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    got = dict(line.split(" ", 1) for line in out.stdout.strip().splitlines())
    assert got["available"] == "ValueError True", got
    assert got["empty"] == "RuntimeError True", got
    assert got["warned"] == "1", got


def test_torch_refusing_the_arguments_is_its_own_error_even_strict(fp32_dev, monkeypatch):
    x = torch.randn(3, 4, device=fp32_dev)
    monkeypatch.setenv("TORCHFL_STRICT", "1")
    with pytest.raises(IndexError, match="Dimension out of range"):
        torch.sum(x, 5)
    monkeypatch.delenv("TORCHFL_STRICT")
    with pytest.raises(IndexError, match="Dimension out of range"):
        torch.sum(x, 7)


def test_a_tracer_bug_is_not_a_host_fallback(fp32_dev, monkeypatch):
    from torchfl.runtime.eager import ops, routes

    def broken(*_args, **_kwargs):
        raise AttributeError("injected: a bug in the one-op tracer")

    monkeypatch.setattr(routes, "trace_op", broken)
    before = ops.STATS["host_fallback_ops"]
    x = torch.randn(5, 13, device=fp32_dev)              # a signature no other test plans
    with pytest.raises(AttributeError, match="injected"):
        torch.tanh(x)
    assert ops.STATS["host_fallback_ops"] == before


def test_a_meta_bug_in_lazy_mode_is_not_an_eager_run(fp32_dev, monkeypatch):
    from torchfl.runtime.eager import lazy

    def broken(*_args, **_kwargs):
        raise TypeError("injected: a bug while reading the meta outputs")

    monkeypatch.setattr(lazy, "_outputs_meta", broken)
    x = torch.randn(7, 11, device=fp32_dev)              # a signature no other test records
    with pytest.raises(TypeError, match="injected"):
        with torch.npu.lazy():
            torch.sigmoid(x)
