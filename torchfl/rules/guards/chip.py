"""The ``chip`` namespace that guards read: the HCD's numbers and capabilities, not its name.

``chip.<section>.<field>`` follows the HCD's own field paths (``chip.compute_units.
attention.supported_heads``, ``chip.constraints.max_sequence_length``), plus two derived
lists: ``chip.dtypes`` (short names such as ``float16``) and ``chip.layouts`` (every
layout some unit computes in, default first). The HCD's ``chip:`` section (name, vendor,
version, device type) is deliberately absent: packs are chip-agnostic, and a rule that
must be limited to a device type says so in ``requires.device_types``.
"""

from __future__ import annotations

from torchfl.rules.guards.types import BOOL, FLOAT, INT, STR, list_of, optional, record

_FLOAT_UNIT = dict(count=INT, peak_tflops=FLOAT, supported_layouts=optional(list_of(STR)))

CHIP = record(
    "chip",
    compute_units=record(
        "chip.compute_units",
        fp16=optional(record("chip.compute_units.fp16", **_FLOAT_UNIT)),
        bf16=optional(record("chip.compute_units.bf16", **_FLOAT_UNIT)),
        fp32=optional(record("chip.compute_units.fp32", **_FLOAT_UNIT)),
        int8=optional(record("chip.compute_units.int8", count=INT, peak_tops=FLOAT,
                             supported_layouts=optional(list_of(STR)))),
        attention=optional(record("chip.compute_units.attention", enabled=BOOL,
                                  max_sequence_length=optional(INT), supported_heads=optional(list_of(INT)))),
    ),
    memory=record(
        "chip.memory",
        on_chip_cache=record("chip.memory.on_chip_cache", size_kb=INT, bandwidth_gb_per_s=FLOAT),
        off_chip_memory=record("chip.memory.off_chip_memory", bandwidth_gb_per_s=FLOAT, size_gb=optional(FLOAT)),
    ),
    tensor=record("chip.tensor", max_rank=INT, supported_dtypes=list_of(STR), default_layout=STR),
    constraints=record(
        "chip.constraints",
        max_batch_size=INT,
        max_sequence_length=INT,
        memory_alignment_bytes=INT,
        bfloat16_emulation=BOOL,
    ),
    dtypes=list_of(STR),
    layouts=list_of(STR),
)


def chip_view(hcd) -> dict:
    """Plain data for ``chip.*`` from an HCD; every field of :data:`CHIP` is present, absent ones as None."""
    data = hcd.canonical()
    data.pop("chip", None)
    data.setdefault("constraints", {}).setdefault("bfloat16_emulation", False)
    data["dtypes"] = list(hcd.dtypes)
    data["layouts"] = list(hcd.layouts)
    return _fill(data, CHIP)


def _fill(data, t):
    """Keep only the fields the type declares (nothing else is reachable) and add absent ones as None."""
    if t.kind == "optional":
        t = t.elem
    if t.kind != "record" or not isinstance(data, dict):
        return data
    return {name: (None if data.get(name) is None else _fill(data[name], ft)) for name, ft in t.fields}
