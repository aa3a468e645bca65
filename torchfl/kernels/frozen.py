"""Frozen device buffers and the host-side copies kernels derive from them.

A buffer is *frozen* by its owner's promise that its bytes do not change until it is
freed: the executor freezes the weights it uploads and the static steps' results it
keeps (casts and layout transforms of parameters; a weight update makes it release
them and upload new buffers). A kernel may then keep a derived host copy of a frozen
operand -- the GEMM keeps its B operand decoded to float32 and packed into micro-kernel
panels -- instead of re-deriving it on every call. That is a CPU detail of the
emulation: the kernel still counts the operand's tile loads as the plan says.

Copies live as long as their buffer object and never past its ``free``; their total
size is bounded (``BUDGET_BYTES``): beyond it kernels simply derive again per call.

On the eager npu device a frozen buffer may be the caller's own weight, which an optimizer
step writes in place: the eager executors keep it frozen only while the weight's identity,
version counter and address are the ones it was frozen with, and ``thaw`` it otherwise
(``runtime/eager/executor.py``).
"""
from __future__ import annotations

import weakref

__all__ = ["freeze", "thaw", "is_frozen", "derived", "cached_bytes", "BUDGET_BYTES"]

BUDGET_BYTES = 2 << 30        # host memory for derived copies, all buffers together

_frozen: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()   # buffer -> {key: array}
_total = [0]


def _forget(copies: dict):
    _total[0] -= sum(int(a.nbytes) for a in copies.values())


def freeze(buffer) -> None:
    """Promise that ``buffer``'s bytes stay as they are until it is freed."""
    if buffer not in _frozen:
        copies: dict = {}
        _frozen[buffer] = copies
        weakref.finalize(buffer, _forget, copies)


def thaw(buffer) -> None:
    """End the promise: the buffer's owner will write it (an npu weight an optimizer step
    updates in place). Its derived copies are dropped; ``freeze`` it again to keep new ones."""
    copies = _frozen.pop(buffer, None)
    if copies:
        _forget(copies)
        copies.clear()


def is_frozen(buffer) -> bool:
    return not buffer.freed and buffer in _frozen


def derived(buffer, key, make):
    """The copy ``make()`` of frozen ``buffer`` kept under ``key``, made on first use;
    None when the buffer is not frozen (or freed) or the budget is spent."""
    copies = _frozen.get(buffer)
    if copies is None or buffer.freed:
        if copies:            # freed since: its copies describe bytes that may be reused
            _forget(copies)
            copies.clear()
        return None
    arr = copies.get(key)
    if arr is None:
        arr = make()
        if _total[0] + arr.nbytes > BUDGET_BYTES:
            return arr        # used once, not kept
        copies[key] = arr
        _total[0] += int(arr.nbytes)
    return arr


def cached_bytes() -> int:
    """Host bytes held by derived copies now."""
    return _total[0]
