"""The rule-pack file format (``rules/*.yaml``), as pydantic models: structure only.

Meaning (kernels exist, guards parse and type-check, bind names fit the kernel, fusion
steps link up) is checked afterwards in :mod:`torchfl.rules.compile`, where every problem
gets the file:line:column of the YAML value it is about.

    pack: {name: core, version: 1.0.0, description: ...}
    rules:
      - op: aten.convolution.default          # ATen overload name
        kernel: conv2d                         # a name in the kernel catalog
        args: {input: tensor, weight: tensor, bias: tensor?, stride: int[], ...}
        primary: input                         # tensor whose dtype/shape the rule is about
        requires: {dtypes: [float16, bfloat16, int8], layouts: unit, attention: true,
                   units: [fp16], device_types: [npu_v3], compute: true}
        guards: ["not transposed", {if: "groups == 1", reason: "grouped conv unsupported"}]
        bind: {x: input, weight: weight, stride: stride, groups: groups}
    fusions:
      - name: conv_bn_relu
        kernel: conv2d_bn_relu
        pattern:
          - {id: conv, op: aten.convolution.default}
          - {id: bn, op: aten._native_batch_norm_legit_no_training.default, input: input, output: 0}
          - {id: relu, op: aten.relu.default}
        guards: ["conv.groups == 1"]
        bind: {x: conv.input, weight: conv.weight, ...}
    decompositions:                            # op -> a little graph of other ops (planner/decompose.py)
      - name: sdpa_gemm_softmax
        op: aten.scaled_dot_product_attention.default
        requires: {attention: false}           # false: only on a chip with no enabled attention unit
        guards: ["dropout_p == 0"]
        parts:                                 # args: expressions over the op's args and earlier parts
          - {id: kt, op: aten.transpose.int, args: [key, 2, 3]}
          - {id: s, op: aten.matmul.default, args: [query, kt]}
          - {id: m, op: aten.add.Tensor, args: [s, attn_mask], when: "attn_mask != none"}  # skipped: = s
          - {id: p, op: aten._softmax.default, args: [m, -1, false]}
          - {id: o, op: aten.matmul.default, args: [p, value]}   # the last part is the op's value
    no_rule:
      - {op: aten.index.Tensor, reason: "..."}
"""

from __future__ import annotations

from typing import Annotated, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

from torchfl.hcd.dtypes import MATRIX_UNITS, STORAGE
from torchfl.rules.guards.syntax import MAX_CHARS, MAX_INT

SEMVER = r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$"
OP_NAME = r"^(aten|prims|torchfl|quantized_decomposed|transformers)\.[A-Za-z0-9_]+\.[A-Za-z0-9_]+$"
IDENT = r"^[A-Za-z][A-Za-z0-9_]*$"
STEP_ARG = r"^[A-Za-z][A-Za-z0-9_]*\.[A-Za-z_][A-Za-z0-9_]*$"     # a fusion step's argument: step.arg
UNITS = Literal[MATRIX_UNITS + ("attention",)]
DTYPES = Literal[tuple(STORAGE)]


#: Plausible sizes of a pack's parts: an ATen op has at most ~20 arguments, a fusion a few
#: steps; numbers written in a pack are those a guard could compute (|n| <= 2**62, finite).
MAX_ARGS = 64
MAX_LIST = 64
MAX_NAME = 128
Int = Annotated[int, Field(ge=-MAX_INT, le=MAX_INT)]
Float = Annotated[float, Field(ge=-1e300, le=1e300, allow_inf_nan=False)]
Text = Annotated[str, Field(max_length=MAX_CHARS)]
Name = Annotated[str, Field(max_length=MAX_NAME)]
#: as an HCD's chip.device_type (a trailing newline is not one: issue 39)
DeviceType = Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]{0,31}$", max_length=MAX_NAME)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class PackInfo(_Model):
    name: str = Field(pattern=r"^[a-z][a-z0-9_-]{0,63}$", description="Pack identifier, e.g. core.")
    version: str = Field(pattern=SEMVER, description="Semantic version of this pack (MAJOR.MINOR.PATCH).")
    description: str = Field(default="", max_length=2000)


class Requires(_Model):
    """Conditions on the HCD (not the call)."""

    dtypes: Optional[list[DTYPES]] = Field(default=None, max_length=MAX_LIST, description="dtypes the rule computes in "
                                           "(default: all the kernel supports); the chip must list one.")
    units: Optional[list[UNITS]] = Field(default=None, max_length=MAX_LIST, description="compute units that must be present.")
    attention: Optional[bool] = Field(default=None, description="true: the attention unit must be enabled; "
                                      "false (decompositions): it must be absent or disabled.")
    layouts: Union[Literal["unit", "chip", "none"], Annotated[list[Name], Field(max_length=MAX_LIST)]] = Field(
        default="unit",
        description="unit: the layouts of the unit running the dtype; chip: any layout the chip computes in "
        "(layout-preserving ops); none: layout does not apply; or a list, intersected with the unit's.",
    )
    device_types: Optional[list[DeviceType]] = Field(default=None, max_length=MAX_LIST, description="restrict to these chip.device_type values.")
    compute: bool = Field(default=True, description="false for data movement: the dtype must be stored, "
                          "no compute unit needed.")
    storage: bool = Field(default=True, description="false for a view that moves no data (reshape, "
                          "unsqueeze): the value is already on the device, so its dtype need not be one the "
                          "chip lists (int64 token ids reshaped before an embedding).")
    index: bool = Field(default=False, description="true for index math and masks (position ids, padding "
                        "masks): an int32, int64 or bool value the chip does not list in "
                        "tensor.supported_dtypes runs on the chip's index path (its address arithmetic, "
                        "priced at the integer unit's rate) instead of being refused; explain says so. A "
                        "listed dtype runs on its unit as usual.")


class GuardItem(_Model):
    if_: str = Field(alias="if", description="the condition (its length is bounded by the guard language)")
    reason: str = Field(default="", max_length=500, description="what to tell the user when it is false")


GuardSpec = Union[str, GuardItem]  # guard and bind texts: bounded, with their own message, by the guard parser
BindValue = Union[bool, Int, Float, str, None]
DefaultValue = Union[bool, Int, Float, Text, None, Annotated[list[Union[bool, Int, Float, Text, None]],
                                                               Field(max_length=MAX_LIST)]]


class RuleModel(_Model):
    op: str = Field(pattern=OP_NAME, max_length=MAX_NAME)
    kernel: str = Field(min_length=1, max_length=100)
    args: dict[Name, Name] = Field(default_factory=dict, max_length=MAX_ARGS, description="the op's arguments in ATen order: name -> type")
    primary: Optional[Name] = None
    requires: Requires = Field(default_factory=Requires)
    guards: list[GuardSpec] = Field(default_factory=list, max_length=32)
    bind: dict[Name, BindValue] = Field(default_factory=dict, max_length=MAX_ARGS,
                                        description="kernel input/attr -> expression")
    defaults: dict[Name, DefaultValue] = Field(default_factory=dict, max_length=MAX_ARGS, description="values of args the call may omit")
    note: str = Field(default="", max_length=1000)


class FusionStep(_Model):
    id: str = Field(pattern=IDENT, max_length=MAX_NAME)
    op: Union[Name, Annotated[list[Name], Field(max_length=MAX_LIST)]]
    input: Optional[Name] = Field(default=None, description="arg of this op fed by the previous step (default: primary)")
    from_: Optional[Name] = Field(default=None, alias="from", description="step id feeding it (default: previous)")
    into: Optional[Name] = Field(default=None, description="instead of from: an earlier step whose argument "
                                 "`input` this step's output feeds (a second operand of a DAG pattern: the "
                                 "weight's dequantize feeding a conv)")
    output: int = Field(default=0, ge=0, le=MAX_LIST, description="which output of the feeding step (tuple-returning ops)")
    commutative: Optional[list[Name]] = Field(default=None, max_length=MAX_LIST, description="args that may be swapped, e.g. [self, other]")


class FusionModel(_Model):
    name: str = Field(pattern=IDENT, max_length=MAX_NAME)
    kernel: str = Field(min_length=1, max_length=100)
    pattern: list[FusionStep] = Field(min_length=2, max_length=16)
    through: list[Name] = Field(default_factory=list, max_length=MAX_LIST, description="view-like ops allowed between steps")
    same: list[Annotated[list[Annotated[str, Field(pattern=STEP_ARG, max_length=2 * MAX_NAME)]],
                         Field(min_length=2, max_length=MAX_LIST)]] = Field(
        default_factory=list, max_length=MAX_LIST,
        description="groups of step arguments (step.arg) that hold one and the same graph value: a value "
                    "read by several steps, e.g. GELU-tanh's x in [cube.self, inner.self, half.self]")
    requires: Requires = Field(default_factory=Requires)
    guards: list[GuardSpec] = Field(default_factory=list, max_length=32)
    bind: dict[Name, BindValue] = Field(default_factory=dict, max_length=MAX_ARGS)
    note: str = Field(default="", max_length=1000)


class DecompositionPart(_Model):
    """One op of a decomposition: an ATen overload applied to expressions over the decomposed
    op's arguments and the earlier parts (a bare name is that tensor)."""

    id: str = Field(pattern=IDENT, max_length=MAX_NAME)
    op: str = Field(pattern=OP_NAME, max_length=MAX_NAME)
    args: list[BindValue] = Field(default_factory=list, max_length=MAX_ARGS,
                                  description="positional arguments: expressions (strings) or constants")
    kwargs: dict[Name, BindValue] = Field(default_factory=dict, max_length=MAX_ARGS,
                                          description="keyword arguments, e.g. dtype: \"'bool'\"")
    when: Optional[Text] = Field(default=None, description="skip the part unless this holds; a skipped part's "
                                 "value is its first argument's")


class DecompositionModel(_Model):
    """An op served by a composition of other ops, each planned and priced by its own rule;
    the planner compares the whole against the op's direct kernels and the CPU fallback."""

    name: str = Field(pattern=IDENT, max_length=MAX_NAME)
    op: str = Field(pattern=OP_NAME, max_length=MAX_NAME)
    args: dict[Name, Name] = Field(default_factory=dict, max_length=MAX_ARGS,
                                   description="the op's arguments (default: those of its rule in this pack)")
    defaults: dict[Name, DefaultValue] = Field(default_factory=dict, max_length=MAX_ARGS)
    requires: Requires = Field(default_factory=Requires)
    guards: list[GuardSpec] = Field(default_factory=list, max_length=32)
    parts: list[DecompositionPart] = Field(min_length=1, max_length=32)
    note: str = Field(default="", max_length=1000)


class NoRule(_Model):
    op: str = Field(pattern=OP_NAME, max_length=MAX_NAME)
    reason: str = Field(min_length=1, max_length=1000)


class PackModel(_Model):
    pack: PackInfo
    rules: list[RuleModel] = Field(default_factory=list, max_length=5000)
    fusions: list[FusionModel] = Field(default_factory=list, max_length=500)
    decompositions: list[DecompositionModel] = Field(default_factory=list, max_length=500)
    no_rule: list[NoRule] = Field(default_factory=list, max_length=5000)
