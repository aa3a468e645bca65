"""DeviceMemory.returned_on_error: a failed run gives back every buffer it took, nested scopes
hand theirs to the enclosing one, and a run that succeeds keeps what it made."""
import pytest

from torchfl.kernels import ChipModel, DeviceMemory
from torchfl.kernels.errors import DeviceOOMError


def _mem():
    return DeviceMemory(ChipModel(memory_bytes=1 << 20))


def test_success_keeps_buffers_and_restores_no_scope():
    mem = _mem()
    with mem.returned_on_error():
        a = mem.alloc(256)
    assert not a.freed and mem._scope is None and mem._allocated >= 256


def test_error_frees_what_the_block_took_and_only_that():
    mem = _mem()
    before = mem.alloc(128)
    taken = mem._allocated
    with pytest.raises(RuntimeError, match="kernel failed"):
        with mem.returned_on_error():
            a, b = mem.alloc(256), mem.alloc(512)
            mem.free(b)                      # already given back inside: not freed twice
            raise RuntimeError("kernel failed")
    assert a.freed and b.freed and not before.freed
    assert mem._allocated == taken and mem._scope is None


def test_nested_scope_hands_its_buffers_to_the_outer_one():
    mem = _mem()
    with pytest.raises(ValueError):
        with mem.returned_on_error():
            with mem.returned_on_error():
                inner = mem.alloc(64)        # the inner block succeeds: kept for now
            assert not inner.freed
            raise ValueError("the outer run fails after it")
    assert inner.freed and mem._allocated == 0


def test_out_of_memory_inside_the_block_gives_back_the_rest():
    mem = _mem()
    with pytest.raises(DeviceOOMError):
        with mem.returned_on_error():
            first = mem.alloc(1024)
            mem.alloc(mem.capacity)          # with the first still held: one byte too many
    assert first.freed and mem._allocated == 0
