"""The ``torchfl`` logger: mapping lines under TORCH_FL_DEBUG=1, fallbacks always.

Lines keep the seed's form, one per plan step (not per call):

    [SME] Mapping aten::convolution -> conv2d_nhwc (layout=NHWC, dtype=fp16)
    [SME] Fallback to CPU: aten::cumsum (no rule maps aten.cumsum.default)
"""
from __future__ import annotations

import logging

from torchfl.hcd.dtypes import unit_label
from torchfl.planner.plan import identity_layout

from torchfl.kernels.envvars import flag

from .errors import aten_name

LOG = logging.getLogger("torchfl")


def debug_enabled() -> bool:
    return flag("TORCH_FL_DEBUG")


def strict_env() -> bool:
    return flag("TORCHFL_STRICT")


def _ensure_handler() -> None:
    """TORCH_FL_DEBUG=1 with no logging configured: print to stderr, like torch's logs."""
    if not LOG.handlers and not logging.getLogger().handlers:
        h = logging.StreamHandler()
        h.setFormatter(logging.Formatter("%(message)s"))
        LOG.addHandler(h)
    if LOG.level == logging.NOTSET or LOG.level > logging.DEBUG:
        LOG.setLevel(logging.DEBUG)


def kernel_display(step, plan) -> str:
    """``conv2d`` stored NHWC displays as ``conv2d_nhwc``; identity layouts add nothing."""
    name = step.kernel or "?"
    lay = step.layout_out
    if lay and step.outputs:
        val = plan.values.get(step.outputs[0]) if step.outputs[0] else None
        rank = len(val.shape) if val is not None else len(lay)
        if lay != identity_layout(rank) and len(lay) >= 3:
            name = f"{name}_{lay.lower()}"
    return name


def mapping_line(step, plan) -> str:
    ops = " + ".join(aten_name(o) for o in step.ops) or step.kind
    layout = (step.layouts_in[0] if step.layouts_in else "") or step.layout_out
    return f"[SME] Mapping {ops} -> {kernel_display(step, plan)} (layout={layout}, dtype={unit_label(step.dtype)})"


def fallback_line(fb) -> str:
    return f"[SME] Fallback to CPU: {aten_name(fb.op)} ({fb.reason})"


def log_plan(plan) -> None:
    """Once per plan: fallbacks as warnings; with TORCH_FL_DEBUG every mapping as well."""
    debug = debug_enabled()
    if debug:
        _ensure_handler()
        LOG.debug("[SME] Plan for %s: %s", plan.chip, plan.summary.headline(plan.chip))
        for step in plan.steps:
            if step.kind in ("kernel", "fused"):
                LOG.debug(mapping_line(step, plan))
            elif step.kind in ("cast", "layout"):
                LOG.debug("[SME] %s %s -> %s (%s, dtype=%s)", "Cast" if step.kind == "cast" else "Layout",
                          ",".join(step.inputs), ",".join(step.outputs), step.kernel,
                          unit_label(step.dtype))
        for fold in plan.folded:
            LOG.debug("[SME] Fold on host: %s (input-independent: computed once, kept on the chip)",
                      aten_name(fold.op))
    for fb in plan.fallbacks:
        LOG.warning(fallback_line(fb))


_notice = {"subscribed": False, "said": False}


def announce_compiles() -> None:
    """Once per process, the first kernel compile says so on the ``torchfl`` logger (a cold
    first call can take a minute and would otherwise look like a hang); quiet while a
    progress display already shows compiles (the CLI)."""
    if _notice["subscribed"]:
        return
    from torchfl.kernels import compiling, jitcache

    def on_compile(ev):
        if ev.kind != "start" or _notice["said"] or compiling.displayed():
            return
        _notice["said"] = True
        LOG.warning(compile_notice(ev.label, jitcache.location()[0]))

    compiling.subscribe(on_compile)
    _notice["subscribed"] = True


def compile_notice(label: str, cache) -> str:
    """The one-off compile notice, wrapped at spaces to 100 columns (a pipe's width; it was one
    line of 250+ columns), continuation lines indented; the cache path stays whole."""
    from torchfl.planner.texttable import PIPE_WIDTH, paragraph

    text = (f"torchfl: compiling the emulator's kernels for this model ({label} first); a one-off cost of "
            f"seconds per kernel, up to minutes per model, cached in {cache} for every later process. "
            "`torchfl kernels warmup` compiles the bundled chips' kernels ahead of time.")
    return "\n".join(paragraph(text, width=PIPE_WIDTH, subsequent="  "))
