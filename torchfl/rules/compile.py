"""Rule-pack file -> :class:`RulePack`, reporting every problem with file:line:column.

Passes, all collecting diagnostics: the project's one YAML loader
(:func:`torchfl.hcd.located_yaml`: bounded, duplicate keys refused); structure through
the pydantic models of :mod:`torchfl.rules.format`; then meaning: kernels exist (nearest
names otherwise), arg types are known, guards and bind expressions parse and type-check
(the position is that of the offending character inside the YAML), bind names fit the
kernel, fusion steps link to rules and to each other. Nothing from the file is executed.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field

from pydantic import ValidationError

from torchfl.hcd import Diagnostic, YAMLLoadError, located_yaml
from torchfl.hcd.source import read_source
from torchfl.rules import kernels as K
from torchfl.rules.format import FusionModel, GuardItem, PackModel, RuleModel
from torchfl.rules.guards import GuardEvalError, GuardSyntaxError, compile_guard
from torchfl.rules.guards.evaluate import evaluate
from torchfl.rules.guards.syntax import BoolOp as SyntaxBoolOp
from torchfl.rules.guards.syntax import Name as SyntaxName
from torchfl.rules.guards.syntax import Node as SyntaxNode
from torchfl.rules.guards.chip import CHIP
from torchfl.rules.guards.types import ARG_TYPES, TENSOR, arg_type, record, strip
from torchfl.rules.compile_decompositions import DecompositionChecks
from torchfl.rules.groups import pattern_ends
from torchfl.rules.pack import Binding, CheckedGuard, Fusion, FusionStep, NoRuleEntry, Rule, RulePack, rule_scope
from torchfl.rules.packdiag import PackDiagnostics


@dataclass
class PackReport:
    """Outcome of checking one pack file; ``pack`` is set only when there is no error."""

    file: str
    pack: RulePack | None = None
    diagnostics: list[Diagnostic] = field(default_factory=list)
    source: str | None = None

    @property
    def ok(self) -> bool:
        return self.pack is not None and not any(d.severity == "error" for d in self.diagnostics)


class PackError(Exception):
    """A rule pack that failed checking; ``.diagnostics`` lists every problem."""

    def __init__(self, diagnostics: list[Diagnostic]):
        self.diagnostics = sorted(diagnostics)
        super().__init__("\n".join(str(d) for d in self.diagnostics) or "invalid rule pack")


def check_pack(path) -> PackReport:
    """Read and check one rule pack file (what ``registry import`` and ``validate`` read).
    Never raises for bad input. A user's pack has its decomposition parts checked against
    torch's operator schemas here (a cold ``import torch`` where it has decompositions); the
    text of a pack already in a registry was checked so when it was imported."""
    text, diagnostics, _readable = read_source(path, "a rule pack")
    if text is None:
        return PackReport(str(path), diagnostics=diagnostics)
    return check_pack_text(text, str(path), schemas=not _bundled(path))


def _bundled(path) -> bool:
    """A pack shipped with torchfl: its decompositions are checked against torch's schemas by
    the test suite (tests/rules/test_pack_faults.py), not at every first use of a registry
    (seeding imports the bundled packs; ``import torch`` would cost it ~1.3 s of CPU)."""
    from pathlib import Path

    from torchfl.resources import bundled_path

    try:
        return Path(path).resolve().parent == bundled_path("rules").resolve()
    except OSError:
        return False


def check_pack_text(text: str, filename: str = "<string>", *, schemas: bool = False) -> PackReport:
    """Check rule-pack source text. Never raises for bad input. ``schemas``: also check
    decomposition parts against torch's operator schemas (imports torch)."""
    report = PackReport(filename, source=text)
    try:
        doc = located_yaml(text, filename, keep_going=True)
    except YAMLLoadError as exc:
        report.diagnostics = list(exc.diagnostics)
        return report
    try:
        report.pack, found = _Compiler(doc, text, schemas).run()
        # the loader's problems (duplicate keys, refused tags) beside the pack's own: one
        # problem, one diagnostic, so nothing more is said about a value the loader refused
        report.diagnostics = [d for d in found if not doc.is_refused(d.path)] + doc.problems
    except RecursionError:  # belt and braces: every bound is checked before this could happen
        report.diagnostics = [Diagnostic(filename, 1, 1, "", "error", "rule pack nested too deeply")]
    if any(d.severity == "error" for d in report.diagnostics):
        report.pack = None
    report.diagnostics.sort()
    return report


def load_pack(path) -> RulePack:
    """A checked pack, or :class:`PackError`."""
    return _require(check_pack(path))


def load_pack_text(text: str, filename: str = "<string>") -> RulePack:
    return _require(check_pack_text(text, filename))


def _require(report: PackReport) -> RulePack:
    if not report.ok:
        raise PackError(report.diagnostics)
    return report.pack


class _Compiler(DecompositionChecks, PackDiagnostics):
    """The passes over one pack: structure, then each rule, fusion and decomposition."""

    # -- passes --
    def run(self):
        data = self.doc.data
        if not isinstance(data, dict):
            self.error((), "a rule pack is a YAML mapping with pack:, rules: and optionally fusions:, no_rule:")
            return None, self.diags
        try:
            model = PackModel.model_validate(data)
        except ValidationError as exc:
            self.structure(exc)
            return None, self.diags
        pname = model.pack.name
        rules = tuple(r for r in (self.rule(pname, i, m) for i, m in enumerate(model.rules)) if r is not None)
        by_op: dict[str, Rule] = {}
        for r in rules:
            by_op.setdefault(r.op, r)
        self.broken_ops = {m.op for m in model.rules} - set(by_op)  # their errors are reported already
        fusions = tuple(f for f in (self.fusion(pname, i, m, by_op) for i, m in enumerate(model.fusions)) if f)
        decompositions = tuple(d for d in (self.decomposition(pname, i, m, by_op)
                                           for i, m in enumerate(model.decompositions)) if d)
        no_rule = []
        for i, e in enumerate(model.no_rule):
            if e.op in by_op:
                self.error(("no_rule", i, "op"), f"{e.op} is listed under no_rule but has a rule; remove one of them")
            no_rule.append(NoRuleEntry(e.op, e.reason))
        if self.errors():
            return None, self.diags
        dumped = model.model_dump(mode="json", by_alias=True)
        for f in dumped["fusions"]:   # into: is newer than the packs already published: absent when unset,
            for step in f["pattern"]:  # so their canonical form and content hash stay as they were
                if step.get("into") is None:
                    step.pop("into", None)
        if not dumped["decompositions"]:   # likewise for packs without decompositions
            dumped.pop("decompositions")
        canonical = json.dumps(dumped, sort_keys=True, separators=(",", ":"))
        return RulePack(pname, model.pack.version, model.pack.description, rules, fusions, tuple(no_rule),
                        self.doc.filename, canonical, decompositions), self.diags

    # -- rules --
    def kernel(self, path, name: str) -> bool:
        names = K.kernel_names()
        if name not in names:
            self.error(path, f"kernel {name!r} is not in the kernel catalog{self.near(name, names)}")
            return False
        return True

    def rule(self, pname: str, index: int, m: RuleModel) -> Rule | None:
        base = ("rules", index)
        before = len(self.diags)
        self.kernel(base + ("kernel",), m.kernel)
        for name, spelling in m.args.items():
            if not name.isidentifier() or name.startswith("_"):
                self.error(base + ("args", name), f"argument name {name!r} must be an identifier not starting with _",
                           key=True)
            if arg_type(spelling) is None:
                self.error(base + ("args", name), f"unknown argument type {spelling!r}; use one of "
                           f"{', '.join(sorted(ARG_TYPES))} (add ? for optional)")
        for name in m.defaults:
            if name not in m.args:
                self.error(base + ("defaults", name), f"default for {name!r}, which is not in args", key=True)
        args = tuple(m.args.items())
        primary = m.primary
        if primary is None:
            primary = next((n for n, s in args if strip(arg_type(s) or TENSOR) == TENSOR), None)
        elif primary not in m.args or strip(arg_type(m.args[primary]) or TENSOR) != TENSOR:
            self.error(base + ("primary",), f"primary {primary!r} must name a tensor argument in args")
        self.requires(base + ("requires",), m.requires, m.kernel)
        scope = rule_scope(args, CHIP)
        guards = self.guards(base + ("guards",), m.guards, scope)
        bind = self.bindings(base + ("bind",), m.bind, scope, m.kernel, m.args)
        if len(self.diags) > before and any(d.severity == "error" for d in self.diags[before:]):
            return None
        line = self.doc.where(base)[0]
        return Rule(pack=pname, index=index, op=m.op, kernel=m.kernel, args=args, primary=primary,
                    requires=m.requires, guards=guards, bind=bind, defaults=tuple(m.defaults.items()), note=m.note,
                    line=line)

    def requires(self, path, req, kernel: str):
        kd = K.kernel_dtypes(kernel)
        if req.dtypes and kd is not None:
            extra = [d for d in req.dtypes if d not in kd]
            if extra:
                self.error(path + ("dtypes",), f"kernel {kernel} does not compute in {', '.join(extra)} "
                           f"(it supports {', '.join(kd)})")
        if isinstance(req.layouts, list):
            for i, lay in enumerate(req.layouts):
                if not (lay.isalpha() and lay.isupper() and len(set(lay)) == len(lay) and 1 <= len(lay) <= 8):
                    self.error(path + ("layouts", i), f"layout {lay!r} must be distinct capital letters, e.g. NHWC")

    def guards(self, path, items, scope) -> tuple[CheckedGuard, ...]:
        out = []
        for i, item in enumerate(items):
            gpath = path + (i,)
            text, reason = (item, "") if isinstance(item, str) else (item.if_, item.reason)
            if isinstance(item, GuardItem):
                gpath = gpath + ("if",)
            try:
                g = compile_guard(text, scope)
            except GuardSyntaxError as exc:
                self.guard_error(gpath, text, exc, "guard")
                continue
            if _always_false(g):
                self.guard_error(gpath, text, GuardSyntaxError("always false, so what it guards can never apply; "
                                                               "fix the condition or remove it", 0),
                                 "guard")
                continue
            line, col = self.doc.where(gpath)
            out.append(CheckedGuard(text, g, reason, line, col))
        return tuple(out)

    def bindings(self, path, bind: dict, scope, kernel: str, args: dict) -> tuple[Binding, ...]:
        params = K.kernel_params(kernel)
        out = []
        for name, value in bind.items():
            if params is not None and name not in params[0] | params[1]:
                self.error(path + (name,), f"kernel {kernel} has no input or attribute {name!r}"
                           f"{self.near(name, params[0] | params[1])} (inputs: {', '.join(sorted(params[0]))}; "
                           f"attrs: {', '.join(sorted(params[1])) or 'none'})", key=True)
                continue
            if isinstance(value, str):
                try:
                    out.append(Binding(name, compile_guard(value, scope, want_bool=False)))
                except GuardSyntaxError as exc:
                    self.guard_error(path + (name,), value, exc, "bind expression")
            else:
                out.append(Binding(name, None, value))
        if params is not None:
            bound = {b.name for b in out}
            for same in (params[0] | params[1]) & set(args) - bound:  # same name: bound implicitly
                out.append(Binding(same, compile_guard(same, scope, want_bool=False)))
            spec = K.spec(kernel)
            missing = [n for n in spec.required_inputs if n not in {b.name for b in out}]
            if missing:
                self.error(path, f"kernel {kernel} needs input(s) {', '.join(missing)}; bind them from the op's args"
                           f" ({', '.join(args) or 'none declared'})", key=True)
        return tuple(out)

    # -- fusions --
    def fusion(self, pname: str, index: int, m: FusionModel, by_op: dict[str, Rule]) -> Fusion | None:
        base = ("fusions", index)
        before = len(self.diags)
        self.kernel(base + ("kernel",), m.kernel)
        steps, seen, records, step_rules, step_rules_by_id = [], [], {}, [], {}
        for i, s in enumerate(m.pattern):
            spath = base + ("pattern", i)
            ops = (s.op,) if isinstance(s.op, str) else tuple(s.op)
            if s.id in seen or s.id in ("chip", "shape", "dtype", "layout", "rank", "out"):
                self.error(spath + ("id",), f"step id {s.id!r} is used twice or is a reserved name")
            rule = None
            for j, op in enumerate(ops):
                r = by_op.get(op)
                if r is None and op in self.broken_ops:
                    return None
                if r is None:
                    self.error(spath + (("op", j) if isinstance(s.op, list) else ("op",)),
                               f"{op} has no rule in this pack; a fusion step takes its args from the op's rule"
                               f"{self.near(op, by_op)}")
                elif rule is None:
                    rule = r
                elif r.arg_names() != rule.arg_names():
                    self.error(spath + ("op", j), f"{op} takes ({', '.join(r.arg_names())}) but {rule.op} takes "
                               f"({', '.join(rule.arg_names())}); alternatives in one step need the same args")
            producer = s.from_ if s.from_ is not None else (seen[-1] if seen and s.into is None else None)
            if i == 0 and (s.from_ is not None or s.into is not None):
                self.error(spath + ("from" if s.from_ is not None else "into",),
                           "the first step has no producer or consumer; remove from:/into:")
            if producer is not None and producer not in seen:
                self.error(spath + ("from",), f"from: {producer!r} is not an earlier step (steps: {', '.join(seen)})")
            feed = s.input
            if s.into is not None:
                consumer = step_rules_by_id.get(s.into)
                if s.from_ is not None:
                    self.error(spath + ("into",), "a step has either from: (its producer) or into: (its consumer)")
                elif s.into not in seen:
                    self.error(spath + ("into",), f"into: {s.into!r} is not an earlier step (steps: {', '.join(seen)})")
                elif s.input is None:
                    self.error(spath + ("into",), f"into: {s.into} needs input: the argument of {s.into} this "
                               "step's output feeds")
                elif consumer is not None and s.input not in dict(consumer.args):
                    self.error(spath + ("input",), f"input {s.input!r} is not an argument of {consumer.op} "
                               f"(args: {', '.join(dict(consumer.args))})")
                if rule is not None:
                    records[s.id] = record(s.id, **{n: arg_type(t) or TENSOR for n, t in rule.args}, out=TENSOR)
                    step_rules.append((s.id, rule))
                    step_rules_by_id[s.id] = rule
                seen.append(s.id)
                steps.append(FusionStep(s.id, ops, s.input, None, 0, (), s.into))
                continue
            if rule is not None:
                names = dict(rule.args)
                if feed is None and i > 0:
                    feed = rule.primary
                if feed is not None and (feed not in names or strip(arg_type(names[feed]) or TENSOR) != TENSOR):
                    self.error(spath + ("input",), f"input {feed!r} is not a tensor argument of {rule.op} "
                               f"(args: {', '.join(names)})")
                for c in s.commutative or ():
                    if c not in names:
                        self.error(spath + ("commutative",), f"{c!r} is not an argument of {rule.op}")
                records[s.id] = record(s.id, **{n: arg_type(t) or TENSOR for n, t in rule.args}, out=TENSOR)
                step_rules.append((s.id, rule))
                step_rules_by_id[s.id] = rule
            seen.append(s.id)
            steps.append(FusionStep(s.id, ops, feed if i > 0 else None, producer, s.output,
                                    tuple(s.commutative or ())))
        ends = pattern_ends(steps)
        if len(ends) > 1:
            self.error(base + ("pattern",), f"the pattern ends in {len(ends)} steps ({', '.join(ends)}) but a fused "
                       "kernel writes one value: each other step must feed a later one (from:) or an earlier one (into:)")
        same = self.same_values(base + ("same",), m.same, step_rules_by_id)
        self.requires(base + ("requires",), m.requires, m.kernel)
        scope = dict(rule_scope((), CHIP))
        scope.update(records)
        guards = self.guards(base + ("guards",), m.guards, scope)
        bind = self.bindings(base + ("bind",), m.bind, scope, m.kernel, {})
        if any(d.severity == "error" for d in self.diags[before:]):
            return None
        return Fusion(pname, index, m.name, m.kernel, tuple(steps), tuple(m.through), m.requires, guards, bind,
                      m.note, self.doc.where(base)[0], tuple(step_rules), same)

    def same_values(self, path, groups, rules) -> tuple:
        """A fusion's ``same:`` groups as ((step id, arg), ...) after checking each names a
        step of the pattern and an argument of that step's op."""
        out = []
        for g, refs in enumerate(groups):
            pairs = []
            for j, ref in enumerate(refs):
                sid, arg = ref.split(".", 1)
                rule = rules.get(sid)
                if rule is None:
                    self.error(path + (g, j), f"{ref!r}: {sid!r} is not a step of this pattern")
                elif arg not in dict(rule.args):
                    self.error(path + (g, j), f"{ref!r}: {arg!r} is not an argument of {rule.op} "
                               f"(args: {', '.join(dict(rule.args))})")
                pairs.append((sid, arg))
            if len(set(pairs)) != len(pairs):
                self.error(path + (g,), "a same: group names one step argument twice")
            out.append(tuple(pairs))
        return tuple(out)


def _constant(node) -> bool:
    """Whether a guard's tree reads no name (no argument, no chip field): its value is fixed."""
    if isinstance(node, SyntaxName):
        return False
    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        for item in value if isinstance(value, (list, tuple)) else (value,):
            if isinstance(item, SyntaxNode) and not _constant(item):
                return False
    return True


def _always_false(guard) -> bool:
    """A guard that is false whatever the call and chip: a constant (``false``, ``1 == 2``),
    or an ``and`` with such a part."""
    parts = guard.tree.values if isinstance(guard.tree, SyntaxBoolOp) and guard.tree.op == "and" else (guard.tree,)
    for part in parts:
        if _constant(part):
            try:
                if not evaluate(part, guard.text, {}):
                    return True
            except GuardEvalError:
                return True  # e.g. 1 / 0: fails on every call
    return False
