"""Rich rendering shared by the CLI commands (rich is imported only when a table is drawn)."""

from __future__ import annotations


def console():
    """A rich console as wide as the terminal (``COLUMNS`` honoured), 100 columns in a pipe."""
    from rich.console import Console

    from torchfl.planner.texttable import terminal_width

    return Console(soft_wrap=False, highlight=False, width=terminal_width())


def hcd_table(h) -> None:
    """One chip's canonical HCD as a two-column table, units spelled out."""
    from rich.table import Table

    t = Table(title=f"{h.chip.name} {h.chip.version} ({h.chip.vendor}, device_type {h.chip.device_type}, "
                    f"format {h.format_version})")
    t.add_column("field", no_wrap=True)
    t.add_column("value", overflow="fold")      # wrapped, never cut ("…"): a content hash stays whole
    for unit in ("fp16", "bf16", "fp32", "int8"):
        u = getattr(h.compute_units, unit)
        if u is None:
            continue
        rate = f"{u.peak_tops} TOPS" if unit == "int8" else f"{u.peak_tflops} TFLOPS"
        layouts = ", ".join(h.unit_layouts(unit))
        sustained = f", {_worded(f'compute_units.{unit}.sustained_fraction', u.sustained_fraction)}" \
            if u.sustained_fraction is not None else ""
        t.add_row(f"compute_units.{unit}", f"{u.count} units, {rate} aggregate{sustained}, layouts {layouts}")
    a = h.compute_units.attention
    if a is not None:
        t.add_row("compute_units.attention",
                  f"enabled={a.enabled}, max_seq={a.max_sequence_length}, heads={a.supported_heads}")
    m = h.memory
    t.add_row("memory.on_chip_cache", f"{m.on_chip_cache.size_kb} KiB at {m.on_chip_cache.bandwidth_gb_per_s} GB/s")
    size = f"{m.off_chip_memory.size_gb} GiB" if m.off_chip_memory.size_gb else "unbounded"
    off = m.off_chip_memory
    sustained = f", {_worded('memory.off_chip_memory.sustained_fraction', off.sustained_fraction)}" \
        if off.sustained_fraction is not None else ""
    t.add_row("memory.off_chip_memory", f"{size} at {off.bandwidth_gb_per_s} GB/s{sustained}")
    ex = h.execution
    if ex is not None:
        parts = [_worded(path, value) for path, value in h.format_11_values().items() if path.startswith("execution.")]
        t.add_row("execution", ", ".join(parts) or "(empty)")
    t.add_row("tensor", f"max_rank {h.tensor.max_rank}, dtypes {', '.join(h.dtypes)}, "
                        f"default layout {h.tensor.default_layout}")
    c = h.constraints
    t.add_row("constraints", f"max_batch {c.max_batch_size}, max_seq {c.max_sequence_length}, "
                             f"alignment {c.memory_alignment_bytes} B, bf16 emulation {c.bfloat16_emulation}")
    t.add_row("content_hash", h.content_hash())
    out = console()
    out.print(t)
    out.print(provenance_table(h))


def _worded(path: str, value) -> str:
    """A format-1.1 number as ``hcd show`` words it (``torchfl.hcd.model.FORMAT_11_FIELDS``)."""
    from torchfl.hcd.model import FORMAT_11_FIELDS, format_11_field

    return FORMAT_11_FIELDS[format_11_field(path)][1].format(v=value)


def provenance_table(h):
    """Each performance number with the kind and reference of its source (format 1.2;
    ``unstated`` for a number whose file names none): what a prediction stands on."""
    from rich.markup import escape
    from rich.table import Table

    t = Table(title="performance numbers and their sources")
    t.add_column("number", no_wrap=True)
    t.add_column("value", justify="right", no_wrap=True)
    t.add_column("kind", no_wrap=True)
    t.add_column("source: reference", overflow="fold")
    for path, value in h.performance_numbers().items():
        sid = h.provenance.get(path)
        src = h.source_of(path)
        ref = "-" if src is None else f"{sid}: {src.ref}"
        if src is not None and src.benchmark:
            ref += f" [{src.benchmark}{', table ' + src.table if src.table else ''}]"
        if src is not None and src.rows:
            ref += f" [fitted on {', '.join(src.rows)}]"
        t.add_row(path.removeprefix("compute_units.").removeprefix("memory."), f"{value:g}", h.kind_of(path),
                  escape(ref))
    return t


class PipeLines:
    """A text stream for progress lines: in a pipe or a log, each line it is given is wrapped at
    spaces to the pipe's width (100 columns), continuation lines indented; on a terminal it is
    the stream itself (the progress bar draws there). Why: a heartbeat line ("[12:00:01] ResNet-50
    (batch 1, 64x64) on NPU-V2: planning + compiling kernels (1/12): still working, 231 s;
    compiling conv2d_bn_relu (float16) for 20 s") reached 150 columns in `make demo`'s log."""

    def __init__(self, stream, width: int | None = None):
        self.stream, self.width, self._pending = stream, width, ""

    def isatty(self) -> bool:
        return self.stream.isatty()

    def write(self, text: str) -> int:
        if self.stream.isatty():
            return self.stream.write(text)
        from torchfl.planner.texttable import paragraph, terminal_width

        self._pending += text
        *lines, self._pending = self._pending.split("\n")
        width = self.width or terminal_width(self.stream)
        for line in lines:                   # a line that fits is written as it is (tables keep their spaces)
            wrapped = paragraph(line, width=width, subsequent="    ") if len(line) > width else [line]
            self.stream.write("\n".join(wrapped) + "\n")
        return len(text)

    def flush(self) -> None:
        if self._pending:
            self.stream.write(self._pending)
            self._pending = ""
        self.stream.flush()

    def __getattr__(self, name):                 # fileno, encoding, ...: the stream's own
        return getattr(self.stream, name)
