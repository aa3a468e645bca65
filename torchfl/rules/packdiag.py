"""Where and how a rule pack's problems are said: located diagnostics, also inside a guard's
text (a block or folded scalar), "nearest" name suggestions on a budget, and pydantic's
structure errors turned into sentences at the document's own keys."""

from __future__ import annotations

import difflib

from pydantic import ValidationError

from torchfl.hcd import Diagnostic, format_path
from torchfl.hcd.source import LocatedDocument
from torchfl.rules.guards import GuardSyntaxError


def _near(word: str, choices, n: int = 3) -> str:
    close = difflib.get_close_matches(word, sorted(choices), n=n, cutoff=0.5)
    return f"; nearest: {', '.join(close)}" if close else ""



class PackDiagnostics:
    """The diagnostics a pack check collects (``self.diags``), each located in the file."""

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
