"""Where a cold first call's Numba compile time goes: per jitted function, CPU seconds split
into Numba's own passes (typing, parfors, lowering) and LLVM's (function passes, module
optimisation, machine code), exclusive of nested compiles.

    prof = Profile().install()       # before the first compile; one per process
    ...                              # compile things
    prof.report()                    # list of dicts, largest first

``numba:compile`` events give the stack of dispatchers being compiled (a callee compiled
while its caller is typed is its own entry); the three LLVM stages are timed by wrapping
``CPUCodeLibrary``'s methods, charged to the function on top of the stack. Times are the
compiling thread's CPU time (``time.thread_time``): meaningful on a shared machine, where
wall time is not. Used by ``tools/bench_compile.py --profile``.
"""
from __future__ import annotations

import time

STAGES = ("llvm_function_passes_s", "llvm_module_opt_s", "llvm_codegen_s")


class Profile:
    def __init__(self):
        self.stack = []              # [key, cpu at start, cpu of nested compiles, wall at start]
        self.rows = {}               # key -> dict
        self.first_compile_wall = None
        self.timeline = []           # outermost compiles: (function, start, end) in time.time()
        self._installed = False

    def _row(self, key):
        row = self.rows.get(key)
        if row is None:
            row = self.rows[key] = {"function": key[0], "signature": key[1], "compiles": 0, "cpu_s": 0.0,
                                    "wall_s": 0.0, **{s: 0.0 for s in STAGES}}
        return row

    def install(self) -> "Profile":
        if self._installed:
            return self
        from numba.core import codegen, event

        prof = self

        class _Listener(event.Listener):
            def on_start(self, ev):
                disp = (ev.data or {}).get("dispatcher")
                fn = getattr(disp, "py_func", None)
                name = "?" if fn is None else f"{fn.__module__.removeprefix('torchfl.kernels.')}.{fn.__qualname__}"
                args = (ev.data or {}).get("args")
                if prof.first_compile_wall is None:
                    prof.first_compile_wall = time.perf_counter()
                prof.stack.append([(name, str(tuple(args) if args is not None else "")[:300]),
                                   time.thread_time(), 0.0, time.perf_counter(), time.time()])

            def on_end(self, ev):
                key, t0, nested, w0, start = prof.stack.pop()[:5]
                if not prof.stack:
                    prof.timeline.append((key[0], round(start, 3), round(time.time(), 3)))
                total = time.thread_time() - t0
                row = prof._row(key)
                row["compiles"] += 1
                row["cpu_s"] += total - nested
                row["wall_s"] += time.perf_counter() - w0
                if prof.stack:
                    prof.stack[-1][2] += total

        class _Passes(event.Listener):
            # a pass's CPU time less the compiles nested in it (a callee typed inside type inference)
            def on_start(self, ev):
                if prof.stack:
                    prof.stack[-1].append((time.thread_time(), prof.stack[-1][2]))

            def on_end(self, ev):
                if not prof.stack or len(prof.stack[-1]) <= 5:
                    return
                frame = prof.stack[-1]
                t0, nested0 = frame.pop()
                name = (ev.data or {}).get("name", "?").split(" [")[0]
                passes = prof._row(frame[0]).setdefault("passes", {})
                passes[name] = passes.get(name, 0.0) + time.thread_time() - t0 - (frame[2] - nested0)

        event.register("numba:compile", _Listener())
        event.register("numba:run_pass", _Passes())
        lib = codegen.CPUCodeLibrary
        for method, stage in (("_optimize_functions", "llvm_function_passes_s"),
                              ("_optimize_final_module", "llvm_module_opt_s"),
                              ("_finalize_final_module", "llvm_codegen_s")):
            setattr(lib, method, self._timed(getattr(lib, method), stage))
        self._installed = True
        return self

    def _timed(self, original, stage):
        prof = self

        def timed(*args, **kwargs):
            t0 = time.thread_time()
            try:
                return original(*args, **kwargs)
            finally:
                if prof.stack:
                    prof._row(prof.stack[-1][0])[stage] += time.thread_time() - t0

        return timed

    def report(self) -> list[dict]:
        out = []
        for row in self.rows.values():
            r = dict(row)
            r["numba_passes_s"] = r["cpu_s"] - sum(r[s] for s in STAGES)
            if "passes" in r:
                r["passes"] = {k: round(v, 3) for k, v in sorted(r["passes"].items(), key=lambda kv: -kv[1])
                               if v >= 0.05}
            out.append({k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()})
        return sorted(out, key=lambda r: -r["cpu_s"])
