"""End-to-end benchmark: models compiled with backend="torchfl" vs eager torch, side by side.

    python tools/bench_e2e.py [--json] [--runs 5] [--cases resnet50_b1,bert_layer_s128,gpt2_small_s128,
                                                   resnet50_b8,bert_base_s512] [--threads N | 1,2]

Per case: the first call (plan + Numba kernel compile + run) is timed as first_compile_s;
one more warm-up call; then ``--runs`` alternating timed calls of the compiled model and of
eager torch fp32 on the same inputs, and their medians: torchfl_s, torch_eager_s,
ratio = torch_eager_s / torchfl_s. Eager is also timed alone before torchfl runs anything
(torch_eager_alone_s, ratio_vs_eager_alone), and the compiled model alone before the
alternating runs (torchfl_alone_s, ratio_alone = the two alone): each runtime's idle worker
threads can slow the other down when the two alternate on 2 cores. spread_ms gives min,
quartiles and max of each series. ``--threads 1 --timer cpu`` measures CPU time on one
thread per side instead: on a shared host wall time swings several-fold with the other
processes' load (eager torch's OpenMP threads suffer most), CPU time does not.

Executor overhead = wall time of the plan's executors (``Executor.run``: static-cache check,
input upload, every step, output download) minus the wall time inside kernel calls (each
kernel's ``run`` including its own Python wrapper -- problem check, output allocation,
counters -- and the torch call of a host step), median over runs; divided by the plan's steps
(executor_overhead_per_step_us, the issue's figure) and by the steps a warm call executes
(static steps cached: executor_overhead_per_executed_step_us). The backend's Dynamo guard
and argument handling before ``Executor.run`` is in torchfl_s but in neither overhead figure.
The machine is shared: compare only figures from one run.

``--inductor``: each model is also compiled with torch's Inductor (CPU, ``backend="inductor"``) in the
same process; after its first call (``inductor_first_s``) and one warm call it is timed in the same
alternating rounds as the compiled model and eager torch (``inductor_s``; ``ratio_vs_inductor`` =
inductor_s / torchfl_s: above 1, the torchfl path is the faster), so the comparison with the peer
compiler is one table measured under one load.

``--paired`` (with ``--threads 1,2``): the speed-up from pairs instead of fresh processes. One process
(Numba's pool sized for the largest count) calls the compiled model and eager torch at each thread count
in turn (``numba.set_num_threads`` and ``torch.set_num_threads`` between calls, the order reversed every
round), so each round's calls meet the same moment of the host's load; the speed-up is the median of the
rounds' ratios (one count's wall over the other's, same round). Two processes run minutes apart meet
different loads: on this shared 2-core host the same code's sequential ratio spread 1.51-1.96.

``--balance`` (with ``--threads 1,2``) says why two threads fall short of 2x, from CPU clocks, so it holds on
a loaded host: per kernel the calling thread's CPU outside parallel regions (serial), each thread's busy CPU
in each region, and the busiest thread's sum (``OMP_WAIT_POLICY=passive`` for the run, so a worker that waits
sleeps instead of spinning into its CPU time). ``split xN`` = CPU / (serial + busiest thread's): the speed-up
the split of the work allows; ``work xN`` = CPU at N threads / at 1 (> 1: the threads slow each other or
duplicate work), both from one process (the largest count's), its model calls at each count alternating:
CPU time per call is steady against the host's load only when taken at the same moments (_balance).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time


CASES = {
    # name: (zoo model, options to load_model, chip, precision, note)
    "resnet50_b1": ("resnet50", dict(batch=1, image=224), "NPU-V3", "float16", "ResNet-50, 1x3x224x224"),
    "bert_layer_s128": ("bert-large", dict(batch=1, seq_len=128, layers=1), "NPU-V3", "float16",
                        "BERT-large-shaped encoder layer (1024 hidden, 16 heads), 128 tokens"),
    "gpt2_small_s128": ("gpt2", dict(batch=1, seq_len=128, layers=12), "TFL-X1", "float16",
                        "GPT-2 small (12 layers, 12 heads: runs on TFL-X1; NPU-V3 has no 12-head attention)"),
    # large shapes (issue 25 item 3): the tiling's cache-reuse vs streamed paths differ here
    "resnet50_b8": ("resnet50", dict(batch=8, image=224), "NPU-V3", "float16", "ResNet-50, 8x3x224x224"),
    "bert_base_s512": ("bert-base", dict(batch=1, seq_len=512), "TFL-X1", "float16",
                       "BERT-base (12 layers, 12 heads: runs on TFL-X1), 512 tokens"),
    # *_int8: the model quantised with PT2E (torchfl.planner.quantise), compiled and run on the int8
    # unit; eager is the float model (what int8 is meant to beat), rel_err_vs_eager its accuracy
    # loss, rel_err_vs_quantised_reference the distance to PyTorch's own quantised computation
    "resnet50_int8_b1": ("resnet50", dict(batch=1, image=224), "NPU-V3", "float16",
                         "ResNet-50 quantised (PT2E int8, per-channel weights), 1x3x224x224"),
}


_clock = time.perf_counter     # --timer cpu: time.process_time


def _tensor(out):
    return out.last_hidden_state if hasattr(out, "last_hidden_state") else out


def _wrap_steps(executors, wrap) -> dict:
    """Replace each kernel step's call with ``wrap(call, kernel)``; id -> (Prep, original call),
    for the caller to restore. The full and the dynamic program share their steps' Preps:
    each is wrapped once."""
    wrapped = {}
    for e in executors:
        for prog in (e._full, e._dynamic):
            for step in (prog.steps if prog is not None else ()):
                p = step[0]
                if not step[1] and p.call is not None and id(p) not in wrapped:
                    wrapped[id(p)] = (p, p.call)
                    p.call = wrap(p.call, p.kernel)
    return wrapped


def _profile(compiled, inputs, executors, runs):
    """Per kernel (a step's kernel name), the wall and CPU time of its calls over ``runs`` more calls of
    the compiled model, per model call; ``outside_kernels``: the rest of the call's wall time (executor,
    Dynamo glue: one thread whatever the count). CPU time is the process's (every thread's): CPU / wall
    of a kernel is the cores it kept busy, spin-waiting workers included."""
    from collections import defaultdict

    stats = defaultdict(lambda: [0, 0.0, 0.0])
    wall, cpu = time.perf_counter, time.process_time

    def timed(call, kernel):
        def run(inputs):
            w0, c0 = wall(), cpu()
            out = call(inputs)
            st = stats[kernel]
            st[0] += 1
            st[1] += wall() - w0
            st[2] += cpu() - c0
            return out
        return run

    wrapped = _wrap_steps(executors, timed)
    try:
        w0, c0 = wall(), cpu()
        for _ in range(runs):
            compiled(*inputs)
        total_w, total_c = (wall() - w0) / runs, (cpu() - c0) / runs
    finally:
        for p, call in wrapped.values():
            p.call = call
    out = {k: {"calls": n // runs, "wall_s": w / runs, "cpu_s": c / runs} for k, (n, w, c) in stats.items()}
    kw = sum(v["wall_s"] for v in out.values())
    out["outside_kernels"] = {"calls": runs, "wall_s": total_w - kw,
                              "cpu_s": total_c - sum(v["cpu_s"] for v in out.values())}
    return {"total_wall_s": total_w, "total_cpu_s": total_c, "kernels": out}


class _ThreadClocks:
    """CPU time of each thread of this process, read through the thread's own CPU clock
    (``clock_gettime`` of the clock id Linux derives from a thread id: exact, also for a thread
    that is running). With ``OMP_WAIT_POLICY=passive`` the OpenMP workers sleep at once when a
    parallel region ends, so a worker's CPU time is its busy time (no spinning); CPU time does
    not grow when the host is loaded (the wall time does)."""

    def __init__(self):
        import os
        import threading

        self.main = threading.get_native_id()
        self.clocks = [(~tid << 3) | 6 for tid in sorted(int(t) for t in os.listdir("/proc/self/task"))
                       if tid != self.main]            # CPUCLOCK_SCHED | CPUCLOCK_PERTHREAD of each other thread

    def others(self):
        out = []
        for c in self.clocks:
            try:
                out.append(time.clock_gettime_ns(c))
            except OSError:                 # a thread that ended since: it runs nothing now
                out.append(0)
        return out


def _parallel_dispatchers():
    """(module, attribute, dispatcher) of every Numba function compiled with parallel=True that a
    kernel module names (the drivers call them from Python)."""
    from numba.core.registry import CPUDispatcher

    found = []
    for name, mod in list(sys.modules.items()):
        if not name.startswith("torchfl.kernels") or mod is None:
            continue
        for attr, v in list(vars(mod).items()):
            if isinstance(v, CPUDispatcher) and v.targetoptions.get("parallel"):
                found.append((mod, attr, v))
    return found


def _balance(compiled, inputs, executors, runs, counts=None):
    """Per kernel, where its CPU time goes across threads, timed by the threads' CPU clocks (run with
    OMP_WAIT_POLICY=passive: a worker's CPU time is then its work, whatever the host's load):
    ``serial_s`` the calling thread's CPU outside Numba's parallel regions (Python, counters, serial
    packing), per region the calling thread's and the workers' CPU; ``bound_s`` = serial + the sum
    over regions of the busiest thread's CPU: the call's wall time on an idle host with instant
    wake-ups. ``balance`` = region CPU / (threads x busiest thread's), 1.0 when every thread
    worked as long as the busiest; ``one_thread_regions``: regions run on one thread
    (``threads_for``: too small to split).

    ``counts``: thread counts (each at most the pool's) whose model calls alternate, one call each
    per run, so that their figures (``by_threads``) share the host's moments. Why: the CPU a call
    takes is not steady on a shared host: ResNet-50 b8's CPU at two threads over one, measured in
    two processes a minute apart (how ``--threads 1,2`` ran until now), read 1.165, while calls
    alternating in one process read 1.01-1.13 from one minute to the next, and a 64 MB stream on
    both cores 0.98-1.55 (other processes' memory traffic)."""
    from collections import defaultdict

    import numba

    pool = numba.get_num_threads()
    counts = list(counts or [pool])
    clocks = _ThreadClocks()
    tcpu = time.thread_time_ns
    stats = {c: defaultdict(lambda: defaultdict(float)) for c in counts}
    now = [counts[0]]           # the thread count of the model call under way
    current = [None]

    def timed_step(call, kernel):
        def run(inputs):
            c0, w0 = tcpu(), time.perf_counter()
            current[0] = st = stats[now[0]][kernel]
            out = call(inputs)
            st["calls"] += 1
            st["main_s"] += (tcpu() - c0) * 1e-9
            st["wall_s"] += time.perf_counter() - w0
            return out
        return run

    def timed_region(fn):
        def run(*args, **kw):
            st = current[0]
            o0, c0 = clocks.others(), tcpu()
            out = fn(*args, **kw)
            c1, o1 = tcpu(), clocks.others()
            if st is not None:
                work = [(b - a) * 1e-9 for a, b in zip(o0, o1)]
                main = (c1 - c0) * 1e-9
                st["regions"] += 1
                st["par_main_s"] += main
                st["par_work_s"] += sum(work)
                st["par_max_s"] += max([main] + work)
                if numba.get_num_threads() == 1:
                    st["one_thread_regions"] += 1
            return out
        return run

    wrapped = _wrap_steps(executors, timed_step)
    patched = _parallel_dispatchers()      # after the warm calls: every caller is compiled by now
    for mod, attr, fn in patched:
        setattr(mod, attr, timed_region(fn))
    try:
        for _ in range(runs):
            for c in counts:
                now[0] = c
                numba.set_num_threads(c)
                compiled(*inputs)
    finally:
        numba.set_num_threads(pool)
        for p, call in wrapped.values():
            p.call = call
        for mod, attr, fn in patched:
            setattr(mod, attr, fn)
    by = {str(c): {"threads": c, "kernels": _balance_summary(stats[c], c, runs)} for c in counts}
    last = by[str(counts[-1])]
    return {"threads": last["threads"], "threading_layer": numba.threading_layer(), "kernels": last["kernels"],
            "by_threads": by}


def _balance_summary(stats, n, runs):
    """Per kernel, ``_balance``'s figures per model call from one thread count's summed clocks."""
    out = {}
    for k, st in stats.items():
        serial = st["main_s"] - st["par_main_s"]
        par = st["par_main_s"] + st["par_work_s"]
        out[k] = {"calls": int(st["calls"]) // runs, "wall_s": st["wall_s"] / runs,
                  "cpu_s": (serial + par) / runs, "serial_s": serial / runs, "parallel_cpu_s": par / runs,
                  "bound_s": (serial + st["par_max_s"]) / runs,
                  "balance": par / (n * st["par_max_s"]) if st["par_max_s"] > 0 else float("nan"),
                  "regions": int(st["regions"]) // runs, "one_thread_regions": int(st["one_thread_regions"]) // runs}
    return out


def recorded_executors(compiled, inputs):
    """The plan executors one call of the compiled model runs (the call is made, recorded)."""
    from torchfl.runtime.backend import recording

    with recording() as rec:
        compiled(*inputs)
    executors = []
    for cg, plan, _r in rec.entries:
        executors += [e.executor for e in cg.entries.values() if e.plan is plan]
    return executors


def run_case(name, runs, registry=None, profile=False, balance=False, balance_counts=None, inductor=False):
    import torch

    from torchfl.planner.zoo import load_model

    zoo, kw, chip, precision, note = CASES[name]
    model, inputs = load_model(zoo, **kw)
    quantised = None
    if name.endswith("_int8_b1"):
        from torchfl.planner.quantise import quantise_pt2e

        quantised = quantise_pt2e(model, inputs)
    with torch.no_grad():          # eager alone, before any emulator thread exists
        model(*inputs)
        alone, eager_both = [], []
        for _ in range(runs):
            t0, w0, c0 = _clock(), time.perf_counter(), time.process_time()
            model(*inputs)
            alone.append(_clock() - t0)
            eager_both.append((time.perf_counter() - w0, time.process_time() - c0))
    compiled = torch.compile(quantised if quantised is not None else model, backend="torchfl",
                             options={"chip": chip, "precision": precision, "registry": registry})
    with torch.no_grad():
        t0 = _clock()
        y = _tensor(compiled(*inputs))
        first = _clock() - t0
        executors = recorded_executors(compiled, inputs)
        n_steps = sum(len(e.plan.steps) for e in executors)
        n_exec = sum(len(e.dynamic_preps) for e in executors)
        ref = _tensor(model(*inputs))
        peer, peer_first = None, None
        if inductor:            # the peer compiler on the same inputs, warm before the timed rounds
            peer = torch.compile(model, backend="inductor")
            t0 = _clock()
            peer(*inputs)
            peer_first = _clock() - t0
            peer(*inputs)
        ours_alone, ours_both = [], []
        for _ in range(runs):
            t0, w0, c0 = _clock(), time.perf_counter(), time.process_time()
            compiled(*inputs)
            ours_alone.append(_clock() - t0)
            ours_both.append((time.perf_counter() - w0, time.process_time() - c0))
        ours, eager, overhead, theirs = [], [], [], []
        for _ in range(runs):
            t0 = _clock()
            compiled(*inputs)
            ours.append(_clock() - t0)
            overhead.append(sum(e.last_total_s - e.last_kernel_s for e in executors) / max(1, n_steps))
            t0 = _clock()
            model(*inputs)
            eager.append(_clock() - t0)
            if peer is not None:    # the same round: the three meet the same moment of the host's load
                t0 = _clock()
                peer(*inputs)
                theirs.append(_clock() - t0)
    rel = float((y.float() - ref.float()).abs().max() / ref.float().abs().max())
    extra = {}
    if quantised is not None:
        with torch.no_grad():
            qref = _tensor(quantised(*inputs)).float()
        extra = {"rel_err_vs_quantised_reference": float((y.float() - qref).abs().max() / qref.abs().max()),
                 "quantised_reference_rel_err_vs_eager": float((qref - ref.float()).abs().max()
                                                               / ref.float().abs().max()),
                 "int8_steps": sum(1 for e in executors for st in e.plan.steps if st.dtype == "int8"
                                   and st.kind == "fused")}
    if peer is not None:
        extra.update(inductor_s=statistics.median(theirs), inductor_first_s=peer_first,
                     ratio_vs_inductor=statistics.median(theirs) / statistics.median(ours),
                     inductor_ratio_vs_eager=statistics.median(eager) / statistics.median(theirs))
    fb = sum(len(e.plan.fallbacks) for e in executors)
    t_ours, t_eager = statistics.median(ours), statistics.median(eager)
    return {"case": name, "model": note, "chip": chip, "precision": precision,
            "torchfl_s": t_ours, "torch_eager_s": t_eager, "ratio": t_eager / t_ours,
            "torch_eager_alone_s": statistics.median(alone),
            "ratio_vs_eager_alone": statistics.median(alone) / t_ours,
            "torchfl_alone_s": statistics.median(ours_alone),
            "ratio_alone": statistics.median(alone) / statistics.median(ours_alone),
            "spread_ms": {"torchfl": _spread(ours), "torch_eager": _spread(eager),
                          **({"inductor": _spread(theirs)} if theirs else {}),
                          "torchfl_alone": _spread(ours_alone), "torch_eager_alone": _spread(alone)},
            "first_compile_s": first, "executor_overhead_per_step_us": statistics.median(overhead) * 1e6,
            "executor_overhead_per_executed_step_us": statistics.median(overhead) * n_steps / max(1, n_exec) * 1e6,
            "executor_overhead_ms": statistics.median(overhead) * n_steps * 1e3,
            "steps": n_steps, "executed_steps": n_exec, "graphs": len(executors), "fallbacks": fb, "rel_err_vs_eager": rel,
            # wall and CPU time of the same alone calls (medians): CPU / wall is how many cores a side kept busy
            "torchfl_alone_wall_s": statistics.median(w for w, _c in ours_both),
            "torchfl_alone_cpu_s": statistics.median(c for _w, c in ours_both),
            "torch_eager_alone_wall_s": statistics.median(w for w, _c in eager_both),
            "torch_eager_alone_cpu_s": statistics.median(c for _w, c in eager_both),
            "runs": runs, **extra,
            **({"profile": _profile(compiled, inputs, executors, runs)} if profile else {}),
            **({"balance": _balance(compiled, inputs, executors, runs, balance_counts)} if balance else {})}


def _spread(values, scale=1e3, digits=1):
    """min, quartiles and max (times in ms by default): the host's noise is bimodal at times, a median hides it."""
    xs = sorted(values)
    return [round(xs[round(q * (len(xs) - 1))] * scale, digits) for q in (0, 0.25, 0.5, 0.75, 1)]


def _each_case(names, measure, failed):
    """``measure(name)`` for each case, Dynamo reset before each; a case that raises yields
    ``failed(name, why)`` (the exception in one line) and the others are still measured."""
    import torch

    for name in names:
        torch._dynamo.reset()
        try:
            result = measure(name)
        except Exception as exc:  # report the case as failed, keep measuring the others
            result = failed(name, f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}")
        yield result


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--registry", default=None)
    ap.add_argument("--threads", default="0",
                    help="threads for both sides (torch and the emulator's kernels; default: all cores); a list "
                         "(1,2) runs each count in a fresh process and prints the speed-up of each over the first")
    ap.add_argument("--timer", choices=("wall", "cpu"), default="wall",
                    help="cpu: the process's CPU time (with --threads 1, the work each side does, steady on a "
                         "loaded host where wall time swings with the other processes)")
    ap.add_argument("--inductor", action="store_true",
                    help="also compile each model with torch's Inductor (CPU) in the same process and time it in "
                         "the same alternating rounds: inductor_s, ratio_vs_inductor = inductor_s / torchfl_s")
    ap.add_argument("--profile", action="store_true",
                    help="per kernel: wall and CPU time of its calls (with --threads 1,2: each kernel's speed-up)")
    ap.add_argument("--paired", action="store_true",
                    help="with --threads 1,2: one process, the counts alternating call by call; the speed-up is "
                         "the median of each round's ratio (steady while the host's load drifts)")
    ap.add_argument("--balance", action="store_true",
                    help="per kernel: serial CPU, each thread's busy CPU per parallel region and the busiest "
                         "thread's sum, by the threads' CPU clocks with OMP_WAIT_POLICY=passive (set for the "
                         "run: workers sleep, not spin, between regions), so valid on a loaded host; with "
                         "--threads 1,2: each kernel's CPU-bound speed-up, all counts' calls alternating in the "
                         "largest count's process")
    ap.add_argument("--balance-threads", default=None, help=argparse.SUPPRESS)   # scaling()'s: the counts to alternate
    a = ap.parse_args(argv)
    unknown = [name for name in a.cases.split(",") if name not in CASES]
    if unknown:
        ap.error(f"unknown case {unknown[0]!r}; choose from {', '.join(CASES)}")
    try:
        counts = [int(t) for t in a.threads.split(",")]
    except ValueError:
        ap.error(f"--threads takes a count or a list of counts (1,2), not {a.threads!r}")
    if len(counts) > 1:
        return paired(a, counts) if a.paired else scaling(a, counts)
    if a.paired:
        ap.error("--paired needs a list of thread counts (--threads 1,2)")
    a.threads = counts[0]
    global _clock
    if a.timer == "cpu":
        _clock = time.process_time
    import os

    if a.threads:
        os.environ["NUMBA_NUM_THREADS"] = str(a.threads)
    if a.balance:       # before any OpenMP runtime starts (Numba's, torch's): workers sleep between regions
        os.environ.setdefault("OMP_WAIT_POLICY", "passive")
    import warnings

    warnings.filterwarnings("ignore")
    import torch

    if a.threads:
        torch.set_num_threads(a.threads)
    counts_b = [int(t) for t in a.balance_threads.split(",")] if a.balance_threads else None

    def measure(name):
        with torch.no_grad():
            return run_case(name, a.runs, a.registry, a.profile, a.balance, counts_b, a.inductor)

    results = []
    for result in _each_case(a.cases.split(","), measure, lambda name, why: {"case": name, "error": why}):
        results.append(result)
        if not a.json:
            print(_line(result), flush=True)
    if a.json:
        json.dump({"threads": torch.get_num_threads(), "timer": a.timer, "results": results}, sys.stdout, indent=2)
        print()
    return 0 if all("error" not in r for r in results) else 1


def scaling(a, counts):
    """Each thread count in a fresh process (Numba fixes its thread pool at import), wall time:
    per case and side, the speed-up of each count over the first (wall over wall) and, within one
    run, CPU over wall time (the cores it kept busy). Only a quiet host shows a speed-up: the load
    average is printed before and after."""
    import os
    import subprocess

    runs = {}
    load0 = os.getloadavg()
    for n in counts:
        cmd = [sys.executable, __file__, "--json", "--runs", str(a.runs), "--cases", a.cases, "--threads", str(n),
               "--timer", "wall"] + (["--registry", a.registry] if a.registry else []) + (["--profile"] if a.profile
                                                                                          else [])
        # --balance in the largest count's process only, every count's calls alternating there (_balance)
        cmd += ["--balance", "--balance-threads", ",".join(map(str, counts))] if a.balance and n == max(counts) else []
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if not proc.stdout.strip():
            sys.exit(f"bench_e2e --threads {n} failed:\n{proc.stderr[-2000:]}")
        runs[n] = {r["case"]: r for r in json.loads(proc.stdout)["results"]}
    load1 = os.getloadavg()
    rows = []
    for case in a.cases.split(","):
        base = runs[counts[0]].get(case, {})
        for n in counts:
            r = runs[n].get(case, {})
            if "error" in r or "error" in base:
                rows.append({"case": case, "threads": n, "error": r.get("error") or base.get("error")})
                continue
            row = {"case": case, "threads": n}
            for side, key in (("torchfl", "torchfl_alone"), ("torch_eager", "torch_eager_alone")):
                wall, cpu = r[f"{key}_wall_s"], r[f"{key}_cpu_s"]
                row[f"{side}_wall_s"], row[f"{side}_cpu_over_wall"] = wall, cpu / wall
                row[f"{side}_speedup"] = base[f"{key}_wall_s"] / wall
            if a.profile:
                row["profile"] = _kernel_speedups(base["profile"], r["profile"])
            if a.balance:
                by = runs[max(counts)][case]["balance"]["by_threads"]
                row["balance"] = _kernel_balance(by[str(counts[0])], by[str(n)])
            rows.append(row)
    out = {"threads": counts, "load_before": load0, "load_after": load1, "rows": rows}
    if a.json:
        json.dump(out, sys.stdout, indent=2)
        print()
    else:
        print(f"load average {load0[0]:.1f} -> {load1[0]:.1f} (a speed-up shows only on a quiet host)")
        for r in rows:
            if "error" in r:
                print(f"{r['case']:<18} {r['threads']} threads  ERROR {r['error']}")
                continue
            print(f"{r['case']:<18} {r['threads']} threads  torchfl {r['torchfl_wall_s'] * 1e3:8.1f} ms "
                  f"x{r['torchfl_speedup']:.2f} (cpu/wall {r['torchfl_cpu_over_wall']:.2f})  eager "
                  f"{r['torch_eager_wall_s'] * 1e3:8.1f} ms x{r['torch_eager_speedup']:.2f} "
                  f"(cpu/wall {r['torch_eager_cpu_over_wall']:.2f})")
            for k, v in r.get("profile", {}).items():
                print(f"    {k:<28} {v['calls']:4d} calls  {v['wall_s'] * 1e3:8.1f} ms ({v['share']:5.1%})  "
                      f"x{v['speedup']:.2f}  cpu/wall {v['cpu_over_wall']:.2f}")
            for k, v in r.get("balance", {}).items():
                print(f"    {k:<28} cpu {v['cpu_s'] * 1e3:8.1f} ms ({v['share']:5.1%})  serial {v['serial_share']:5.1%}"
                      f"  balance {v['balance']:.3f}  work x{v['work_growth']:.3f}  bound x{v['bound_speedup']:.2f}"
                      f"  split x{v['split_speedup']:.2f}"
                      f"  ({v['regions']} regions, {v['one_thread_regions']} on one thread)")
    return 0 if all("error" not in r for r in rows) else 1


def run_case_paired(name, runs, counts, registry=None):
    """One case, the compiled model and eager torch at each of ``counts`` threads in turn (this
    process's Numba pool has max(counts) threads): per count the median wall and CPU time, and the
    median over rounds of count[0]'s wall / this count's wall (a paired speed-up)."""
    import numba
    import torch

    from torchfl.planner.zoo import load_model

    zoo, kw, chip, precision, note = CASES[name]
    model, inputs = load_model(zoo, **kw)
    compiled = torch.compile(model, backend="torchfl", options={"chip": chip, "precision": precision,
                                                                 "registry": registry})
    sides = {"torchfl": compiled, "torch_eager": model}
    times = {(side, n): [] for side in sides for n in counts}

    def call(side, n, keep=True):
        numba.set_num_threads(n)
        torch.set_num_threads(n)
        w0, c0 = time.perf_counter(), time.process_time()
        sides[side](*inputs)
        if keep:
            times[side, n].append((time.perf_counter() - w0, time.process_time() - c0))

    with torch.no_grad():
        for n in counts:                    # compile, then one warm call per count and side
            for side in sides:
                call(side, n, keep=False)
                call(side, n, keep=False)
        for r in range(runs):
            order = counts if r % 2 == 0 else counts[::-1]
            for side in sides:
                for n in order:
                    call(side, n)
    rows = []
    for n in counts:
        row = {"case": name, "threads": n, "model": note, "chip": chip}
        for side in sides:
            mine, base = times[side, n], times[side, counts[0]]
            row[f"{side}_wall_s"] = statistics.median(w for w, _c in mine)
            row[f"{side}_cpu_over_wall"] = statistics.median(c / w for w, c in mine)
            row[f"{side}_speedup"] = statistics.median(b[0] / m[0] for b, m in zip(base, mine))
            row[f"{side}_speedup_spread"] = _spread([b[0] / m[0] for b, m in zip(base, mine)], 1, 2)
        rows.append(row)
    return rows


def paired(a, counts):
    """``--paired``: every case in this process, the thread counts alternating (see the docstring)."""
    import os

    os.environ["NUMBA_NUM_THREADS"] = str(max(counts))
    import warnings

    warnings.filterwarnings("ignore")
    import torch

    load0 = os.getloadavg()
    rows = []
    for case_rows in _each_case(a.cases.split(","), lambda name: run_case_paired(name, a.runs, counts, a.registry),
                                lambda name, why: [{"case": name, "threads": counts[-1], "error": why}]):
        rows += case_rows
    load1 = os.getloadavg()
    out = {"threads": counts, "paired": True, "runs": a.runs, "load_before": load0, "load_after": load1,
           "rows": rows}
    if a.json:
        json.dump(out, sys.stdout, indent=2)
        print()
    else:
        print(f"load average {load0[0]:.1f} -> {load1[0]:.1f}; paired: {a.runs} rounds, speed-up = median of "
              f"each round's ratio (spread: min, quartiles, max)")
        for r in rows:
            if "error" in r:
                print(f"{r['case']:<18} ERROR {r['error']}")
                continue
            print(f"{r['case']:<18} {r['threads']} threads  torchfl {r['torchfl_wall_s'] * 1e3:8.1f} ms "
                  f"x{r['torchfl_speedup']:.2f} {r['torchfl_speedup_spread']} (cpu/wall "
                  f"{r['torchfl_cpu_over_wall']:.2f})  eager {r['torch_eager_wall_s'] * 1e3:8.1f} ms "
                  f"x{r['torch_eager_speedup']:.2f} {r['torch_eager_speedup_spread']} (cpu/wall "
                  f"{r['torch_eager_cpu_over_wall']:.2f})")
    return 0 if all("error" not in r for r in rows) else 1


def _kernel_speedups(base, prof):
    """Per kernel, heaviest first: its wall time per model call at this count, its share of the call,
    the speed-up over the base count and CPU / wall at this count."""
    rows = {}
    for k, v in sorted(prof["kernels"].items(), key=lambda kv: -kv[1]["wall_s"]):
        b = base["kernels"].get(k)
        rows[k] = {"calls": v["calls"], "wall_s": v["wall_s"], "share": v["wall_s"] / prof["total_wall_s"],
                   "speedup": b["wall_s"] / v["wall_s"] if b and v["wall_s"] > 0 else float("nan"),
                   "cpu_over_wall": v["cpu_s"] / v["wall_s"] if v["wall_s"] > 0 else float("nan")}
    return rows


def _kernel_balance(base, bal):
    """Per kernel, heaviest first (CPU at the base count), at this count: its share of the base's CPU,
    the serial share of its CPU, the balance of its regions, work growth (CPU here / CPU at the base
    count: > 1 when threads slow each other, memory bandwidth or shared caches) and the CPU-bound
    speed-up (base CPU / busiest-thread bound here) and the split's own (CPU here / bound here: what the
    split of this run's work over the threads allows), plus a row ``all`` for the sums. ``base`` and
    ``bal``: one process's figures at two counts, their calls alternating (_balance)."""
    rows = {}
    tot = {"cpu_s": 0.0, "base": 0.0, "serial_s": 0.0, "bound_s": 0.0, "par": 0.0, "parmax": 0.0, "regions": 0,
           "one": 0}
    n = bal["threads"]
    total = sum(v["cpu_s"] for v in base["kernels"].values())
    for k, b in sorted(base["kernels"].items(), key=lambda kv: -kv[1]["cpu_s"]):
        v = bal["kernels"].get(k)
        if v is None:
            continue
        parmax = v["bound_s"] - v["serial_s"]
        rows[k] = {"calls": v["calls"], "cpu_s": v["cpu_s"], "share": b["cpu_s"] / total if total else 0.0,
                   "serial_share": v["serial_s"] / v["cpu_s"] if v["cpu_s"] else 0.0, "balance": v["balance"],
                   "work_growth": v["cpu_s"] / b["cpu_s"] if b["cpu_s"] else float("nan"),
                   "bound_speedup": b["cpu_s"] / v["bound_s"] if v["bound_s"] else float("nan"),
                   "split_speedup": v["cpu_s"] / v["bound_s"] if v["bound_s"] else float("nan"),
                   "regions": v["regions"], "one_thread_regions": v["one_thread_regions"]}
        for key, val in (("cpu_s", v["cpu_s"]), ("base", b["cpu_s"]), ("serial_s", v["serial_s"]),
                         ("bound_s", v["bound_s"]), ("par", v["parallel_cpu_s"]), ("parmax", parmax),
                         ("regions", v["regions"]), ("one", v["one_thread_regions"])):
            tot[key] += val
    rows["all"] = {"calls": sum(v["calls"] for v in rows.values()), "cpu_s": tot["cpu_s"], "share": 1.0,
                   "serial_share": tot["serial_s"] / tot["cpu_s"] if tot["cpu_s"] else 0.0,
                   "balance": tot["par"] / (n * tot["parmax"]) if tot["parmax"] else float("nan"),
                   "work_growth": tot["cpu_s"] / tot["base"] if tot["base"] else float("nan"),
                   "bound_speedup": tot["base"] / tot["bound_s"] if tot["bound_s"] else float("nan"),
                   "split_speedup": tot["cpu_s"] / tot["bound_s"] if tot["bound_s"] else float("nan"),
                   "regions": tot["regions"], "one_thread_regions": tot["one"]}
    return rows


def _line(r):
    if "error" in r:
        return f"{r['case']:<18} ERROR {r['error']}"
    return (f"{r['case']:<18} torchfl {r['torchfl_s'] * 1e3:9.1f} ms  eager {r['torch_eager_s'] * 1e3:8.1f} ms  "
            f"ratio {r['ratio']:.3f} (alone {r['ratio_alone']:.3f})  first {r['first_compile_s']:.1f} s  overhead "
            f"{r['executor_overhead_per_step_us']:.1f} us/step ({r['steps']} steps; "
            f"{r['executor_overhead_per_executed_step_us']:.1f} us per executed step, {r['executed_steps']} executed; "
            f"{r['graphs']} graphs, "
            f"{r['fallbacks']} fallbacks)  rel err {r['rel_err_vs_eager']:.2e}"
            + (f"  inductor {r['inductor_s'] * 1e3:.1f} ms (ours {r['ratio_vs_inductor']:.3f}x its speed, "
               f"first {r['inductor_first_s']:.1f} s)" if "inductor_s" in r else ""))


if __name__ == "__main__":
    sys.exit(main())
