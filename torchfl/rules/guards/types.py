"""Static types of the guard language, so that obvious mistakes are refused at import.

The types are deliberately few: ``int``, ``float``, ``bool``, ``str``, ``none``,
``list[T]``, ``any``, optional ``T?`` (a call argument that may be absent), and records
(a tensor's metadata, the ``chip`` namespace) with a fixed set of fields. ``any`` is the
escape hatch: it checks with everything, and the evaluator still refuses a wrong value at
run time (the guard then fails with a reason).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Type:
    kind: str  # int float bool str none any list record optional
    elem: "Type | None" = None  # list element / optional inner
    name: str = ""  # record name, for messages
    fields: tuple[tuple[str, "Type"], ...] = field(default=())

    def __str__(self) -> str:
        if self.kind == "list":
            return f"list[{self.elem}]"
        if self.kind == "optional":
            return f"{self.elem}?"
        if self.kind == "record":
            return self.name
        return self.kind

    def field(self, name: str) -> "Type | None":
        for key, value in self.fields:
            if key == name:
                return value
        return None

    @property
    def field_names(self) -> list[str]:
        return [k for k, _ in self.fields]


INT, FLOAT, BOOL, STR, NONE, ANY = (Type(k) for k in ("int", "float", "bool", "str", "none", "any"))


def list_of(t: Type) -> Type:
    return Type("list", t)


def optional(t: Type) -> Type:
    return t if t.kind in ("optional", "any", "none") else Type("optional", t)


def record(name: str, **fields: Type) -> Type:
    return Type("record", name=name, fields=tuple(fields.items()))


def strip(t: Type) -> Type:
    """The type under an optional (an absent value is refused at run time)."""
    return t.elem if t.kind == "optional" else t


def numeric(t: Type) -> bool:
    return strip(t).kind in ("int", "float", "bool", "any")


TENSOR = record(
    "tensor",
    shape=list_of(INT),
    dtype=STR,
    layout=optional(STR),
    rank=INT,
    numel=INT,
)

# Names used in pack ``args:`` declarations, e.g. ``{self: tensor, dim: int[], bias: tensor?}``.
ARG_TYPES = {
    "tensor": TENSOR,
    "tensor[]": list_of(TENSOR),
    "int": INT,
    "int[]": list_of(INT),
    "float": FLOAT,
    "float[]": list_of(FLOAT),
    "bool": BOOL,
    "bool[]": list_of(BOOL),
    "str": STR,
    "scalar": ANY,  # ATen Scalar: int, float or bool
    "dtype": STR,  # short dtype name, e.g. "float16"
    "any": ANY,
}


def arg_type(spelling: str) -> Type | None:
    """``"tensor?"`` -> optional tensor; None if the spelling is unknown."""
    opt = spelling.endswith("?")
    base = ARG_TYPES.get(spelling[:-1] if opt else spelling)
    if base is None:
        return None
    return optional(base) if opt else base


def compatible(a: Type, b: Type) -> bool:
    """Could a value of ``a`` ever equal / be compared with one of ``b``?"""
    a, b = strip(a), strip(b)
    if "any" in (a.kind, b.kind) or "none" in (a.kind, b.kind):
        return True
    if numeric(a) and numeric(b):
        return True
    if a.kind == "list" and b.kind == "list":
        return compatible(a.elem, b.elem)
    return a.kind == b.kind and (a.kind != "record" or a.name == b.name)


def unify(types: list[Type]) -> Type:
    kinds = {strip(t).kind for t in types}
    if not types:
        return ANY
    if len(kinds) == 1:
        return strip(types[0])
    if kinds <= {"int", "float", "bool"}:
        return FLOAT if "float" in kinds else INT
    return ANY
