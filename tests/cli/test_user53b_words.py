"""Issue 53, leftover of point 8: the eager device's fallback for ``1 - x`` read "sub: input a
is bound to something that is not a graph value". It now says which argument of which op got
what, and why that runs on the host (the kernel and its input named as before)."""
from __future__ import annotations

import logging


def test_sub_of_a_python_number_says_what_it_got(caplog):
    import torch

    import torchfl  # noqa: F401 - registers the npu device

    npu = torch.npu.chip_device("TFL-X1")
    x = torch.ones(7, 3, device=npu)                 # a shape of its own: a plan not cached by another test
    with caplog.at_level(logging.WARNING, logger="torchfl"):
        y = (1 - x).cpu()
    assert torch.equal(y, torch.zeros(7, 3))
    text = " ".join(caplog.text.split())
    assert ("Fallback to CPU: aten::sub (argument 'self' of aten::sub is the Python number 1, not a tensor on "
            "the device: kernel sub needs a tensor there (its input a), so the call runs on the host)") in text, text
    assert "not a graph value" not in text
