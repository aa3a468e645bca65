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
import math
import os
import platform
import re
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["ProbeError", "Figure", "CacheLevel", "Probe", "probe", "Timer", "os_caches", "cpu_model"]

#: per-dtype GEMM probe: torch dtype name -> (HCD unit, HCD dtype)
GEMM_DTYPES = (("float32", "fp32"), ("bfloat16", "bf16"), ("float16", "fp16"), ("int8", "int8"))


class ProbeError(ValueError):
    """A probe that cannot run as asked (bad device, thread count, timer): the message says
    what and how to fix it."""


@dataclass(frozen=True)
class Figure:
    """One measured number: its per-run values in SI units (ops/s, B/s, s); the median is the
    figure. ``shown`` is (factor, unit) for the comment (1e-9, "GB/s")."""

    name: str
    runs: tuple
    how: str
    shown: tuple = (1.0, "")

    @property
    def value(self) -> float:
        return float(statistics.median(self.runs))

    def comment(self) -> str:
        k, unit = self.shown
        lo, mid, hi = min(self.runs) * k, self.value * k, max(self.runs) * k
        runs = "values" if self.name == "matrix_launch" else "runs"
        return f"{self.how}: {len(self.runs)} {runs} min/median/max {_g(lo)}/{_g(mid)}/{_g(hi)} {unit} (median used)"


@dataclass(frozen=True)
class CacheLevel:
    level: int
    kind: str        # Data, Instruction, Unified
    size_bytes: int
    shared_cpus: str


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
        ex_fields = _fields(HCD, "execution")
        f = self.figures
        name = name or self.chip_name()
        units = [(u, dt) for dt, u in GEMM_DTYPES if f"gemm_{dt}" in f]
        dtypes = [dt for _u, dt in units]
        layouts = "[NCHW, NHWC]"      # torch computes both (channels_last) on CPU and GPU
        out = [
            f"# {name}: this machine as torch measured it (torchfl hcd probe, {self.when}).",
            f"# Device: {self.device_name} ({self.device}); torch {self.torch_version}; "
            f"{self.threads} thread(s); timer: {self.timer}"
            + (" (thread CPU time)" if self.timer == "cpu" else "") + ("; --quick" if self.quick else "") + ".",
            "# Every measured number below states its microbenchmark and spread; none is fitted to a scored table.",
        ]
        out += [f"# {n}" for n in self.notes]
        out += [
            "chip:",
            f"  name: {name}",
            "  vendor: measured by torchfl hcd probe",
            f"  version: {version}",
            f"  device_type: {'host_cpu' if self.device == 'cpu' else 'host_cuda'}",
            "compute_units:",
        ]
        for unit, dt in units:
            fig = f[f"gemm_{dt}"]
            key = "peak_tops" if unit == "int8" else "peak_tflops"
            out += [f"  {unit}:",
                    f"    # {fig.comment()}",
                    f"    count: {self.threads if self.device == 'cpu' else self._sms()}",
                    f"    {key}: {_g(fig.value / 1e12)}"]
            if has_11:
                out += ["    # the peak above is torch's own sustained GEMM rate, so a large GEMM sustains all of it",
                        "    sustained_fraction: 1.0"]
            out.append(f"    supported_layouts: {layouts}")
        out += ["  attention:",
                "    # torch's scaled_dot_product_attention runs any head count and length; the format lists at",
                "    # most 64 head counts: 1 to 64",
                "    enabled: true",
                "    max_sequence_length: 16777216",
                "    supported_heads: [" + ", ".join(str(h) for h in range(1, 65)) + "]",
                "memory:",
                "  on_chip_cache:"]
        for c in self.caches:
            out.append(f"    # L{c.level} {c.kind}: {c.size_bytes // 1024} KiB, shared by CPUs {c.shared_cpus}"
                       if self.device == "cpu" else f"    # L2: {c.size_bytes // 1024} KiB (device properties)")
        out += [f"    size_kb: {max(1, self.llc_bytes // 1024)}",
                f"    # {f['cache_bw'].comment()}",
                f"    bandwidth_gb_per_s: {_g(f['cache_bw'].value / 1e9)}"]
        if "retains_between_kernels" in _fields(HCD, "memory", "on_chip_cache"):
            out += ["    # a hardware-managed cache: what one op writes is there for the next (and for the next call)",
                    "    retains_between_kernels: true"]
        out += [
                "  off_chip_memory:"]
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
        out += ["tensor:",
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
        if has_11:
            lo = f["launch"]
            out += ["execution:",
                    f"  # {lo.comment()}",
                    f"  launch_overhead_us: {_g(lo.value * 1e6)}"]
            if "matrix_launch_overhead_us" in ex_fields and "matrix_launch" in f:
                out += [f"  # {f['matrix_launch'].comment()}",
                        f"  matrix_launch_overhead_us: {_g(f['matrix_launch'].value * 1e6)}"]
            # concurrent_tiles goes with a tile grain (execution.tile_elements) or not at all: the
            # probe measures no grain (torch splits the work its own way), so it states the
            # parallelism as a comment and leaves waves unmodelled, as validation asks
            out.append("  # " + (f"torch ran on {self.threads} thread(s); no fixed tile grain is measured, so "
                                 "waves are not modelled (no concurrent_tiles / tile_elements)"
                                 if self.device == "cpu" else
                                 f"{self._sms()} streaming multiprocessors; no tile grain is measured, so "
                                 "waves are not modelled (no concurrent_tiles / tile_elements)"))
        return "\n".join(out) + "\n"

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


def _g(x: float) -> str:
    """A number as YAML reads it back: 4 significant digits, no exponent for ordinary sizes."""
    if x == 0:
        return "0"
    s = f"{x:.4g}"
    if "e" in s:
        s = f"{x:.{max(0, 3 - math.floor(math.log10(abs(x))))}f}"
    if re.fullmatch(r"-?\d+", s):
        s += ".0"
    return s


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


# -- the machine as the OS describes it ---------------------------------------------------------

def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def _size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)B?\s*", text, flags=re.I)
    if not m:
        raise ValueError(f"cache size {text!r} is not a number of K/M/G bytes")
    return int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[m.group(2).upper()]


def os_caches(root: str = "/sys/devices/system/cpu/cpu0/cache") -> list[CacheLevel]:
    """CPU 0's caches from sysfs (Linux), smallest level first; empty where the OS has none.
    glibc's ``sysconf`` is the fallback for the last level."""
    out = []
    base = Path(root)
    for d in sorted(base.glob("index*")) if base.is_dir() else ():
        try:
            level = int((d / "level").read_text())
            kind = (d / "type").read_text().strip()
            size = _size((d / "size").read_text())
            shared = (d / "shared_cpu_list").read_text().strip() if (d / "shared_cpu_list").exists() else "?"
        except (OSError, ValueError):
            continue
        out.append(CacheLevel(level, kind, size, shared))
    if not out:
        for level, key in ((3, "SC_LEVEL3_CACHE_SIZE"), (2, "SC_LEVEL2_CACHE_SIZE")):
            try:
                size = os.sysconf(key)
            except (ValueError, OSError, AttributeError):
                size = 0
            if size and size > 0:
                out.append(CacheLevel(level, "Unified", int(size), "?"))
                break
    return sorted(out, key=lambda c: (c.level, c.kind))


def _vector_bytes() -> int:
    try:
        flags = next((ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("flags")), "")
    except OSError:
        flags = ""
    fl = set(flags.split())
    return 64 if "avx512f" in fl else 32 if "avx" in fl else 16


def _memory_bytes() -> int | None:
    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


# -- timing -------------------------------------------------------------------------------------

class Timer:
    """Per-call seconds of ``fn``: ``repeat`` samples of ``number`` calls after ``warmup`` calls.

    ``wall``: perf_counter (CUDA: synchronised before and after); ``cpu``: this thread's CPU
    time (user + system, so page faults count), exact when torch computes on this thread."""

    def __init__(self, kind: str = "wall", device: str = "cpu"):
        if kind not in ("wall", "cpu"):
            raise ProbeError(f"unknown timer {kind!r}; use wall or cpu")
        if kind == "cpu" and device != "cpu":
            raise ProbeError("--timer cpu times the host thread; a CUDA device is timed with --timer wall")
        self.kind, self.device = kind, device
        self._now = time.thread_time if kind == "cpu" else time.perf_counter
        self._sync = None
        if device == "cuda":
            import torch

            self._sync = torch.cuda.synchronize

    def once(self, fn) -> float:
        if self._sync:
            self._sync()
        t = self._now()
        fn()
        if self._sync:
            self._sync()
        return self._now() - t

    def runs(self, fn, number: int = 1, repeat: int = 5, warmup: int = 1) -> list[float]:
        for _ in range(warmup):
            fn()
        out = []
        for _ in range(repeat):
            if self._sync:
                self._sync()
            t = self._now()
            for _ in range(number):
                fn()
            if self._sync:
                self._sync()
            out.append((self._now() - t) / number)
        return out

    def calls_for(self, fn, target_s: float, cap: int = 100_000) -> int:
        """How many calls of ``fn`` make a sample of about ``target_s`` (after one warm call)."""
        fn()
        one = max(self.once(fn), 1e-7)
        return max(1, min(cap, int(target_s / one)))


# -- the microbenchmarks ------------------------------------------------------------------------

def _gemm(torch, dtype_name, dev, timer, target_s, n_max, repeat) -> Figure | None:
    """ops/s of torch's GEMM for ``dtype_name``: n doubles from 64 until one call takes
    ``target_s`` (or n reaches ``n_max``); the last size is measured ``repeat`` times."""
    dt = getattr(torch, dtype_name)
    g = torch.Generator(device=dev).manual_seed(0)

    def operands(n):
        if dtype_name == "int8":
            a = torch.randint(-8, 8, (n, n), dtype=torch.int8, device=dev, generator=g)
            b = a.clone()
            return a, b, (lambda: torch._int_mm(a, b))
        a = torch.randn(n, n, device=dev, generator=g).to(dt)
        b = a.clone()
        return a, b, (lambda: torch.mm(a, b))

    n, tried = 64, []
    while True:
        try:
            a, b, fn = operands(n)
            fn()
        except (RuntimeError, NotImplementedError, AttributeError):
            return None      # torch has no such GEMM on this device: the unit is left out
        one = timer.once(fn)
        tried.append(n)
        if one >= target_s or n >= n_max:
            break
        n *= 2
    number = max(1, int(target_s / max(one, 1e-9) / 4))
    secs = timer.runs(fn, number=number, repeat=repeat, warmup=1)
    unit = "GOP/s" if dtype_name == "int8" else "GFLOP/s"
    op = "torch._int_mm" if dtype_name == "int8" else "torch.mm"
    return Figure(f"gemm_{dtype_name}", tuple(2 * n ** 3 / s for s in secs),
                  f"{op} {dtype_name} {n}x{n}x{n} (sizes tried {', '.join(map(str, tried))})", (1e-9, unit))


def _stream(torch, dev, timer, nbytes, repeat) -> dict:
    """Copy (2 x bytes), read-only sum (bytes) and fill (bytes) over float32 arrays of ``nbytes``."""
    n = max(1024, nbytes // 4)
    x = torch.rand(n, device=dev)
    y = torch.empty_like(x)
    y.fill_(1.0)                                   # touch every page before timing
    out = {}
    for key, fn, moved, what in (
            ("copy_bw", lambda: y.copy_(x), 2 * n * 4, "copy y.copy_(x)"),
            ("read_bw", lambda: x.sum(), n * 4, "read x.sum()"),
            ("write_bw", lambda: y.fill_(0.5), n * 4, "write y.fill_()")):
        number = timer.calls_for(fn, 0.01)
        secs = timer.runs(fn, number=number, repeat=repeat, warmup=1)
        out[key] = Figure(key, tuple(moved / s for s in secs),
                          f"{what} of {n * 4 / (1 << 20):.4g} MiB float32 ({moved // (n * 4)} x bytes counted)",
                          (1e-9, "GB/s"))
    return out


def probe(device: str = "cpu", threads: int | None = None, timer: str | None = None, quick: bool = False,
          progress=None) -> Probe:
    """Run the microbenchmarks on ``device`` (``cpu`` or ``cuda``) and return a :class:`Probe`.

    ``threads``: torch's intra-op threads for the probe (default: torch's current count; the
    previous count is restored); ``timer``: ``wall`` or ``cpu`` (default: ``cpu`` for one CPU
    thread, else ``wall``); ``quick``: smaller sizes and fewer runs (tests: a few seconds);
    ``progress(step, i, n)`` is called before each step."""
    import torch

    if device not in ("cpu", "cuda"):
        raise ProbeError(f"unknown device {device!r}: hcd probe measures 'cpu' (this host) or 'cuda' (its GPU)")
    if device == "cuda" and not torch.cuda.is_available():
        raise ProbeError("--device cuda: torch sees no CUDA device here (torch "
                         f"{torch.__version__}, cuda available: False); probe the host with --device cpu")
    old = torch.get_num_threads()
    if threads is None:
        threads = old
    if not isinstance(threads, int) or threads < 1:
        raise ProbeError(f"--threads must be a positive integer, got {threads!r}")
    if timer is None:
        timer = "cpu" if device == "cpu" and threads == 1 else "wall"
    if timer == "cpu" and threads != 1:
        raise ProbeError(f"--timer cpu measures one thread's CPU time; with --threads {threads} it would sum "
                         "the threads' time (spin-waits included): use --threads 1 with --timer cpu, or --timer wall")
    clock = Timer(timer, device)
    repeat = 3 if quick else 7
    steps = ["gemm float32", "gemm bfloat16", "gemm float16", "gemm int8", "off-chip stream",
             "on-chip copy", "tiny ops"]

    def step(i, what):
        if progress is not None:
            progress(what, i, len(steps))

    res = Probe(device, cpu_model() if device == "cpu" else torch.cuda.get_device_name(), threads, timer, quick,
                when=_dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                torch_version=torch.__version__)
    try:
        torch.set_num_threads(threads)
        if device == "cpu":
            res.caches = os_caches()
            if not res.caches:
                raise ProbeError("the OS states no CPU cache sizes (no /sys/devices/system/cpu/cpu0/cache, no "
                                 "sysconf): hcd probe needs the last-level cache size for on_chip_cache")
            res.llc_bytes = max(c.size_bytes for c in res.caches if c.kind != "Instruction")
            res.memory_bytes = _memory_bytes()
            res.vector_bytes = _vector_bytes()
            try:
                load = os.getloadavg()[0]
            except OSError:
                load = None
            if load is not None:
                busy = timer == "wall" and load > 0.5 * (os.cpu_count() or 1)
                res.notes.append(f"load average {load:.2f} on {os.cpu_count()} CPUs when probed"
                                 + ("; busy: wall-clock figures are lower than alone" if busy else ""))
                if busy:
                    res.warnings.append(
                        f"this machine is busy (load average {load:.1f} on {os.cpu_count()} CPUs): wall-clock "
                        "figures measure the contention; --threads 1 (one thread's CPU time) is steady under load")
        else:
            props = torch.cuda.get_device_properties(0)
            l2 = int(getattr(props, "L2_cache_size", 0) or 0) or (40 << 20)
            res.caches = [CacheLevel(2, "Unified", l2, "all SMs")]
            res.llc_bytes = l2
            res.memory_bytes = int(props.total_memory)
            res.vector_bytes = 128
            res.figures["sms"] = Figure("sms", (float(props.multi_processor_count),), "device properties", (1, "SMs"))
        if device == "cpu":
            target, n_max = (0.003, 512) if quick else (0.03, 2048)
        else:
            target, n_max = (0.002, 4096) if quick else (0.01, 16384)
        for i, (dt, _u) in enumerate(GEMM_DTYPES):
            step(i, f"gemm {dt}")
            fig = _gemm(torch, dt, device, clock, target, n_max, repeat)
            if fig is not None:
                res.figures[fig.name] = fig
        if "gemm_float32" not in res.figures:
            raise ProbeError(f"torch.mm float32 did not run on {device}: nothing to describe")
        step(4, "off-chip stream")
        big = min(max(4 * res.llc_bytes, 32 << 20), 512 << 20)
        if quick:
            big = min(max(2 * res.llc_bytes, 16 << 20), 128 << 20)
        res.figures.update(_stream(torch, device, clock, big, repeat))
        step(5, "on-chip copy")
        # the last level's bandwidth where data comes from it and not from the level below: a
        # working set of 4x the next lower level (STREAM's rule one level up), at most half the last
        lower = [c.size_bytes for c in res.caches if c.kind != "Instruction" and c.size_bytes < res.llc_bytes]
        working = min(4 * max(lower), res.llc_bytes // 2) if lower else res.llc_bytes // 4
        small = _stream(torch, device, clock, max(working // 2, 64 << 10), repeat)["copy_bw"]
        res.figures["cache_bw"] = Figure(
            "cache_bw", small.runs, small.how + f" (working set {working / (1 << 20):.4g} MiB: 4x the next lower "
            "level, inside the last)", small.shown)
        step(6, "tiny ops")
        a = torch.ones(1, device=device)
        fn = lambda: torch.add(a, a)  # noqa: E731
        number = clock.calls_for(fn, 0.002 if quick else 0.01, cap=20_000)
        res.figures["launch"] = Figure("launch", tuple(clock.runs(fn, number=number, repeat=repeat, warmup=100)),
                                       "one-element torch.add (dispatch + allocation)", (1e6, "us"))
        # a matrix family's call (a library that picks and launches its kernels) costs more than an
        # elementwise one: the tiniest linear, conv2d and attention, each timed like the add
        x2, w2 = torch.ones(1, 1, device=device), torch.ones(1, 1, device=device)
        x4, w4 = torch.ones(1, 3, 8, 8, device=device), torch.ones(4, 3, 3, 3, device=device)
        q = torch.ones(1, 1, 1, 1, device=device)
        tiny = {"linear 1x1x1": lambda: torch.nn.functional.linear(x2, w2),
                "conv2d 1x3x8x8 * 4x3x3x3": lambda: torch.conv2d(x4, w4),
                "sdpa 1x1x1x1": lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q)}
        each = {}
        for what, f in tiny.items():
            n_calls = clock.calls_for(f, 0.002 if quick else 0.01, cap=20_000)
            each[what] = statistics.median(clock.runs(f, number=n_calls, repeat=repeat, warmup=20))
        res.figures["matrix_launch"] = Figure(
            "matrix_launch", tuple(each.values()),
            "the tiniest " + ", ".join(each) + " (one median each; their median used)", (1e6, "us"))
    finally:
        torch.set_num_threads(old)
    return res

