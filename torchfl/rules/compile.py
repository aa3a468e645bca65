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
import difflib
import json
from dataclasses import dataclass, field

from pydantic import ValidationError

from torchfl.hcd import Diagnostic, YAMLLoadError, format_path, located_yaml
from torchfl.hcd.source import LocatedDocument, read_source
from torchfl.rules import kernels as K
from torchfl.rules.format import FusionModel, GuardItem, PackModel, RuleModel
from torchfl.rules.guards import GuardEvalError, GuardSyntaxError, compile_guard
from torchfl.rules.guards.evaluate import evaluate
from torchfl.rules.guards.syntax import BoolOp as SyntaxBoolOp
from torchfl.rules.guards.syntax import Name as SyntaxName
from torchfl.rules.guards.syntax import Node as SyntaxNode
from torchfl.rules.guards.chip import CHIP
from torchfl.rules.guards.types import ARG_TYPES, TENSOR, arg_type, record, strip
from torchfl.rules.groups import pattern_ends
from torchfl.rules.pack import (Binding, CheckedGuard, Decomposition, DecompositionPart, Fusion, FusionStep,
                                NoRuleEntry, Rule, RulePack, rule_scope)


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


def _near(word: str, choices, n: int = 3) -> str:
    close = difflib.get_close_matches(word, sorted(choices), n=n, cutoff=0.5)
    return f"; nearest: {', '.join(close)}" if close else ""


class _Compiler:
    def __init__(self, doc: LocatedDocument, text: str, schemas: bool = False):
        self.doc = doc
        self.schemas = schemas  # check decomposition parts against torch's operator schemas
        self.lines = text.splitlines()
        self.diags: list[Diagnostic] = []
        self._near_cache: dict = {}

    #: suggestions ("nearest: ...") computed per pack; difflib costs ~10 ms a call over the
    #: catalog, and a pack of thousands of bad names took 85 s to refuse
    NEAR_BUDGET = 50

    def near(self, word: str, choices) -> str:
        """``_near`` with a cache and a budget: each distinct word once, at most NEAR_BUDGET."""
        key = (word, id(choices))
        if key not in self._near_cache:
            if len(self._near_cache) >= self.NEAR_BUDGET:
                return ""
            self._near_cache[key] = _near(word, choices)
        return self._near_cache[key]

    # -- diagnostics --
    def error(self, path, message, *, key=False, severity="error"):
        self.diags.append(self.doc.diagnostic(tuple(path), message, severity, key=key))

    def guard_error(self, path, text: str, exc: GuardSyntaxError, what: str):
        line, col = self.guard_position(tuple(path), text, exc.offset)
        excerpt = text if len(text) <= 80 else text[: 77] + "..."
        self.diags.append(Diagnostic(self.doc.filename, line, col, format_path(path), "error",
                                     f"{what} {excerpt!r}: {exc.message}"))

    def guard_position(self, path, text: str, offset: int) -> tuple[int, int]:
        """file position of character ``offset`` of the scalar at ``path``."""
        line, col = self.doc.where(path)
        src = self.lines[line - 1] if 0 < line <= len(self.lines) else ""
        lead = src[col - 1 : col] if col - 1 < len(src) else ""
        offset = max(0, min(offset, len(text)))
        if lead in "|>" and lead:
            before = text[:offset]
            rel_line = before.count("\n")
            rel_col = offset - (before.rfind("\n") + 1)
            body = line + 1 + rel_line
            indent = 0
            first = next((x for x in self.lines[line:] if x.strip()), "")  # block indentation: first content line
            indent = len(first) - len(first.lstrip(" "))
            return body, indent + rel_col + 1
        if lead in ("'", '"'):
            col += 1
        return self._folded(line, col, offset)

    def _folded(self, line: int, col: int, offset: int) -> tuple[int, int]:
        """The position ``offset`` characters into a flow scalar that starts at (line, col)
        and may continue on the next lines (folded: each line break read as one space)."""
        while 0 < line <= len(self.lines):
            rest = len(self.lines[line - 1]) - (col - 1)
            if offset <= rest or line == len(self.lines):
                return line, col + min(offset, max(rest, 0))
            offset -= rest + 1
            line += 1
            text = self.lines[line - 1]
            col = len(text) - len(text.lstrip(" ")) + 1
        return line, col

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

    def errors(self) -> bool:
        return any(d.severity == "error" for d in self.diags)

    def structure(self, exc: ValidationError):
        grouped: dict[tuple, list[dict]] = {}
        for err in exc.errors():
            grouped.setdefault(self.data_path(err["loc"]), []).append(err)
        for path, errs in grouped.items():
            kinds = {e["type"] for e in errs}
            if len(errs) > 1 and not kinds & {"missing", "extra_forbidden"}:
                wanted = sorted({e["msg"].removeprefix("Input should be ").removeprefix("a valid ") for e in errs})
                self.error(path, f"got {_show(errs[0].get('input'))}; expected {' or '.join(wanted)}")
                continue
            for err in errs:
                self.structure_one(path, err)

    def structure_one(self, path, err):
        kind = err["type"]
        if kind == "missing":
            self.error(path, f"required field {path[-1]!r} is missing; add it")
        elif kind == "extra_forbidden":
            self.error(path, f"unknown field {path[-1]!r}{self.near(str(path[-1]), _fields_at(path))}", key=True)
        elif kind == "string_pattern_mismatch":
            what = path[-1] if path else "value"
            field = what
            if isinstance(what, int) and len(path) > 1:   # an item of a list: name the list
                field, what = path[-2], f"{path[-2]}[{what}]"
            hint = {"device_types": " (a chip.device_type: lower-case letters, digits and _, e.g. npu_v3)",
                    "op": " (an ATen overload name such as aten.convolution.default)",
                    "version": " (semantic version MAJOR.MINOR.PATCH, e.g. 1.0.0)",
                    "name": " (lower-case letters, digits, - and _)"}.get(str(field), "")
            self.error(path, f"{what} {err['input']!r} is not valid{hint}")
        elif kind == "literal_error":
            self.error(path, f"{err['msg'].lower()}, got {err['input']!r}")
        elif path and path[-1] == "version" and isinstance(err.get("input"), (int, float)):
            self.error(path, f"version {err['input']!r} was read as a number; write a semantic version "
                       "MAJOR.MINOR.PATCH such as 1.0.0")
        else:
            self.error(path, f"{err['msg'].lower()}; got {_show(err.get('input'))}")

    def data_path(self, loc) -> tuple:
        """pydantic's loc minus union tags, mapped onto the document's keys."""
        out, node = [], self.doc.data
        for part in loc:
            if isinstance(node, dict) and part in node:
                out.append(part)
                node = node[part]
            elif isinstance(node, list) and isinstance(part, int) and part < len(node):
                out.append(part)
                node = node[part]
            elif isinstance(node, dict) and part in ("if", "from") and part in node:
                out.append(part)
                node = node[part]
            elif isinstance(part, str) and isinstance(node, dict) and not part.startswith(("str", "list", "dict",
                                                                                              "GuardItem", "int",
                                                                                              "bool", "float",
                                                                                              "literal", "none")):
                out.append(part.rstrip("_") if part.endswith("_") else part)
                break
        return tuple(out)

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
        return Rule(pname, index, m.op, m.kernel, args, primary, m.requires, guards, bind,
                    tuple(m.defaults.items()), m.note, line)

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


    # -- decompositions --
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
        return Decomposition(pname, index, m.name, m.op, args, primary, m.requires, guards, tuple(parts),
                             tuple(defaults.items()), m.note, self.doc.where(base)[0])

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


def _fields_at(path) -> list[str]:
    from torchfl.rules import format as F

    table = {("pack",): F.PackInfo, ("requires",): F.Requires, ("rules",): F.RuleModel,
             ("fusions",): F.FusionModel, ("pattern",): F.FusionStep, ("no_rule",): F.NoRule,
             ("decompositions",): F.DecompositionModel, ("parts",): F.DecompositionPart}
    keys = [p for p in path[:-1] if isinstance(p, str)]
    model = F.PackModel
    if keys:
        model = table.get((keys[-1],), F.PackModel)
    return [f.alias or n for n, f in model.model_fields.items()]


def _show(v) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."
