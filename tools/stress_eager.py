"""Concurrent eager ``npu`` ops from many Python threads, each result checked against CPU torch.

Issue 52 case 1: two threads running new ops on ``npu:0`` at once died (a device-memory scope
shared by threads). Each thread here runs a mix of ops (elementwise, matmul, reductions,
softmax, layer-norm, cat, conv, in-place, an input passed twice) at shapes drawn afresh, so
new routes are planned and first-run by the executor while other threads run warm ones; every
result is compared with the same op on CPU torch.

    python tools/stress_eager.py --minutes 10 --threads 8            # the soak run (issue 52)
    python tools/stress_eager.py --calls 40 --threads 8 --json       # a bounded run

``tests/eager/test_threads.py`` runs :func:`stress` for a bounded number of calls.
Exit status: 0 when no call failed or differed, 1 otherwise (the first failures printed).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import threading
import time
import traceback

os.environ.setdefault("TORCHFL_DEVICES", "TFL-X1,NPU-V3,EDGE-C2")

import numpy as np  # noqa: E402
import torch  # noqa: E402

__all__ = ["OPS", "stress", "one_call"]


def _t(rng, *shape):
    """A float32 CPU tensor of ``shape``, its values drawn from ``rng`` (a thread's own)."""
    return torch.from_numpy(np.random.default_rng(rng.getrandbits(32)).standard_normal(shape).astype(np.float32))


def _dim(rng, lo=1, hi=48):
    return rng.randint(lo, hi)


def _matmul(rng, dev):
    m, k, n = _dim(rng), _dim(rng), _dim(rng)
    a, b = _t(rng, m, k), _t(rng, k, n)
    return (a.to(dev) @ b.to(dev)), a @ b


def _add_alias(rng, dev):
    a = _t(rng, _dim(rng), _dim(rng))
    d = a.to(dev)
    return d + d, a + a


def _add_broadcast(rng, dev):
    m, n = _dim(rng), _dim(rng)
    a, b = _t(rng, m, n), _t(rng, n)
    return a.to(dev) + b.to(dev), a + b


def _scalar_mul_relu(rng, dev):
    a = _t(rng, _dim(rng), _dim(rng))
    s = rng.choice([0.5, 2.0, -1.5])
    return torch.relu(a.to(dev) * s), torch.relu(a * s)


def _softmax(rng, dev):
    a = _t(rng, _dim(rng), _dim(rng, 2))
    return torch.softmax(a.to(dev), dim=-1), torch.softmax(a, dim=-1)


def _sum(rng, dev):
    a = _t(rng, _dim(rng), _dim(rng), _dim(rng, 1, 8))
    dim = rng.randint(0, 2)
    return a.to(dev).sum(dim), a.sum(dim)


def _layer_norm(rng, dev):
    n = _dim(rng, 2)
    a, w, b = _t(rng, _dim(rng), n), _t(rng, n), _t(rng, n)
    return (torch.nn.functional.layer_norm(a.to(dev), (n,), w.to(dev), b.to(dev)),
            torch.nn.functional.layer_norm(a, (n,), w, b))


def _cat_transpose(rng, dev):
    m, n = _dim(rng), _dim(rng)
    a, b = _t(rng, m, n), _t(rng, _dim(rng), n)
    return torch.cat([a.to(dev), b.to(dev)]).t().contiguous(), torch.cat([a, b]).t().contiguous()


def _gelu_sigmoid(rng, dev):
    a = _t(rng, _dim(rng), _dim(rng))
    return torch.sigmoid(torch.nn.functional.gelu(a.to(dev))), torch.sigmoid(torch.nn.functional.gelu(a))


def _inplace(rng, dev):
    a = _t(rng, _dim(rng), _dim(rng))
    b = _t(rng, *a.shape)
    d = a.to(dev)
    d.add_(b.to(dev))
    return d, a + b


def _conv2d(rng, dev):
    c, o, hw = _dim(rng, 1, 4), _dim(rng, 1, 6), _dim(rng, 3, 12)
    x, w = _t(rng, 1, c, hw, hw), _t(rng, o, c, 3, 3)
    return (torch.nn.functional.conv2d(x.to(dev), w.to(dev), padding=1),
            torch.nn.functional.conv2d(x, w, padding=1))


OPS = {"matmul": _matmul, "add_alias": _add_alias, "add_broadcast": _add_broadcast,
       "scalar_mul_relu": _scalar_mul_relu, "softmax": _softmax, "sum": _sum, "layer_norm": _layer_norm,
       "cat_transpose": _cat_transpose, "gelu_sigmoid": _gelu_sigmoid, "inplace_add": _inplace,
       "conv2d": _conv2d}


def one_call(name, rng, dev):
    """Run op ``name`` once on ``dev`` at shapes drawn from ``rng``; None when the result equals
    CPU torch's (to float32 rounding), else what differed."""
    got, want = OPS[name](rng, dev)
    got = got.cpu()
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"{name}: {tuple(got.shape)} {got.dtype}, CPU torch gives {tuple(want.shape)} {want.dtype}"
    scale = max(1.0, float(want.abs().max())) if want.numel() else 1.0
    if not torch.allclose(got, want, rtol=1e-4, atol=1e-4 * scale):
        err = float((got - want).abs().max())
        return f"{name} {tuple(want.shape)}: max abs difference {err:.3g} from CPU torch"
    return None


def stress(threads: int = 8, dev: str = "npu:0", calls: int | None = None, seconds: float | None = None,
           seed: int = 52, join_s: float = 600.0) -> dict:
    """``threads`` threads each run ``calls`` ops (or until ``seconds`` passed), started together.
    Returns {"calls", "errors" (list of strings), "by_op", "hung" (threads still running after
    ``join_s``), "seconds"}."""
    if (calls is None) == (seconds is None):
        raise ValueError("give calls or seconds")
    names = sorted(OPS)
    errors: list = []
    counts = [0] * threads
    by_op: dict = {n: 0 for n in names}
    lock = threading.Lock()
    start = threading.Barrier(threads)
    deadline = [0.0]

    def work(i):
        rng = random.Random(seed * 1000 + i)
        try:
            start.wait()
        except threading.BrokenBarrierError:
            return
        k = 0
        while (calls is not None and k < calls) or (seconds is not None and time.monotonic() < deadline[0]):
            name = names[(i + k) % len(names)] if k < len(names) else rng.choice(names)
            k += 1
            try:
                bad = one_call(name, rng, dev)
            except Exception as exc:        # what the user would see: recorded, the thread goes on
                bad = f"{name}: {type(exc).__name__}: {exc}\n{traceback.format_exc(limit=-4)}"
            with lock:
                counts[i] += 1
                by_op[name] += 1
                if bad:
                    errors.append(f"thread {i}: {bad}")

    t0 = time.monotonic()
    deadline[0] = t0 + (seconds or 0)
    pool = [threading.Thread(target=work, args=(i,), name=f"stress-{i}", daemon=True) for i in range(threads)]
    for t in pool:
        t.start()
    end = time.monotonic() + join_s + (seconds or 0)
    for t in pool:
        t.join(max(0.0, end - time.monotonic()))
    hung = [t.name for t in pool if t.is_alive()]
    return {"threads": threads, "device": dev, "calls": sum(counts), "errors": errors, "by_op": by_op,
            "hung": hung, "seconds": round(time.monotonic() - t0, 1)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=8)
    p.add_argument("--device", default="npu:0")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--minutes", type=float, help="run this long (the soak mode)")
    g.add_argument("--calls", type=int, help="ops per thread")
    p.add_argument("--seed", type=int, default=52)
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    if a.threads < 1 or a.threads > 256:
        p.error("--threads must be 1..256")
    seconds = a.minutes * 60 if a.minutes is not None else None
    calls = a.calls if a.calls is not None else (None if seconds is not None else 20)
    import torchfl  # noqa: F401  (registers the npu device)

    out = stress(a.threads, a.device, calls=calls, seconds=seconds, seed=a.seed)
    out["errors_count"] = len(out["errors"])
    if a.json:
        print(json.dumps({**out, "errors": out["errors"][:20]}, indent=1))
    else:
        print(f"{out['calls']} calls on {a.device} from {a.threads} threads in {out['seconds']} s: "
              f"{len(out['errors'])} errors, {len(out['hung'])} hung threads")
        for e in out["errors"][:5]:
            print(e, file=sys.stderr)
    return 0 if not out["errors"] and not out["hung"] else 1


if __name__ == "__main__":
    sys.exit(main())
