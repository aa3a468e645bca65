"""Measure the machine torch runs on and describe it as an HCD (``torchfl hcd probe``).

Short microbenchmarks through torch itself, so the descriptor states what torch achieves
here, not a datasheet: the GEMM rate per dtype (``torch.mm``; ``torch._int_mm`` for int8
where torch has it), a STREAM-like copy of arrays four times the last-level cache
(off-chip bandwidth, and the copy's share of the best streaming rate), a copy whose working set is
four times the next lower cache level and inside the last (on-chip bandwidth), the fixed cost of a tiny op (a one-element
``torch.add``: dispatch plus allocation, ``execution.launch_overhead_us``), cache sizes
from the OS (``/sys/devices/system/cpu/cpu0/cache``; the last level is ``on_chip_cache``)
and the thread count (a comment: without a measured tile grain waves are not modelled). Every figure keeps its runs and
goes into the file as a comment with min/median/max; the median is the number used.

Timers: ``wall`` (``time.perf_counter``; CUDA: events after a synchronise) or ``cpu``
(``time.thread_time``: the calling thread's CPU time, one torch thread only). On a shared
machine wall time swings with the other processes' load, one thread's CPU time does not,
so ``threads=1, timer="cpu"`` describes one core steadily; the file says which was used.

Nothing here is fitted to any table it is later scored on: each number comes from the
microbenchmark named in its comment.
"""
from __future__ import annotations

import datetime as _dt
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from torchfl.fidelity.machine import CacheLevel, cpu_model, memory_bytes, os_caches, vector_bytes
from torchfl.fidelity.microbench import Figure, ProbeError, Timer, gemm, number_text as _g, stream, tiny_ops

__all__ = ["ProbeError", "Figure", "CacheLevel", "Probe", "probe", "Timer", "os_caches", "cpu_model", "check_name",
           "check_options", "available_cpus"]

#: per-dtype GEMM probe: torch dtype name -> (HCD unit, HCD dtype)
GEMM_DTYPES = (("float32", "fp32"), ("bfloat16", "bf16"), ("float16", "fp16"), ("int8", "int8"))
_NO_WAVES = "tile grain is measured, so waves are not modelled (no concurrent_tiles / tile_elements)"


@dataclass
class Probe:
    """What a probe measured; :meth:`hcd_text` writes it as an HCD."""

    device: str                       # "cpu" or "cuda"
    device_name: str                  # CPU model / GPU name
    threads: int
    timer: str
    quick: bool
    figures: dict = field(default_factory=dict)   # name -> Figure
    caches: list = field(default_factory=list)    # CacheLevel (CPU) ; one L2 entry for CUDA
    llc_bytes: int = 0
    memory_bytes: int | None = None
    vector_bytes: int = 64
    when: str = ""
    torch_version: str = ""
    notes: list = field(default_factory=list)
    warnings: list = field(default_factory=list)     # for the user's terminal (a busy machine)

    # -- the descriptor --
    def chip_name(self) -> str:
        return "HOST-" + _short(self.device_name) if self.device == "cpu" else "CUDA-" + _short(self.device_name)

    def hcd_text(self, name: str | None = None, version: str = "1.0.0") -> str:
        """The HCD as YAML, every measured number with its runs in a comment. Format 1.1 fields
        (sustained fractions, ``execution``) are written where this torchfl's schema has them."""
        from torchfl.hcd.model import HCD

        has_11 = "execution" in HCD.model_fields
        name = name or self.chip_name()
        units = [(u, dt) for dt, u in GEMM_DTYPES if f"gemm_{dt}" in self.figures]
        out = self._head(name, version) + self._compute_units(units, has_11) + self._memory(has_11)
        out += self._tensor([dt for _u, dt in units])
        if has_11:
            out += self._execution(_fields(HCD, "execution"))
        return "\n".join(out) + "\n"

    def _head(self, name: str, version: str) -> list:
        out = [
            f"# {name}: this machine as torch measured it (torchfl hcd probe, {self.when}).",
            f"# Device: {self.device_name} ({self.device}); torch {self.torch_version}; "
            f"{self.threads} thread(s); timer: {self.timer}"
            + (" (thread CPU time)" if self.timer == "cpu" else "") + ("; --quick" if self.quick else "") + ".",
            "# Every measured number below states its microbenchmark and spread; none is fitted to a scored table.",
        ]
        out += [f"# {n}" for n in self.notes]
        return out + [
            "chip:",
            f"  name: {name}",
            "  vendor: measured by torchfl hcd probe",
            f"  version: {version}",
            f"  device_type: {'host_cpu' if self.device == 'cpu' else 'host_cuda'}",
        ]

    def _compute_units(self, units: list, has_11: bool) -> list:
        layouts = "[NCHW, NHWC]"      # torch computes both (channels_last) on CPU and GPU
        out = ["compute_units:"]
        for unit, dt in units:
            fig = self.figures[f"gemm_{dt}"]
            key = "peak_tops" if unit == "int8" else "peak_tflops"
            out += [f"  {unit}:",
                    f"    # {fig.comment()}",
                    f"    count: {self.threads if self.device == 'cpu' else self._sms()}",
                    f"    {key}: {_g(fig.value / 1e12)}"]
            if has_11:
                out += ["    # the peak above is torch's own sustained GEMM rate, so a large GEMM sustains all of it",
                        "    sustained_fraction: 1.0"]
            out.append(f"    supported_layouts: {layouts}")
        return out + [
            "  attention:",
            "    # torch's scaled_dot_product_attention runs any head count and length; the format lists at",
            "    # most 64 head counts: 1 to 64",
            "    enabled: true",
            "    max_sequence_length: 16777216",
            "    supported_heads: [" + ", ".join(str(h) for h in range(1, 65)) + "]"]

    def _memory(self, has_11: bool) -> list:
        from torchfl.hcd.model import HCD

        f = self.figures
        out = ["memory:", "  on_chip_cache:"]
        for c in self.caches:
            out.append(f"    # L{c.level} {c.kind}: {c.size_bytes // 1024} KiB, shared by CPUs {c.shared_cpus}"
                       if self.device == "cpu" else f"    # L2: {c.size_bytes // 1024} KiB (device properties)")
        out += [f"    size_kb: {max(1, self.llc_bytes // 1024)}",
                f"    # {f['cache_bw'].comment()}",
                f"    bandwidth_gb_per_s: {_g(f['cache_bw'].value / 1e9)}"]
        if "retains_between_kernels" in _fields(HCD, "memory", "on_chip_cache"):
            out += ["    # a hardware-managed cache: what one op writes is there for the next (and for the next call)",
                    "    retains_between_kernels: true"]
        out.append("  off_chip_memory:")
        for key in ("copy_bw", "read_bw", "write_bw"):
            if key in f:
                out.append(f"    # {f[key].comment()}")
        peak_bw = max(f[k].value for k in ("copy_bw", "read_bw", "write_bw") if k in f)
        out.append("    # bandwidth: the best of the streaming kernels above; the copy sustains its share")
        out.append(f"    bandwidth_gb_per_s: {_g(peak_bw / 1e9)}")
        if has_11:
            out.append(f"    sustained_fraction: {_g(min(1.0, f['copy_bw'].value / peak_bw))}")
        if self.memory_bytes:
            out.append(f"    size_gb: {_g(self.memory_bytes / (1 << 30))}")
        return out

    def _tensor(self, dtypes: list) -> list:
        return ["tensor:",
                "  max_rank: 8",
                "  supported_dtypes: [" + ", ".join(f"torch.{d}" for d in dtypes) + "]",
                "  default_layout: NCHW",
                "constraints:",
                "  # torch states no batch or sequence limit: the format's largest values",
                "  max_batch_size: 2147483648",
                "  max_sequence_length: 2147483648",
                f"  # the widest vector register ({self.vector_bytes} B) and torch's allocator alignment"
                if self.device == "cpu" else "  # the GPU's global-memory transaction granule",
                f"  memory_alignment_bytes: {self.vector_bytes}"]

    def _execution(self, ex_fields: dict) -> list:
        f = self.figures
        lo = f["launch"]
        out = ["execution:",
               f"  # {lo.comment()}",
               f"  launch_overhead_us: {_g(lo.value * 1e6)}"]
        if "matrix_launch_overhead_us" in ex_fields and "matrix_launch" in f:
            out += [f"  # {f['matrix_launch'].comment()}",
                    f"  matrix_launch_overhead_us: {_g(f['matrix_launch'].value * 1e6)}"]
        # concurrent_tiles goes with a tile grain (execution.tile_elements) or not at all: the
        # probe measures no grain (torch splits the work its own way), so it states the
        # parallelism as a comment and leaves waves unmodelled, as validation asks
        out.append("  # " + (f"torch ran on {self.threads} thread(s); no fixed {_NO_WAVES}" if self.device == "cpu" else
                             f"{self._sms()} streaming multiprocessors; no {_NO_WAVES}"))
        return out

    def _sms(self) -> int:
        return int(self.figures["sms"].runs[0]) if "sms" in self.figures else 1

    def hcd(self, name: str | None = None, version: str = "1.0.0"):
        """The validated HCD object (``torchfl.hcd.HCDError`` if the probe produced nonsense)."""
        from torchfl.hcd import load_hcd_text

        return load_hcd_text(self.hcd_text(name, version), filename="<probe>")

    def write(self, path, name: str | None = None, version: str = "1.0.0") -> str:
        """Validate, then write the HCD text to ``path``; returns the text."""
        text = self.hcd_text(name, version)
        from torchfl.hcd import load_hcd_text

        load_hcd_text(text, filename=str(path))     # raises HCDError: nothing invalid is written
        Path(path).write_text(text, encoding="utf-8")
        return text


def _fields(model, *path) -> dict:
    """The pydantic fields of the section at ``path`` of ``model`` ({} where this torchfl's
    schema has no such section): the probe writes the format-1.1 fields the schema knows."""
    for name in path:
        field = model.model_fields.get(name)
        if field is None:
            return {}
        ann = field.annotation
        model = next((a for a in getattr(ann, "__args__", (ann,)) if hasattr(a, "model_fields")), None)
        if model is None:
            return {}
    return model.model_fields


def _short(name: str) -> str:
    """``AMD EPYC 9R14 96-Core Processor`` -> ``AMD-EPYC-9R14``: a chip name (letters, digits,
    '-', at most 64 characters) that says which machine it is."""
    drop = {"processor", "cpu", "core", "with", "radeon", "graphics", "(r)", "(tm)", "@", "nvidia", "geforce"}
    words = []
    for w in re.split(r"[\s_]+", name):
        lw = w.lower()
        if not w or lw in drop or re.fullmatch(r"\d+-core", lw) or lw.endswith("ghz"):
            continue
        w = re.sub(r"\((r|tm)\)", "", w, flags=re.I)
        w = re.sub(r"[^A-Za-z0-9.]", "", w)
        if w:
            words.append(w)
    short = "-".join(words[:4]) or "UNKNOWN"
    return short[:56].strip("-.")


# -- the probe ----------------------------------------------------------------------------------

def available_cpus() -> int:
    """CPUs this process may run on (its affinity mask, else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def check_name(name: str | None) -> None:
    """Refuse a chip name the HCD would refuse, before minutes of measuring (issue 52)."""
    from torchfl.hcd.model import CHIP_NAME

    if name is not None and not CHIP_NAME.fullmatch(name):
        raise ProbeError(f"--name {name!r} is not a valid chip name; use letters, digits, '.', '_' or '-' (at most "
                         "64, starting with a letter or digit), e.g. HOST-LAPTOP")


def check_options(device: str, threads, timer) -> None:
    """Every option bounded before torch is touched: ``--threads 100000`` made torch's thread pool
    segfault (exit 139, no message)."""
    if device not in ("cpu", "cuda"):
        raise ProbeError(f"unknown device {device!r}: hcd probe measures 'cpu' (this host) or 'cuda' (its GPU)")
    if threads is not None:
        cpus = available_cpus()
        if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
            raise ProbeError(f"--threads must be a positive integer, got {threads!r}")
        if threads > cpus:
            raise ProbeError(f"--threads {threads} is more than the {cpus} CPU(s) this process may use; give 1 to "
                             f"{cpus} (1, the default, times one thread's CPU time: steady on a shared host)")
    if timer not in (None, "wall", "cpu"):
        raise ProbeError(f"unknown timer {timer!r}; use wall or cpu")


def _settings(torch, device: str, threads, timer) -> tuple:
    """(threads, timer) checked and defaulted, or :class:`ProbeError` saying what to change.
    Default: one thread timed by its CPU time, the figure that holds on a shared host (the wall
    clock with every thread measured fp32 at 15.8 then 0.02 GFLOP/s in two runs, issue 52)."""
    check_options(device, threads, timer)
    if device == "cuda" and not torch.cuda.is_available():
        raise ProbeError("--device cuda: torch sees no CUDA device here (torch "
                         f"{torch.__version__}, cuda available: False); probe the host with --device cpu")
    if threads is None:
        threads = 1
    if timer is None:
        timer = "cpu" if device == "cpu" and threads == 1 else "wall"
    if timer == "cpu" and threads != 1:
        raise ProbeError(f"--timer cpu measures one thread's CPU time; with --threads {threads} it would sum "
                         "the threads' time (spin-waits included): use --threads 1 with --timer cpu, or --timer wall")
    return threads, timer


def _describe_cpu(res: Probe) -> None:
    """Caches, memory and vector width from the OS, and the load (a busy machine is said)."""
    res.caches = os_caches()
    if not res.caches:
        raise ProbeError("the OS states no CPU cache sizes (no /sys/devices/system/cpu/cpu0/cache, no "
                         "sysconf): hcd probe needs the last-level cache size for on_chip_cache")
    res.llc_bytes = max(c.size_bytes for c in res.caches if c.kind != "Instruction")
    res.memory_bytes = memory_bytes()
    res.vector_bytes = vector_bytes()
    try:
        load = os.getloadavg()[0]
    except OSError:
        return
    busy = res.timer == "wall" and load > 0.5 * (os.cpu_count() or 1)
    res.notes.append(f"load average {load:.2f} on {os.cpu_count()} CPUs when probed"
                     + ("; busy: wall-clock figures are lower than alone" if busy else ""))
    if busy:
        res.warnings.append(
            f"this machine is busy (load average {load:.1f} on {os.cpu_count()} CPUs): wall-clock "
            "figures measure the contention; --threads 1 (one thread's CPU time) is steady under load")


def _describe_cuda(torch, res: Probe) -> None:
    props = torch.cuda.get_device_properties(0)
    l2 = int(getattr(props, "L2_cache_size", 0) or 0) or (40 << 20)
    res.caches = [CacheLevel(2, "Unified", l2, "all SMs")]
    res.llc_bytes = l2
    res.memory_bytes = int(props.total_memory)
    res.vector_bytes = 128
    res.figures["sms"] = Figure("sms", (float(props.multi_processor_count),), "device properties", (1, "SMs"))


def _measure(torch, res: Probe, clock: Timer, repeat: int, step) -> None:
    """The microbenchmarks, in the order ``probe``'s progress names them."""
    device, quick = res.device, res.quick
    if device == "cpu":
        target, n_max = (0.003, 512) if quick else (0.03, 2048)
    else:
        target, n_max = (0.002, 4096) if quick else (0.01, 16384)
    for i, (dt, _u) in enumerate(GEMM_DTYPES):
        step(i, f"gemm {dt}")
        fig = gemm(torch, dt, device, clock, target, n_max, repeat)
        if fig is not None:
            res.figures[fig.name] = fig
    if "gemm_float32" not in res.figures:
        raise ProbeError(f"torch.mm float32 did not run on {device}: nothing to describe")
    step(4, "off-chip stream")
    big = min(max(4 * res.llc_bytes, 32 << 20), 512 << 20)
    if quick:
        big = min(max(2 * res.llc_bytes, 16 << 20), 128 << 20)
    res.figures.update(stream(torch, device, clock, big, repeat))
    step(5, "on-chip copy")
    # the last level's bandwidth where data comes from it and not from the level below: a
    # working set of 4x the next lower level (STREAM's rule one level up), at most half the last
    lower = [c.size_bytes for c in res.caches if c.kind != "Instruction" and c.size_bytes < res.llc_bytes]
    working = min(4 * max(lower), res.llc_bytes // 2) if lower else res.llc_bytes // 4
    small = stream(torch, device, clock, max(working // 2, 64 << 10), repeat)["copy_bw"]
    res.figures["cache_bw"] = Figure(
        "cache_bw", small.runs, small.how + f" (working set {working / (1 << 20):.4g} MiB: 4x the next lower "
        "level, inside the last)", small.shown)
    step(6, "tiny ops")
    res.figures.update(tiny_ops(torch, device, clock, quick, repeat))


def probe(device: str = "cpu", threads: int | None = None, timer: str | None = None, quick: bool = False,
          progress=None) -> Probe:
    """Run the microbenchmarks on ``device`` (``cpu`` or ``cuda``) and return a :class:`Probe`.

    ``threads``: torch's intra-op threads for the probe, 1 to this process's CPUs (default: 1; the
    previous count is restored); ``timer``: ``wall`` or ``cpu`` (default: ``cpu`` for one CPU
    thread, else ``wall``); a result no HCD may state is a :class:`ProbeError`; ``quick``: smaller sizes and fewer runs (tests: a few seconds);
    ``progress(step, i, n)`` is called before each step."""
    import torch

    threads, timer = _settings(torch, device, threads, timer)
    clock = Timer(timer, device)
    steps = ["gemm float32", "gemm bfloat16", "gemm float16", "gemm int8", "off-chip stream",
             "on-chip copy", "tiny ops"]

    def step(i, what):
        if progress is not None:
            progress(what, i, len(steps))

    res = Probe(device, cpu_model() if device == "cpu" else torch.cuda.get_device_name(), threads, timer, quick,
                when=_dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                torch_version=torch.__version__)
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        if device == "cpu":
            _describe_cpu(res)
        else:
            _describe_cuda(torch, res)
        _measure(torch, res, clock, 3 if quick else 7, step)
    finally:
        torch.set_num_threads(old)
    _check_figures(res)
    if res.timer == "wall" and res.device == "cpu" and res.threads > 1:
        _check_against_one_thread(torch, res)
    return res


def _one_thread_gflops(torch, n: int = 256, runs: int = 5) -> float:
    """One thread's fp32 GEMM rate by its CPU time (a fraction of a second): the floor any
    thread count reaches on an idle machine."""
    import statistics
    import time

    old = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        a = torch.randn(n, n)
        torch.mm(a, a)
        times = []
        for _ in range(runs):
            t = time.thread_time()
            torch.mm(a, a)
            times.append(time.thread_time() - t)
    finally:
        torch.set_num_threads(old)
    return 2 * n ** 3 / max(statistics.median(times), 1e-9) / 1e9


def _check_against_one_thread(torch, res: Probe) -> None:
    """Refuse a wall-clock GEMM rate of several threads far below one thread's own (the other
    processes' time measured, not this machine: 0.02 GFLOP/s written where one core does 60)."""
    got = res.figures["gemm_float32"].value / 1e9
    alone = _one_thread_gflops(torch)
    if got < alone / 4:
        raise ProbeError(f"--threads {res.threads} --timer wall measured fp32 {got:.3g} GFLOP/s, but one thread does "
                         f"{alone:.3g} by its CPU time: the wall clock measured the host's other load; nothing was "
                         "written; rerun with --threads 1 (the default) or on a quieter host")


#: a figure whose runs spread wider than this (largest / smallest) is reported as noisy
NOISY_SPREAD = 2.0


def _check_figures(res: Probe) -> None:
    """Refuse what no HCD may state (a rate the host's load pushed below the schema's bounds: the
    probe wrote a file its own validator rejected, after 124 s), and warn where runs spread
    widely or the cache measured slower than off-chip memory (contention, not the machine)."""
    from torchfl.hcd import HCDError, load_hcd_text

    try:
        load_hcd_text(res.hcd_text(), filename="<probe>")
    except HCDError as exc:
        bad = [d for d in exc.diagnostics if d.severity == "error"]
        what = "; ".join(f"{d.path}: {d.message}" for d in bad[:3]) or str(exc).splitlines()[0]
        raise ProbeError(f"the measured numbers are not a valid HCD ({what}): the host was too busy to measure; "
                         "nothing was written; rerun on a quieter host, with --threads 1 (the default) and "
                         "--timer cpu") from None
    for fig in res.figures.values():
        # matrix_launch's values are three different calls (their median is used), sms a count
        if fig.name not in ("sms", "matrix_launch") and min(fig.runs) > 0 and max(fig.runs) / min(fig.runs) > NOISY_SPREAD:
            res.warnings.append(f"{fig.name} runs spread {max(fig.runs) / min(fig.runs):.1f}x: a noisy host "
                                "(the median is used)")
    f = res.figures
    if "cache_bw" in f and "copy_bw" in f and f["cache_bw"].value < f["copy_bw"].value / 2:
        raise ProbeError(f"the on-chip copy measured {f['cache_bw'].value / 1e9:.3g} GB/s, under half the off-chip "
                         f"{f['copy_bw'].value / 1e9:.3g} GB/s: contention, not the cache; nothing was written; rerun "
                         "with --threads 1 (the default) or on a quieter host")
    if "cache_bw" in f and "copy_bw" in f and f["cache_bw"].value < f["copy_bw"].value:
        res.warnings.append(f"on-chip copy {f['cache_bw'].value / 1e9:.3g} < off-chip {f['copy_bw'].value / 1e9:.3g} "
                            "GB/s: contention, not the cache")
