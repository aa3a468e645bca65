"""The memory plan's data: the device buffers of one call of a plan, sized, with the step
that allocates and the step that frees each, and the peak (``plan.memory``). Planned by
``planner/memory.py``; data only, below the plan that holds it."""

from __future__ import annotations

from dataclasses import dataclass

from torchfl.planner.records import Data, as_tuple

__all__ = ["KINDS", "WHY", "Buffer", "MemoryPlan"]

KINDS = ("input", "kv_cache", "parameter", "weight", "folded", "activation", "output", "scratch")
WHY = {
    "input": "user inputs, uploaded at every call",
    "kv_cache": "a decoder's KV cache: past keys and values in, the grown cache out (kv_cache_table)",
    "parameter": "parameters, buffers and constants, uploaded once in the graph's dtype",
    "weight": "parameters in the plan's dtype and layout (static casts and layout copies, kept)",
    "folded": "folded constants (input-independent values computed once on the host, kept)",
    "activation": "intermediate values, freed after their last reader",
    "output": "graph outputs, freed after they are returned",
    "scratch": "kernel outputs the plan does not use, freed right after their step",
}


@dataclass(frozen=True)
class Buffer(Data):
    """One device buffer: the value that first holds it (``name``), the values that view it
    (``values``, reshapes included), its ``kind`` (:data:`KINDS`), accounted ``nbytes``, the
    step that allocates it (``alloc``; -1: uploaded before step 0) and the last step it is
    live in (``free``: freed after that step; ``None``: resident, kept across calls)."""

    name: str
    values: tuple[str, ...]
    kind: str
    nbytes: int
    alloc: int
    free: int | None

    def live_at(self, step: int) -> bool:
        return self.alloc <= step and (self.free is None or step <= self.free)


@dataclass(frozen=True)
class MemoryPlan(Data):
    """Device memory of one call of a plan (see the module docstring).

    ``live_bytes[i]``: bytes allocated at step ``i``'s high-water mark (everything live
    before it plus the buffers it allocates); ``upload_bytes``: after the uploads, before
    step 0; ``peak_bytes``/``peak_step`` the maximum of both (``peak_step`` -1: the uploads);
    ``resident_bytes``: what stays allocated between calls. ``frees[i]``: value names whose
    buffers the executor frees after step ``i``; ``at_end``: outputs freed after the
    download; ``static_steps``: steps run once (their results kept)."""

    alignment: int
    capacity: int | None
    buffers: tuple[Buffer, ...]
    live_bytes: tuple[int, ...]
    upload_bytes: int
    peak_bytes: int
    peak_step: int
    resident_bytes: int
    frees: tuple[tuple[str, ...], ...]
    at_end: tuple[str, ...]
    static_steps: tuple[int, ...]

    @property
    def fits(self) -> bool:
        return self.capacity is None or self.peak_bytes <= self.capacity

    def live_at_peak(self) -> list[Buffer]:
        """The buffers live at the peak, largest first."""
        return sorted((b for b in self.buffers if b.live_at(self.peak_step)), key=lambda b: (-b.nbytes, b.name))

    def breakdown(self, step: int | None = None) -> dict[str, int]:
        """Bytes per buffer kind live at ``step`` (default: the peak), in :data:`KINDS` order."""
        step = self.peak_step if step is None else step
        out = {k: 0 for k in KINDS}
        for b in self.buffers:
            if b.live_at(step):
                out[b.kind] += b.nbytes
        return out

    @classmethod
    def from_dict(cls, data: dict) -> "MemoryPlan":
        bufs = tuple(Buffer(**{k: as_tuple(v) for k, v in b.items()}) for b in data["buffers"])
        rest = {k: as_tuple(v) for k, v in data.items() if k != "buffers"}
        return cls(buffers=bufs, **rest)
