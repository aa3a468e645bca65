"""The ``decompositions:`` of a rule pack: args (their own, else their op's rule's), guards,
and parts whose expressions see the args and the parts before them; with ``schemas``, each
part's call checked against torch's own operator schema."""

from __future__ import annotations

from torchfl.rules.guards import GuardSyntaxError, compile_guard
from torchfl.rules.guards.chip import CHIP
from torchfl.rules.guards.types import ARG_TYPES, TENSOR, arg_type, strip
from torchfl.rules.pack import Binding, Decomposition, DecompositionPart, Rule, rule_scope


class DecompositionChecks:
    """Mixin of the pack compiler: needs ``error``, ``guard_error``, ``guards``, ``doc``,
    ``diags``, ``schemas`` and ``broken_ops`` (see ``rules/compile.py``)."""

    def decomposition(self, pname: str, index: int, m, by_op: dict[str, Rule]) -> Decomposition | None:
        """A decomposition's args (its own, else its op's rule's), guards, and parts whose
        expressions see the args and the parts before them (a later part is an unknown name)."""
        base = ("decompositions", index)
        before = len(self.diags)
        args = tuple(m.args.items())
        if not args:
            rule = by_op.get(m.op)
            if rule is None:
                if m.op not in self.broken_ops:
                    self.error(base + ("op",), f"{m.op} has no rule in this pack to take its arguments from; "
                               "declare them under args:")
                return None
            args, defaults, primary = rule.args, dict(rule.defaults), rule.primary
        else:
            defaults, primary = {}, None
            for name, spelling in args:
                if arg_type(spelling) is None:
                    self.error(base + ("args", name), f"unknown argument type {spelling!r}; use one of "
                               f"{', '.join(sorted(ARG_TYPES))} (add ? for optional)")
            primary = next((n for n, t in args if strip(arg_type(t) or TENSOR) == TENSOR), None)
        for name, value in m.defaults.items():
            if name not in dict(args):
                self.error(base + ("defaults", name), f"default for {name!r}, which is not in args", key=True)
            defaults[name] = value
        if m.requires.dtypes or m.requires.units or m.requires.device_types or m.requires.layouts != "unit":
            self.error(base + ("requires",), "a decomposition's parts carry their own dtype, unit and layout "
                       "requirements; here only attention: (and compute:/storage:) apply", key=True)
        scope = dict(rule_scope(args, CHIP))
        guards = self.guards(base + ("guards",), m.guards, scope)
        parts = []
        for i, part in enumerate(m.parts):
            ppath = base + ("parts", i)
            if part.id in scope:
                self.error(ppath + ("id",), f"part id {part.id!r} is already an argument, a part or a built-in name")
                continue
            if part.op == m.op:
                self.error(ppath + ("op",), f"part {part.id} is {m.op} itself: a decomposition cannot recurse")
            when = None
            if part.when is not None:
                try:
                    when = compile_guard(part.when, scope)
                except GuardSyntaxError as exc:
                    self.guard_error(ppath + ("when",), part.when, exc, "when")
            self.part_call(ppath, part)
            pargs = self.expressions(ppath + ("args",), enumerate(part.args), scope)
            kwargs = self.expressions(ppath + ("kwargs",), part.kwargs.items(), scope)
            parts.append(DecompositionPart(part.id, part.op, pargs, kwargs, when, self.doc.where(ppath)[0]))
            scope[part.id] = TENSOR
        if any(d.severity == "error" for d in self.diags[before:]):
            return None
        return Decomposition(pack=pname, index=index, name=m.name, op=m.op, args=args, primary=primary,
                             requires=m.requires, guards=guards, parts=tuple(parts),
                             defaults=tuple(defaults.items()), note=m.note, line=self.doc.where(base)[0])

    def part_call(self, ppath, part) -> None:
        """A part's op must be an ATen overload called with arguments its schema accepts:
        checked here against torch's own schema (imported only for a file being checked,
        see :func:`check_pack`), or the pack imports and the planner fails on the first model
        that meets it."""
        if not self.schemas:
            return
        schema = _schema(part.op)
        if schema is None:
            self.error(ppath + ("op",), f"part {part.id}: {part.op} is not an operator of this torch "
                       f"({_torch_version()}); write an overload name such as aten.transpose.int")
            return
        names = [a.name for a in schema.arguments]
        positional = [a.name for a in schema.arguments if not a.kwarg_only]
        if len(part.args) > len(positional):
            self.error(ppath + ("args",), f"part {part.id}: {part.op} takes at most {len(positional)} positional "
                       f"argument(s) ({', '.join(positional)}), got {len(part.args)}")
            return
        given = set(positional[: len(part.args)])
        for key in part.kwargs:
            if key not in names:
                self.error(ppath + ("kwargs", key), f"part {part.id}: {part.op} has no argument {key!r} "
                           f"(arguments: {', '.join(names)})", key=True)
            elif key in given:
                self.error(ppath + ("kwargs", key), f"part {part.id}: {key!r} is given twice (positionally and "
                           "by name)", key=True)
        given |= set(part.kwargs)
        missing = [a.name for a in schema.arguments if a.name not in given and not a.has_default_value()
                   and not str(a.type).endswith("?")]
        if missing:
            self.error(ppath + ("args",), f"part {part.id}: {part.op} needs {', '.join(missing)} "
                       f"({schema}); pass them under args: or kwargs:")

    def expressions(self, path, items, scope) -> tuple[Binding, ...]:
        """(key, value) pairs -> Bindings: strings are expressions, other values constants."""
        out = []
        for key, value in items:
            if isinstance(value, str):
                try:
                    out.append(Binding(str(key), compile_guard(value, scope, want_bool=False)))
                except GuardSyntaxError as exc:
                    self.guard_error(path + (key,), value, exc, "expression")
            else:
                out.append(Binding(str(key), None, value))
        return tuple(out)


def _schema(op: str):
    """torch's schema of an overload name (``aten.transpose.int``), or None if there is none."""
    import torch  # lazily: only checking a pack file with decompositions needs it

    parts = op.split(".")
    if len(parts) != 3:
        return None
    try:
        return getattr(getattr(getattr(torch.ops, parts[0]), parts[1]), parts[2])._schema
    except (AttributeError, RuntimeError):
        return None


def _torch_version() -> str:
    import torch

    return f"torch {torch.__version__}"
