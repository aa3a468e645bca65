"""Hard constraints of the HCD, checked on the whole graph before any candidate is priced.

Each error names the limit, the value, the HCD field and the node, and says what to do;
the layout and attention messages are the seed article's own words.
"""

from __future__ import annotations

from torchfl.hcd.dtypes import PRECISIONS
from torchfl.planner.errors import ChoiceError, HardConstraintError, UnsupportedAttention
ATTENTION_OPS = ("aten.scaled_dot_product_attention.default",
                 "aten._scaled_dot_product_flash_attention_for_cpu.default",
                 "aten._scaled_dot_product_flash_attention.default",
                 "aten._scaled_dot_product_efficient_attention.default")


def check_precision(hcd, precision):
    """The precision policy itself must be one the chip stores."""
    if precision is None:
        return
    if precision not in PRECISIONS:
        raise ChoiceError(f"unknown precision {precision!r}; choose one of {', '.join(PRECISIONS)}")
    stored = hcd.stored_dtypes
    if precision not in stored or hcd.unit_for(precision) is None:
        ok = [p for p in PRECISIONS if p in stored and hcd.unit_for(p) is not None]
        raise HardConstraintError(
            f"precision {precision} is not supported on {hcd.chip.name}: tensor.supported_dtypes is "
            f"{', '.join(hcd.dtypes)}; use precision={' or '.join(repr(p) for p in ok) or 'none available'}",
            field="tensor.supported_dtypes", limit=list(hcd.dtypes), value=precision)


def check_float64(hcd, ir):
    """No chip stores float64: without a precision policy ("graph dtypes as written") a
    float64 value cannot be planned. The policy computes it like float32 (in the policy's
    dtype) and returns float64 outputs; complex and other host dtypes are host fallbacks."""
    f64 = [n for n, v in ir.values.items() if v.dtype == "float64"]
    if not f64:
        return
    kind = next((f"input {n}" for n, k, _t, _i in ir.placeholders if n == f64[0] and k == "input"), f64[0])
    ok = [p for p in PRECISIONS if p in hcd.dtypes and hcd.unit_for(p) is not None]
    ok.sort(key=lambda p: p != "float32")
    raise HardConstraintError(
        f"dtype torch.float64 of {kind} is not supported on {hcd.chip.name}: tensor.supported_dtypes is "
        f"[{', '.join('torch.' + d for d in hcd.dtypes)}] and no precision policy was given. Pass "
        f"precision={' or '.join(repr(p) for p in ok)} (torch.compile options={{\"precision\": \"{ok[0]}\"}}, "
        f"TORCHFL_PRECISION={ok[0]} on the npu device, CLI --precision {ok[0]}) to compute float64 values in "
        "that dtype on the chip (outputs are returned as float64), or cast the model and inputs to float32",
        field="tensor.supported_dtypes", limit=list(hcd.dtypes), value="float64", node=f64[0])


def check_layout_inputs(hcd, example_inputs):
    """A user input stored in a permuted layout (channels-last is NHWC; an npu tensor may
    carry any permutation) needs a chip that computes in that layout."""
    for i, lay in enumerate(input_layouts(example_inputs)):
        if lay and lay not in hcd.layouts:
            name = "channels_last" if lay == "NHWC" else lay
            raise HardConstraintError(f"Layout {name} not supported on {hcd.chip.name}",
                                      field="compute_units.*.supported_layouts", limit=list(hcd.layouts),
                                      value=lay, node=f"input {i}")


def tensor_layout(x) -> str | None:
    """Layout letters of a dense 4-D tensor stored in a permuted order (``NHWC`` for
    channels-last; an npu tensor may carry any of the HCD's layouts), None for row-major,
    another rank (the HCD's layouts are 4-D), or a tensor that is not a dense permutation."""
    if x.dim() != 4 or x.is_contiguous():
        return None
    from torchfl.kernels.tensor import logical_letters

    shape, strides = x.shape, x.stride()
    # outermost physical axis first; ties (size-1 axes) keep logical order
    perm = sorted(range(x.dim()), key=lambda d: (-strides[d], d))
    expect = 1
    for d in reversed(perm):
        if shape[d] != 1 and strides[d] != expect:
            return None
        expect *= shape[d]
    if perm == sorted(perm):
        return None
    letters = logical_letters(x.dim())
    return "".join(letters[d] for d in perm)


def input_layouts(example_inputs) -> list[str | None]:
    """Layout letters of each example input as it arrives (NHWC for channels-last)."""
    import torch

    return [tensor_layout(x) if isinstance(x, torch.Tensor) else None for x in example_inputs]


def check_graph(hcd, ir, precision, unbatched=frozenset()):
    """Rank, batch, sequence, attention heads and dtype limits over every value and op.

    ``unbatched`` names graph inputs that carry no batch dimension although they are
    inputs of the graph: the parameters and buffers an AOTAutograd forward graph takes as
    primals, and every input of a backward graph (activations saved by the forward,
    which already checked the user's inputs)."""
    chip = hcd.chip.name
    max_rank = hcd.tensor.max_rank
    for name, info in ir.values.items():
        if info.rank > max_rank:
            raise HardConstraintError(
                f"Tensor rank {info.rank} of {name} (shape {list(info.shape)}) exceeds max_rank {max_rank} of "
                f"{chip} (HCD field tensor.max_rank); reshape to at most {max_rank} dimensions",
                field="tensor.max_rank", limit=max_rank, value=info.rank, node=name)
    cons = hcd.constraints
    for name, kind, _target, info in ir.placeholders:
        if name in unbatched:
            continue
        # a 1-D tensor has no batch dimension: its only axis is its data (a GELU over 1M values)
        if kind == "input" and info.rank >= 2 and info.shape[0] > cons.max_batch_size:
            raise HardConstraintError(
                f"Batch size {info.shape[0]} of input {name} exceeds max_batch_size {cons.max_batch_size} of "
                f"{chip} (HCD field constraints.max_batch_size); split the batch",
                field="constraints.max_batch_size", limit=cons.max_batch_size, value=info.shape[0], node=name)
        if kind == "input" and info.rank == 2 and info.graph_dtype in ("int64", "int32") \
                and info.shape[1] > cons.max_sequence_length:
            raise HardConstraintError(
                f"Sequence length {info.shape[1]} of input {name} exceeds max_sequence_length "
                f"{cons.max_sequence_length} of {chip} (HCD field constraints.max_sequence_length)",
                field="constraints.max_sequence_length", limit=cons.max_sequence_length, value=info.shape[1],
                node=name)
    att = hcd.compute_units.attention
    for node in ir.nodes.values():
        if node.op not in ATTENTION_OPS:
            continue
        q = node.fx.args[0].meta["val"]
        k = node.fx.args[1].meta["val"]
        seq = max(int(q.shape[-2]), int(k.shape[-2]))
        if seq > cons.max_sequence_length:
            raise HardConstraintError(
                f"Sequence length {seq} at {node.name} exceeds max_sequence_length {cons.max_sequence_length} of "
                f"{chip} (HCD field constraints.max_sequence_length)",
                field="constraints.max_sequence_length", limit=cons.max_sequence_length, value=seq, node=node.name)
        if att is None or not att.enabled:
            continue  # no attention unit: the op falls back to the CPU, explicitly (never rewritten)
        heads = int(q.shape[1]) if q.dim() == 4 else 1
        if att.supported_heads and heads not in att.supported_heads:
            raise UnsupportedAttention(
                f"MultiheadAttention with num_heads={heads} not supported on {chip}: its attention unit runs "
                f"num_heads {', '.join(map(str, att.supported_heads))} (HCD compute_units.attention."
                f"supported_heads); build the model with one of those (nn.MultiheadAttention's num_heads, a "
                f"transformers config's num_attention_heads or n_head, `torchfl plan explain --heads`) or use a "
                f"chip whose attention unit runs {heads} heads",
                heads=heads, supported=att.supported_heads, node=node.name)
        if att.max_sequence_length is not None and seq > att.max_sequence_length:
            raise HardConstraintError(
                f"Sequence length {seq} at {node.name} exceeds the attention unit's max_sequence_length "
                f"{att.max_sequence_length} on {chip} (HCD field compute_units.attention.max_sequence_length)",
                field="compute_units.attention.max_sequence_length", limit=att.max_sequence_length, value=seq,
                node=node.name)
    quantised = [n for n, v in ir.values.items() if v.dtype == "int8" and v.kind == "node"]
    if quantised and "int8" not in hcd.dtypes:
        raise HardConstraintError(
            f"dtype torch.int8 not supported on {chip}: this is a quantised graph (e.g. {quantised[0]}) and "
            f"tensor.supported_dtypes is [{', '.join('torch.' + d for d in hcd.dtypes)}]; plan it for a chip "
            "with an int8 unit, or run the float model with a precision policy",
            field="tensor.supported_dtypes", limit=list(hcd.dtypes), value="int8", node=quantised[0])
    if precision is None:
        check_float64(hcd, ir)
    if precision is None and hcd.unit_for("float32") is None:
        f32 = [n for n, v in ir.values.items() if v.dtype == "float32"]
        if f32:
            raise HardConstraintError(
                f"{chip} has no float32 compute unit and this graph computes in float32 (e.g. {f32[0]}); "
                f"supported dtypes are {', '.join(hcd.dtypes)}. Ask for a precision policy: "
                f"precision=\"float16\" or \"bfloat16\" (torch.compile options={{\"precision\": \"float16\"}}, "
                f"CLI --precision float16)",
                field="tensor.supported_dtypes", limit=list(hcd.dtypes), value="float32", node=f32[0])
