"""Quantise a float model with PyTorch's PT2E flow, for the chips' int8 units.

torch 2.13 no longer ships ``torch.ao.quantization.quantize_pt2e``; torchao does
(``torchao==0.18.0``, pinned; a pure-Python wheel that pulls no torch of its own):
``torchao.quantization.pt2e.quantize_pt2e.prepare_pt2e`` / ``convert_pt2e``. The quantizer
is torchao's XNNPACK-style symmetric one (``torchao.testing.pt2e._xnnpack_quantizer``): int8
activations per tensor (-128..127, affine), int8 weights per output channel (-127..127,
symmetric), batch-norm folded into the conv. torchao's X86InductorQuantizer (uint8
activations) refuses this project's ResNet (one ReLU module used twice: "Input partition
has more than one output node").

What ``convert_pt2e`` leaves in the graph, and what the planner captures (torch.export keeps
these ops whole): ``quantized_decomposed.quantize_per_tensor.default(x, scale, zp, -128, 127,
int8)`` and ``dequantize_per_tensor.default`` (same arguments) around every quantised
activation, ``dequantize_per_channel.default(w_int8, scales, zero_points, axis=0, -127, 127,
int8)`` on every weight (int8 tensors and float32 scales lifted as constants), float ops in
between (conv2d, linear, add, relu, pooling, mean, view). The rules (``rules/core.yaml``,
quantised section) fold dequantize -> conv2d / linear / add [-> relu] [-> quantize] into one
int8 kernel; the rest run as casts and float kernels.
"""

from __future__ import annotations

import contextlib
import logging
import warnings


@contextlib.contextmanager
def _quiet_loggers(*names):
    """torchao's import logs a warning per CUDA extension it cannot load on a CPU build and
    torch's pytree one per Enum torchao registers: noise on every CLI run that plans int8,
    nothing a user can act on. Raised to ERROR for the import, restored after."""
    loggers = [logging.getLogger(n) for n in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def quantise_pt2e(model, example_inputs, calibration=None, per_channel: bool = True):
    """``model`` quantised to int8 with PT2E, calibrated on ``calibration`` (an iterable of
    input tuples; default: the example inputs once). Returns the converted GraphModule,
    which runs (eagerly, on the CPU) PyTorch's reference quantised computation."""
    import torch

    with warnings.catch_warnings(), _quiet_loggers("torchao", "torch.utils._pytree"):
        warnings.simplefilter("ignore")   # torchao's import-time notices (CUDA kernels, Enum registration)
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
        from torchao.testing.pt2e._xnnpack_quantizer import XNNPACKQuantizer, get_symmetric_quantization_config

        # "XNNPACKQuantizer is deprecated" (in favour of ExecuTorch's copy, which needs ExecuTorch)
        quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=per_channel))
    example_inputs = tuple(example_inputs)
    with torch.no_grad():
        exported = torch.export.export(model.eval(), example_inputs, strict=False).module()
        prepared = prepare_pt2e(exported, quantizer)
        for inputs in (calibration if calibration is not None else (example_inputs,)):
            prepared(*inputs)
        return convert_pt2e(prepared)
