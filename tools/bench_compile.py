"""Cold first call: torch.compile(backend="torchfl") beside torch.compile(backend="inductor").

    python tools/bench_compile.py [--json] [--cases resnet50_b1,bert_layer_s128]
                                  [--backends torchfl,inductor] [--runs 3] [--demo | --demo-quick]
                                  [--profile]

Each (case, backend) runs in a fresh Python process with empty caches of its own (a new
``NUMBA_CACHE_DIR`` for torchfl, a new ``TORCHINDUCTOR_CACHE_DIR`` for Inductor, a new
``XDG_CACHE_HOME`` for both), so ``first_call_s`` is what a new user's first call costs:
capture, planning (or Inductor's lowering and C++ build) and every kernel compile, plus
the run. The model is built before the clock starts. ``second_call_s`` is the call after
it (for torchfl, what the first call left to compile: kernel paths of frozen weights),
``warm_s`` the median of ``--runs`` later calls, ``eager_s`` eager torch fp32 on the same inputs; for torchfl
``numba_compile_s`` is the time spent inside Numba compiles (``numba:compile`` events,
outermost only) and ``functions_compiled`` how many dispatchers compiled.

The torchfl cases use the float16 policy on NPU-V3 (the demo's setting); Inductor compiles
the same fp32 model. The registry is the caller's (its creation is not kernel compile).
``--demo`` / ``--demo-quick`` also time a cold ``torchfl demo`` (``--quick``) process, with
an empty kernel cache, as a whole. The load average is recorded before and after: the
machine this project runs on is shared, compare only figures from one run.

``--profile`` adds, for torchfl, where this process's compile time went
(``tools/compile_profile.py``): per jitted function, CPU seconds of Numba's passes and of
LLVM's (function passes, module optimisation, machine code), and ``before_first_compile_s``
(capture and planning: the first call's time before its first compile). Compiles in helper
processes are not in it: run with ``TORCHFL_COMPILE_HELPERS=0`` to see every function.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CASES = {
    # name: (zoo model, load_model options, chip, precision, note)
    "resnet50_b1": ("resnet50", dict(batch=1, image=224), "NPU-V3", "float16", "ResNet-50, 1x3x224x224"),
    "bert_layer_s128": ("bert-base", dict(batch=1, seq_len=128, layers=1, num_heads=8), "NPU-V3", "float16",
                        "BERT-base encoder layer (768 hidden, 8 heads, as in the demo), 128 tokens"),
}
BACKENDS = ("torchfl", "inductor")


def _tensor(out):
    if hasattr(out, "last_hidden_state"):
        return out.last_hidden_state
    return out[0] if isinstance(out, (tuple, list)) else out


def child(case: str, backend: str, runs: int, profile: bool = False) -> dict:
    """One cold measurement, in this (fresh) process."""
    import warnings

    warnings.filterwarnings("ignore")
    t_import = time.perf_counter()
    import torch

    from torchfl.planner.zoo import load_model

    zoo, kw, chip, precision, _note = CASES[case]
    model, inputs = load_model(zoo, **kw)
    import_s = time.perf_counter() - t_import
    compile_events = []
    prof = None
    if backend == "torchfl" and profile:
        from compile_profile import Profile

        prof = Profile().install()
    if backend == "torchfl":
        from torchfl.kernels.compiling import subscribe

        subscribe(lambda ev: compile_events.append(ev.seconds) if ev.kind == "end" else None)
        compiled = torch.compile(model, backend="torchfl", options={"chip": chip, "precision": precision})
    else:
        compiled = torch.compile(model, backend="inductor")
    with torch.no_grad():
        t0 = t_call = time.perf_counter()
        y = _tensor(compiled(*inputs))
        first = time.perf_counter() - t0
        warm, eager = [], []
        for _ in range(runs):
            t0 = time.perf_counter()
            compiled(*inputs)
            warm.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            ref = _tensor(model(*inputs))
            eager.append(time.perf_counter() - t0)
    rel = float((y.float() - ref.float()).abs().max() / ref.float().abs().max())
    out = {"case": case, "backend": backend, "first_call_s": first, "second_call_s": warm[0] if warm else None,
           "warm_s": statistics.median(warm),
           "eager_s": statistics.median(eager), "rel_err_vs_eager": rel, "setup_s": import_s}
    if backend == "torchfl":
        out.update(numba_compile_s=sum(compile_events), functions_compiled=len(compile_events))
    if prof is not None:
        out["profile"] = prof.report()
        out["before_first_compile_s"] = None if prof.first_compile_wall is None else prof.first_compile_wall - t_call
        out["compile_cpu_s"] = round(sum(r["cpu_s"] for r in out["profile"]), 3)
    return out


def _cold_env(tmp: Path) -> dict:
    env = dict(os.environ)
    env["NUMBA_CACHE_DIR"] = str(tmp / "numba")
    env["TORCHINDUCTOR_CACHE_DIR"] = str(tmp / "inductor")
    env["XDG_CACHE_HOME"] = str(tmp / "xdg-cache")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def measure(case: str, backend: str, runs: int, profile: bool = False) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="torchfl-bench-compile-"))
    try:
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, __file__, "--child", case, backend, "--runs", str(runs)]
                              + (["--profile"] if profile else []),
                              env=_cold_env(tmp), capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            return {"case": case, "backend": backend, "error": " | ".join(tail)[-400:]}
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        result["process_wall_s"] = wall
        return result
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def measure_demo(quick: bool) -> dict:
    """A cold ``torchfl demo`` process as a whole (its output discarded: a pipe)."""
    tmp = Path(tempfile.mkdtemp(prefix="torchfl-bench-demo-"))
    try:
        cmd = [sys.executable, "-m", "torchfl.cli", "demo"] + (["--quick"] if quick else [])
        load = os.getloadavg()[0]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, env=_cold_env(tmp), capture_output=True, text=True)
        wall = time.perf_counter() - t0
        out = {"case": "demo" + (" --quick" if quick else ""), "backend": "torchfl", "wall_s": wall,
               "exit_code": proc.returncode, "load_before": load, "load_after": os.getloadavg()[0]}
        if proc.returncode != 0:
            out["error"] = (proc.stderr or proc.stdout).strip().splitlines()[-1:][0][-300:]
        return out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _line(r: dict) -> str:
    if "error" in r:
        return f"{r['case']:<16} {r['backend']:<9} ERROR {r['error']}"
    if "wall_s" in r:
        return f"{r['case']:<16} {r['backend']:<9} cold wall {r['wall_s']:.1f} s (load {r['load_before']:.2f})"
    extra = (f"  numba compile {r['numba_compile_s']:.1f} s in {r['functions_compiled']} functions"
             if "numba_compile_s" in r else "")
    return (f"{r['case']:<16} {r['backend']:<9} first call {r['first_call_s']:7.1f} s  second "
            f"{r['second_call_s']:6.2f} s  warm "
            f"{r['warm_s'] * 1e3:8.1f} ms  eager {r['eager_s'] * 1e3:7.1f} ms  rel err "
            f"{r['rel_err_vs_eager']:.1e}{extra}")


def _profile_lines(r: dict) -> list[str]:
    """The profile of one torchfl run as a table (CPU seconds, largest first)."""
    if "profile" not in r:
        return []
    first = r["before_first_compile_s"]
    lines = [f"  compile CPU {r['compile_cpu_s']:.1f} s; before the first compile "
             + ("(none)" if first is None else f"{first:.1f} s wall"),
             f"  {'cpu s':>7} {'numba':>7} {'fn pass':>7} {'mod opt':>7} {'codegen':>7}  function"]
    for p in r["profile"]:
        lines.append(f"  {p['cpu_s']:7.2f} {p['numba_passes_s']:7.2f} {p['llvm_function_passes_s']:7.2f} "
                     f"{p['llvm_module_opt_s']:7.2f} {p['llvm_codegen_s']:7.2f}  {p['function']}"
                     + (f" x{p['compiles']}" if p["compiles"] > 1 else ""))
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--backends", default=",".join(BACKENDS))
    ap.add_argument("--runs", type=int, default=3, help="warm calls after the first (median)")
    ap.add_argument("--demo", action="store_true", help="also time a cold `torchfl demo`")
    ap.add_argument("--demo-quick", action="store_true", help="also time a cold `torchfl demo --quick`")
    ap.add_argument("--profile", action="store_true",
                    help="per jitted function: compile CPU seconds, Numba's passes vs LLVM's (this process only)")
    ap.add_argument("--child", nargs=2, metavar=("CASE", "BACKEND"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        print(json.dumps(child(*a.child, a.runs, a.profile)))
        return 0
    cases, backends = a.cases.split(","), a.backends.split(",")
    for c in cases:
        if c not in CASES:
            ap.error(f"unknown case {c!r}; choose from {', '.join(CASES)}")
    for b in backends:
        if b not in BACKENDS:
            ap.error(f"unknown backend {b!r}; choose from {', '.join(BACKENDS)}")
    load_before = os.getloadavg()
    results = []
    for c in cases:
        for b in backends:
            results.append(measure(c, b, a.runs, a.profile))
            if not a.json:
                print("\n".join([_line(results[-1])] + _profile_lines(results[-1])), flush=True)
    for quick in [q for q, on in ((False, a.demo), (True, a.demo_quick)) if on]:
        results.append(measure_demo(quick))
        if not a.json:
            print(_line(results[-1]), flush=True)
    summary = {}
    for c in cases:
        by = {r["backend"]: r for r in results if r["case"] == c and "error" not in r}
        if "torchfl" in by and "inductor" in by:
            summary[c] = {"torchfl_over_inductor_first_call": by["torchfl"]["first_call_s"]
                          / by["inductor"]["first_call_s"]}
    report = {"cpus": os.cpu_count(), "load_before": load_before, "load_after": os.getloadavg(),
              "utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "results": results, "summary": summary}
    if a.json:
        json.dump(report, sys.stdout, indent=2)
        print()
    else:
        for c, s in summary.items():
            print(f"{c}: torchfl / inductor first call = {s['torchfl_over_inductor_first_call']:.2f}")
        print(f"load average before {load_before[0]:.2f}, after {report['load_after'][0]:.2f}")
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
