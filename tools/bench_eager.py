"""The npu eager device: per-op overhead and whole models in four modes, side by side.

    python tools/bench_eager.py [--json] [--runs 5] [--chip NPU-V3] [--models resnet18,resnet50]
                                [--threads 1 --timer cpu]

Per-op overhead: a small op (relu, add, a 64x64 matmul) on npu tensors, called ``--op-calls``
times after a warm-up; per call the wall time minus the time inside the kernel call (the
route's ``last_kernel_s``: the bound kernel's call with its own Python wrapper, as the
executor's ``last_kernel_s`` measures it), median over calls: what eager routing adds
(dispatcher, signature, route cache, input and output wrapping). Beside it, in the same
process: the share of calls the adapter's C++ fast path served, the same op through the
Python router (the fast path bypassed), and the fast path's Python runner alone (the rest of
its figure is its C++ part: key, lookup, output tensor, the dispatcher).
The same op in torch CPU eager is listed beside it.

Models (b1 forward, batch 1, 224x224, float16 weights and input on the chip): eager npu
(every op a cached one-op plan), lazy npu (``with torch.npu.lazy()``: one planned graph per
call, with fusion), ``torch.compile(backend="torchfl")`` on the same npu tensors, and torch
CPU eager in float32 (CPU float16 convolutions are not a fair reference). Each mode is
warmed up (plans and kernel compiles) and then the four alternate ``--runs`` times;
medians. ratio_lazy_vs_compiled = lazy / compiled (target <= 1.3). The machine is shared:
compare only figures from one run, and read the load average printed with them;
``--threads 1 --timer cpu`` (one thread for torch and the kernels, the process's CPU time)
measures the work each mode does, steady while other processes load the host.

``--breakdown``: where eager's time goes, per ATen op (calls per forward, time per forward
in the op's route, and the part inside the bound kernels), after the timed runs: what
compiled mode fuses away (batch-norm, relu, add passes) against what eager's routing costs.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("NUMBA_CACHE_DIR", os.path.join(os.path.dirname(__file__), "..", ".cache", "numba"))


_clock = time.perf_counter     # --timer cpu: time.process_time


def _setup(chip, threads):
    os.environ["TORCHFL_DEVICES"] = chip
    if threads:
        os.environ["NUMBA_NUM_THREADS"] = str(threads)
    import torch

    if threads:
        torch.set_num_threads(threads)

    from torchfl.runtime import eager

    eager.register()
    eager.ensure_adapter()
    return torch


def per_op(torch, calls):
    from torchfl.runtime.eager import device, ensure_adapter, ops

    adapter = ensure_adapter()
    dev = "npu:0"
    a = torch.randn(64, 64).half().to(dev)
    b = torch.randn(64, 64).half().to(dev)
    ha, hb = a.cpu().float(), b.cpu().float()
    cases = {"relu_64x64": (lambda: torch.relu(a), lambda: torch.relu(ha), (a,)),
             "add_64x64": (lambda: a + b, lambda: ha + hb, (a, b)),
             "matmul_64x64": (lambda: a @ b, lambda: ha @ hb, (a, b))}
    out = {}
    for name, (npu_fn, cpu_fn, tensors) in cases.items():
        known = {id(r) for r in ops.routes()}
        npu_fn()
        npu_fn()
        route = _new_route(ops, known)
        hits0 = adapter.fast_stats()["hits"]
        walls, beyond = _timed(npu_fn, route, calls)
        hits = adapter.fast_stats()["hits"] - hits0
        adapter.set_bypass(1, 1)        # the Python router for every call (as in an optimizer step)
        try:
            r_walls, r_beyond = _timed(npu_fn, route, calls)
        finally:
            adapter.set_bypass(1, 0)
        runner = _runner_beyond(route, tensors, calls, device) if route.fast_runner() else None
        cpu = []
        for _ in range(calls):
            t0 = _clock()
            cpu_fn()
            cpu.append(_clock() - t0)
        out[name] = {"eager_npu_us": 1e6 * statistics.median(walls),
                     "overhead_beyond_kernel_us": 1e6 * statistics.median(beyond),
                     "fast_path_share": hits / calls,
                     "router_beyond_kernel_us": 1e6 * statistics.median(r_beyond),
                     "runner_beyond_kernel_us": runner,
                     "torch_cpu_us": 1e6 * statistics.median(cpu)}
    return out


def _timed(fn, route, calls):
    walls, beyond = [], []
    for _ in range(calls):
        t0 = _clock()
        fn()
        wall = _clock() - t0
        walls.append(wall)
        beyond.append(wall - route.last_kernel_s)
    return walls, beyond


def _runner_beyond(route, tensors, calls, device):
    """The Python part of the fast path alone: the route's runner (input views, the bound
    kernel, the output buffer's hand-over) and the free of that buffer, minus the kernel: what
    the C++ part (key, lookup, output tensor, dispatcher) adds is the op's figure minus this."""
    beyond = []
    for _ in range(calls):
        t0 = _clock()
        res = route.fast(*tensors)
        device.free(res[0])
        beyond.append(_clock() - t0 - route.last_kernel_s)
    return 1e6 * statistics.median(beyond)


def _new_route(ops, known):
    """The one-op route the case's warm-up planned (each case is a new op)."""
    routes = [r for r in ops.routes() if id(r) not in known and r.kind == "chip"]
    if len(routes) != 1:
        raise RuntimeError(f"expected the case to plan one chip route, got {len(routes)}")
    return routes[0]


def models(torch, names, runs, chip, breakdown=False):
    from torchfl.planner.zoo import load_model

    results = {}
    for name in names:
        model, (x,) = load_model(name, batch=1, image=224)
        ref_model = model.eval()
        import copy

        npu_model = copy.deepcopy(ref_model).half().to("npu:0")
        xn = x.half().to("npu:0")
        compiled = torch.compile(npu_model, backend="torchfl", options={"chip": chip})

        def eager_npu():
            return npu_model(xn)

        def lazy_npu():
            with torch.npu.lazy():
                y = npu_model(xn)
            return y

        def compiled_npu():
            return compiled(xn)

        def cpu():
            return ref_model(x)

        modes = {"eager_npu": eager_npu, "lazy_npu": lazy_npu, "compiled_npu": compiled_npu, "torch_cpu": cpu}
        first = {}
        with torch.no_grad():
            for mode, fn in modes.items():
                t0 = _clock()
                fn()
                first[mode] = _clock() - t0
                fn()
            times = {mode: [] for mode in modes}
            for _ in range(runs):
                for mode, fn in modes.items():
                    t0 = _clock()
                    fn()
                    times[mode].append(_clock() - t0)
            ref = cpu().float()
            errs = {mode: float((fn().cpu().float() - ref).abs().max() / ref.abs().max())
                    for mode, fn in modes.items() if mode != "torch_cpu"}
        med = {mode: statistics.median(t) for mode, t in times.items()}
        if breakdown:
            with torch.no_grad():
                split = _breakdown(eager_npu, runs)
        results[f"{name}_b1"] = {
            "median_s": med, "first_call_s": first, "max_rel_err_vs_cpu_fp32": errs,
            "ratio_lazy_vs_compiled": med["lazy_npu"] / med["compiled_npu"],
            "ratio_eager_vs_compiled": med["eager_npu"] / med["compiled_npu"],
            "spread_ms": {mode: [1e3 * min(t), 1e3 * max(t)] for mode, t in times.items()},
        }
        if breakdown:
            results[f"{name}_b1"]["eager_breakdown_ms"] = split
    return results


def _breakdown(fn, runs):
    """Per ATen op of an eager forward: calls, time in its route (``_clock``) and inside the
    bound kernel (wall, ``last_kernel_s``), per forward, largest first. Both entries of a route
    are timed: ``ChipRoute.call`` (the Python router) and ``ChipRoute.fast`` (the adapter's fast
    path; its cached runners are dropped so that they bind the timed one, and again after)."""
    from torchfl.runtime.eager import ensure_adapter
    from torchfl.runtime.eager.routes import ChipRoute

    acc = {}
    originals = {"call": ChipRoute.call, "fast": ChipRoute.fast}

    def timing(original):
        def timed(route, *args):
            t0 = _clock()
            try:
                return original(route, *args)
            finally:
                row = acc.setdefault(route.label, [0, 0.0, 0.0])
                row[0] += 1
                row[1] += _clock() - t0
                row[2] += route.last_kernel_s
        return timed

    adapter = ensure_adapter()
    for name, original in originals.items():
        setattr(ChipRoute, name, timing(original))
    adapter.fast_clear()
    try:
        fn()                    # the runners bind the timed entry again (not counted)
        acc.clear()
        t0 = _clock()
        for _ in range(runs):
            fn()
        total = (_clock() - t0) / runs
    finally:
        for name, original in originals.items():
            setattr(ChipRoute, name, original)
        adapter.fast_clear()
    rows = {label: {"calls": n // runs, "ms": 1e3 * t / runs, "kernel_ms": 1e3 * k / runs}
            for label, (n, t, k) in sorted(acc.items(), key=lambda kv: -kv[1][1])}
    rows["(forward)"] = {"calls": 1, "ms": 1e3 * total, "kernel_ms": None}
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--op-calls", type=int, default=200)
    ap.add_argument("--chip", default="NPU-V3")
    ap.add_argument("--models", default="resnet18,resnet50")
    ap.add_argument("--threads", type=int, default=0,
                    help="threads for torch and the emulator's kernels (default: all cores)")
    ap.add_argument("--breakdown", action="store_true", help="eager's time per ATen op (after the timed runs)")
    ap.add_argument("--timer", choices=("wall", "cpu"), default="wall",
                    help="cpu: the process's CPU time (steady on a loaded host with --threads 1)")
    args = ap.parse_args(argv)
    global _clock
    if args.timer == "cpu":
        _clock = time.process_time
    torch = _setup(args.chip, args.threads)
    load0 = os.getloadavg()
    out = {"chip": args.chip, "runs": args.runs, "threads": torch.get_num_threads(), "timer": args.timer,
           "per_op": per_op(torch, args.op_calls),
           "models": models(torch, [m for m in args.models.split(",") if m], args.runs, args.chip, args.breakdown),
           "loadavg": [load0, os.getloadavg()]}
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        for name, r in out["per_op"].items():
            runner = r["runner_beyond_kernel_us"]
            print(f"{name:14s} eager npu {r['eager_npu_us']:8.1f} us  beyond kernel {r['overhead_beyond_kernel_us']:6.1f} us"
                  f" (fast path {100 * r['fast_path_share']:.0f}% of calls; its Python runner "
                  f"{'-' if runner is None else f'{runner:.1f}'} us; the Python router instead "
                  f"{r['router_beyond_kernel_us']:.1f} us)  torch cpu {r['torch_cpu_us']:6.1f} us")
        for name, r in out["models"].items():
            m = r["median_s"]
            print(f"{name}: " + "  ".join(f"{k} {1e3 * v:.1f} ms" for k, v in m.items())
                  + f"  lazy/compiled {r['ratio_lazy_vs_compiled']:.2f}  eager/compiled "
                  f"{r['ratio_eager_vs_compiled']:.2f}  eager/torch_cpu {m['eager_npu'] / m['torch_cpu']:.2f}")
            for label, row in r.get("eager_breakdown_ms", {}).items():
                kernel = "" if row["kernel_ms"] is None else f"  in kernels (wall) {row['kernel_ms']:7.1f} ms"
                print(f"    {label:34s} {row['calls']:4d} calls {row['ms']:7.1f} ms{kernel}")
        print("load average", out["loadavg"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
