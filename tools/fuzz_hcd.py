"""Fuzz the HCD and rule-pack loaders with mutated and hostile files (issue #20).

Mutations of the bundled chips and of excerpts of the bundled rule pack: byte flips,
line edits, type swaps, huge and non-finite numbers, unicode, BOMs, tabs,
anchors/aliases, deep nesting, long lines, duplicate keys; and what YAML allows beyond
what the formats use (issue 39): explicit tags on values, keys and collections with text
they may not fit, plain scalars that resolve as numbers without digits (``0b_``),
anchors on collections, aliases in other places and before their anchor, merge keys,
directives and several documents, flow/quoted/block/explicit-key styles and escapes, and
CR, CRLF, NEL, LS and PS line breaks. Each case goes through
what a user's file meets (``check_hcd`` / ``check_pack`` on a file for byte-level cases,
on text otherwise, then the canonical form and hash of whatever is accepted) and is
classified:

- crash: any exception (the checkers never raise: bad input is a diagnostic);
- unlocated: an error diagnostic without a line and column >= 1, or without a message, or
  placed past the end of the file or of its line;
- slow: a case over 1 s of CPU time.

Then each hostile file (alias bomb, 100 MB, sparse 50 GB, FIFO, /dev/zero, binary,
non-UTF-8, 10,000-deep nesting, 1 MB one-line list, 4,301-digit number) must be refused
with a located error within 0.5 s. Peak RSS is the process's (VmHWM).

    python tools/fuzz_hcd.py --cases 100000 --json     # the measured figure (BENCHMARKS.md)
    python tools/fuzz_hcd.py --cases 3000 --seed 1     # what `make test` runs (tests/hcd/test_fuzz_tool.py)

Exit status 1 when any target is missed (a crash, an unlocated diagnostic, a slow case,
a hostile file not refused in time, peak RSS >= 100 MB).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import resource
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import yaml  # noqa: E402

from torchfl.hcd import check_hcd, check_hcd_text  # noqa: E402
from torchfl.resources import bundled_hcds, bundled_rule_packs  # noqa: E402
from torchfl.rules import check_pack, check_pack_text  # noqa: E402

SLOW_CPU_S = 1.0
HOSTILE_WALL_S = 0.5
RSS_LIMIT_MB = 100


# ----------------------------------------------------------------------------- seeds


def seeds() -> list[tuple[str, str]]:
    """(kind, text): the bundled chips, and excerpts of the bundled rule packs (a few rules
    and the fusions they allow; the whole pack costs ~50 ms a check, an excerpt ~5 ms)."""
    out = [("hcd", p.read_text(encoding="utf-8")) for p in bundled_hcds()]
    for path in bundled_rule_packs():
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        rules = data.get("rules", [])
        for start in range(0, len(rules), 6):
            chunk = rules[start:start + 6]
            ops = {r["op"] for r in chunk}
            fusions = [f for f in data.get("fusions", [])
                       if all((s["op"] if isinstance(s["op"], str) else s["op"][0]) in ops for s in f["pattern"])]
            part = {"pack": data["pack"], "rules": chunk, "fusions": fusions,
                    "no_rule": data.get("no_rule", [])[start // 6:start // 6 + 2]}
            out.append(("pack", yaml.safe_dump(part, sort_keys=False, width=100, allow_unicode=True)))
    return out


# ----------------------------------------------------------------------------- mutations

HUGE = ["1" * 4301, "9" * 25, "0x" + "f" * 4000, "-" + "7" * 5000, "1.0e+999", "-1.0e+99999", ".inf", "-.inf",
        ".nan", ".NaN", "1_000_000_000_000_000_000_000", "0o" + "7" * 60, "0b" + "1" * 200, "1:" + ":".join(["59"] * 30),
        "10000000000000000000000000000000", "1e400", "-0", "0.0000000000000000000001", "4294967296", "2147483648"]
SCALARS = ["true", "false", "null", "~", "''", '""', "[]", "{}", "[1, 2]", "{a: 1}", "x", "'quoted'", "1.5", "0",
           "-1", "torch.float16", "NCHW", "!!binary aGVsbG8=", "!!python/object:os.system ls", "!custom x",
           "2026-12-04", "yes", "on", "|\n    block", ">-\n    folded", "? complex", "&anchor 1", "*undefined"]
UNICODE = ["\u00e9", "\u200b", "\u202e", "\ufeff", "\U0001f600", "\uff11", "\u0000", "\u0085", "\u2028", "\ud800",
           "\x1b", "\x7f", "\t", "\r", "\r\n", "\u00a0", "\u3000", "\u0301"]


def _lines(text: str) -> list[str]:
    return text.split("\n")


def _value_lines(lines: list[str]) -> list[int]:
    return [i for i, line in enumerate(lines) if ":" in line and not line.lstrip().startswith("#")]


def _set_value(line: str, value: str) -> str:
    head = line.split(":", 1)[0]
    return f"{head}: {value}"


def m_line_edit(rng: random.Random, text: str, other: str) -> str:
    lines = _lines(text)
    i = rng.randrange(len(lines))
    op = rng.choice(["delete", "duplicate", "swap", "insert", "indent", "dedent", "truncate"])
    if op == "delete":
        del lines[i]
    elif op == "duplicate":
        lines.insert(i, lines[i])
    elif op == "swap":
        j = rng.randrange(len(lines))
        lines[i], lines[j] = lines[j], lines[i]
    elif op == "insert":
        lines.insert(i, rng.choice(_lines(other)))
    elif op == "indent":
        lines[i] = " " * rng.choice([1, 2, 3, 4, 8]) + lines[i]
    elif op == "dedent":
        lines[i] = lines[i].lstrip()
    else:
        lines[i] = lines[i][: rng.randrange(len(lines[i]) + 1)]
    return "\n".join(lines)


def m_type_swap(rng: random.Random, text: str, other: str) -> str:
    lines = _lines(text)
    candidates = _value_lines(lines)
    if candidates:
        i = rng.choice(candidates)
        lines[i] = _set_value(lines[i], rng.choice(SCALARS))
    return "\n".join(lines)


def m_number(rng: random.Random, text: str, other: str) -> str:
    lines = _lines(text)
    numeric = [i for i in _value_lines(lines) if any(ch.isdigit() for ch in lines[i].split(":", 1)[1])]
    i = rng.choice(numeric or _value_lines(lines) or [0])
    value = rng.choice(HUGE)
    if rng.random() < 0.3:
        value = f"[{value}, {rng.choice(HUGE)}]"
    lines[i] = _set_value(lines[i], value) if ":" in lines[i] else value
    return "\n".join(lines)


def m_unicode(rng: random.Random, text: str, other: str) -> str:
    pos = rng.randrange(len(text) + 1)
    return text[:pos] + "".join(rng.choice(UNICODE) for _ in range(rng.randint(1, 3))) + text[pos:]


def m_bom(rng: random.Random, text: str, other: str) -> str:
    if rng.random() < 0.5:
        return "\ufeff" * rng.randint(1, 2) + text
    pos = rng.randrange(len(text) + 1)
    return text[:pos] + "\ufeff" + text[pos:]


def m_tabs(rng: random.Random, text: str, other: str) -> str:
    lines = _lines(text)
    indented = [i for i, line in enumerate(lines) if line.startswith(" ")] or [0]
    for i in rng.sample(indented, min(len(indented), rng.randint(1, 3))):
        lines[i] = "\t" + lines[i].lstrip(" ") if rng.random() < 0.5 else lines[i].replace("  ", "\t", 1)
    return "\n".join(lines)


def m_alias(rng: random.Random, text: str, other: str) -> str:
    lines = _lines(text)
    candidates = _value_lines(lines)
    if not candidates:
        return text
    i = rng.choice(candidates)
    head, value = lines[i].split(":", 1)
    lines[i] = f"{head}: &a{value}" if value.strip() else f"{head}: &a"
    j = rng.choice(candidates)
    kind = rng.choice(["use", "self", "bomb", "merge", "undefined"])
    if kind == "use":
        lines[j] = _set_value(lines[j], "*a")
    elif kind == "self":
        lines[i] = f"{head}: &a [1, *a]"
    elif kind == "bomb":
        bomb = ["b0: &b0 [x, x, x, x, x, x, x, x, x, x]"] + [
            f"b{k}: &b{k} [" + ", ".join([f"*b{k - 1}"] * 10) + "]" for k in range(1, rng.randint(2, 9))]
        lines[j:j] = bomb
    elif kind == "merge":
        lines.insert(j, " " * (len(lines[j]) - len(lines[j].lstrip())) + "<<: *a")
    else:
        lines[j] = _set_value(lines[j], "*nowhere")
    return "\n".join(lines)


def m_nesting(rng: random.Random, text: str, other: str) -> str:
    lines = _lines(text)
    candidates = _value_lines(lines)
    if not candidates:
        return text
    i = rng.choice(candidates)
    depth = rng.choice([2, 10, 60, 65, 100, 1000, 10_000])
    inner = lines[i].split(":", 1)[1].strip() or "1"
    if rng.random() < 0.5:
        value = "[" * depth + inner + "]" * depth
    else:
        value = "{k: " * depth + inner + "}" * depth
    if rng.random() < 0.5:  # spread over lines, so that the line-length bound does not catch it first
        value = value.replace("[", "[\n").replace("{", "{\n")
    lines[i] = _set_value(lines[i], value)
    return "\n".join(lines)


def m_long_line(rng: random.Random, text: str, other: str) -> str:
    lines = _lines(text)
    i = rng.choice(_value_lines(lines) or [0])
    n = rng.choice([100, 2_000, 8_000, 8_200, 20_000, 100_000])
    value = rng.choice(["x" * n, "[" + ", ".join(["1"] * (n // 3)) + "]", "'" + "é" * n + "'", "1" * n])
    lines[i] = _set_value(lines[i], value)
    return "\n".join(lines)


def m_duplicate_key(rng: random.Random, text: str, other: str) -> str:
    lines = _lines(text)
    i = rng.choice(_value_lines(lines) or [0])
    lines.insert(i + 1, lines[i])
    return "\n".join(lines)


def _pyyaml_load(text: str):
    """PyYAML's reading of a mutated text, or None: its constructors raise ValueError,
    KeyError, IndexError... on tagged text (the faults this tool looks for in torchfl's loader)."""
    try:
        return yaml.safe_load(text)
    except Exception:  # noqa: BLE001 - the mutation then works on the text as it is
        return None


def m_structure(rng: random.Random, text: str, other: str) -> str:
    data = _pyyaml_load(text)
    if data is None:
        return text
    paths, stack = [], [(data, ())]
    while stack and len(paths) < 5000:  # bounded: aliases share nodes, and nesting may be deep
        node, path = stack.pop()
        paths.append(path)
        if len(path) < 12 and isinstance(node, dict):
            stack.extend((v, path + (k,)) for k, v in node.items())
        elif len(path) < 12 and isinstance(node, list):
            stack.extend((v, path + (k,)) for k, v in enumerate(node))
    path = rng.choice(paths[1:] or paths)
    if not path:
        return text
    parent = data
    for part in path[:-1]:
        parent = parent[part]
    if not isinstance(parent, (dict, list)):
        return text
    action = rng.choice(["delete", "scalar", "wrap", "list", "big_list", "rename"])
    key = path[-1]
    if action == "delete":
        del parent[key]
    elif action == "scalar":
        parent[key] = rng.choice([None, True, -1, 0, 2**70, 1e308, float("inf"), float("nan"), "", "x" * 50, [], {}])
    elif action == "wrap":
        parent[key] = {"x": parent[key]}
    elif action == "list":
        parent[key] = [parent[key]] * rng.randint(1, 4)
    elif action == "big_list":
        parent[key] = list(range(rng.choice([65, 1000, 20_000])))
    elif isinstance(parent, dict):
        parent[rng.choice(["kount", "Count", "__class__", "peak_gflops", "é", "1", "null"])] = parent.pop(key)
    try:
        return yaml.safe_dump(data, allow_unicode=True, width=rng.choice([80, 10_000]))
    except (yaml.YAMLError, ValueError, RecursionError):
        return text


# ---- what YAML allows beyond what the formats use (issue 39: an independent fuzzer found 9
# crash signatures in explicit tags alone; this one never wrote a tag)

TAGS = ["!!int", "!!float", "!!bool", "!!null", "!!str", "!!timestamp", "!!binary", "!!set", "!!omap", "!!pairs",
        "!!map", "!!seq", "!!merge", "!!value", "!!yaml", "!!python/tuple", "!!python/name:os.system",
        "!!python/object/apply:os.system", "!!python/object/new:int", "!<tag:yaml.org,2002:int>",
        "!<tag:yaml.org,2002:float>", "!<tag:yaml.org,2002:str>", "!<tag:example.com,2000:x>", "!local", "!",
        "!e!x", "!!int!"]
TAG_TEXT = ["'0.9.1'", ".", "+", "-1", "0b", "0b_", "0b2", "0x", "0x_", "0xg", "0o", "0o9", "0_7", "''", '""', "_",
            "1_", "1:_", "0:1", "1:60", "190:20:30", "1.5", "1e5", "1E+5", "x", "yes", "Off", "~", "null", ".inf",
            "-.INF", ".NaN", "2026-13-45", "2026-12-06", "2026-12-06T10:00:00Z", "[1]", "{a: 1}", "[]", "{}",
            "aGVsbG8=", "-0", "+12", "0.", ".5", "1__0", "0x_1F", "!!int 1", "&t 1", "*t", "|\n  1", "'1'\n"]
PLAIN = ["0b_", "0x_", "0o_", "0b", "1:_", "1_", "_1", "0_", "0x1_", "1:2:3", "-0b1", "+0x_", "1e", "1.e5", "._",
         ".inf_", "1__", "0b_1_", "10:70", "0:00"]


def m_tag(rng: random.Random, text: str, other: str) -> str:
    """An explicit tag on a value (or a key, or a collection), with text it may not fit."""
    lines = _lines(text)
    candidates = _value_lines(lines)
    if not candidates:
        return text
    i = rng.choice(candidates)
    head, value = lines[i].split(":", 1)
    value = value.split(" #", 1)[0].strip()
    tag = rng.choice(TAGS)
    where = rng.random()
    if where < 0.15:        # a tagged key
        indent = head[: len(head) - len(head.lstrip())]
        lines[i] = f"{indent}{tag} {head.strip()}: {value}"
    elif where < 0.25 or not value:   # a tagged block collection (or an empty value)
        lines[i] = f"{head}: {tag}" + (f" {value}" if value else "")
    else:
        body = value if rng.random() < 0.4 else rng.choice(TAG_TEXT)
        lines[i] = f"{head}: {tag} {body}"
    return "\n".join(lines)


def m_plain_number(rng: random.Random, text: str, other: str) -> str:
    """A plain scalar that YAML 1.1 resolves as a number but whose digits do not read."""
    lines = _lines(text)
    i = rng.choice(_value_lines(lines) or [0])
    lines[i] = _set_value(lines[i], rng.choice(PLAIN))
    return "\n".join(lines)


def m_anchor(rng: random.Random, text: str, other: str) -> str:
    """Anchors on values and block collections, aliases of them elsewhere (a collection into
    a scalar's place, a scalar into a collection's), merge keys, anchors defined twice."""
    lines = _lines(text)
    candidates = _value_lines(lines)
    if len(candidates) < 2:
        return text
    i, j = sorted(rng.sample(candidates, 2))
    head, value = lines[i].split(":", 1)
    name = rng.choice(["a", "u", "x1", "anchor-name"])
    lines[i] = f"{head}: &{name}{value}"
    kind = rng.choice(["use", "use", "merge", "merge_list", "twice", "key", "before"])
    indent = lines[j][: len(lines[j]) - len(lines[j].lstrip())]
    if kind == "use":
        lines[j] = _set_value(lines[j], f"*{name}")
    elif kind == "merge":
        lines.insert(j + 1, f"{indent}<<: *{name}")
    elif kind == "merge_list":
        lines[j] = _set_value(lines[j], f"&m{name} {lines[j].split(':', 1)[1].strip() or '{}'}")
        lines.insert(j + 1, f"{indent}<<: [*{name}, *m{name}]")
    elif kind == "twice":
        lines[j] = _set_value(lines[j], f"&{name} {lines[j].split(':', 1)[1].strip() or '1'}")
    elif kind == "key":
        lines.insert(j + 1, f"{indent}*{name} : 1")
    else:                    # used before it is defined
        lines[i], lines[j] = lines[j], lines[i]
        lines[i] = _set_value(lines[i], f"*{name}")
    return "\n".join(lines)


def m_document(rng: random.Random, text: str, other: str) -> str:
    """Directives, document markers, more than one document."""
    kind = rng.choice(["yaml11", "yaml12", "yaml99", "tag", "start", "end", "second", "empty_second", "start_value"])
    if kind == "yaml11":
        return "%YAML 1.1\n---\n" + text
    if kind == "yaml12":
        return "%YAML 1.2\n---\n" + text
    if kind == "yaml99":
        return "%YAML 9.9\n---\n" + text
    if kind == "tag":
        return "%TAG !e! tag:example.com,2000:\n---\n" + text.replace(": ", ": !e!x ", 1)
    if kind == "start":
        return "---\n" + text
    if kind == "end":
        return text + "\n...\n"
    if kind == "second":
        return text + "\n---\n" + other
    if kind == "empty_second":
        return text + "\n---\n"
    return "--- " + text


def m_style(rng: random.Random, text: str, other: str) -> str:
    """The same data in other styles: flow, quoted keys and values, block scalars, explicit keys."""
    lines = _lines(text)
    candidates = _value_lines(lines)
    kind = rng.choice(["flow", "quoted_key", "double_quoted", "single_quoted", "block", "explicit_key", "escapes"])
    if kind == "flow":
        data = _pyyaml_load(text)
        try:
            return text if data is None else yaml.safe_dump(data, default_flow_style=True,
                                                             width=rng.choice([60, 10_000]))
        except (yaml.YAMLError, ValueError, RecursionError):
            return text
    if not candidates:
        return text
    i = rng.choice(candidates)
    head, value = lines[i].split(":", 1)
    value = value.split(" #", 1)[0].strip()
    indent = head[: len(head) - len(head.lstrip())]
    if kind == "quoted_key":
        lines[i] = f'{indent}"{head.strip()}": {value}'
    elif kind == "double_quoted":
        lines[i] = f'{head}: "{value}"'
    elif kind == "single_quoted":
        lines[i] = f"{head}: '{value}'"
    elif kind == "block":
        style = rng.choice(["|", ">", "|-", ">-", "|+", "|2", ">1-"])
        lines[i] = f"{head}: {style}\n{indent}  {value or 'x'}"
    elif kind == "explicit_key":
        lines[i] = f"{indent}? {head.strip()}\n{indent}: {value}"
    else:
        esc = rng.choice(["\\x00", "\\x85", "\\u2028", "\\t", "\\e", "\\N", "\\_", "\\L", "\\P", "\\\n"])
        lines[i] = f'{head}: "{value}{esc}"'
    return "\n".join(lines)


def m_line_endings(rng: random.Random, text: str, other: str) -> str:
    """CR-only, CRLF, NEL, LS/PS line breaks, everywhere or in places; sometimes past 8 KB."""
    brk = rng.choice(["\r", "\r\n", "\x85", "\u2028", "\u2029"])
    if rng.random() < 0.3:
        text = text + "\n" + "# padding to pass the line-length bound if lines were not split\n" * 150
    if rng.random() < 0.7:
        return text.replace("\n", brk)
    lines = _lines(text)
    return "".join(line + (brk if rng.random() < 0.5 else "\n") for line in lines)


TEXT_MUTATIONS = [m_line_edit, m_type_swap, m_number, m_unicode, m_bom, m_tabs, m_alias, m_nesting, m_long_line,
                  m_duplicate_key, m_structure, m_tag, m_plain_number, m_anchor, m_document, m_style, m_line_endings]


def byte_mutations(rng: random.Random, raw: bytearray) -> bytes:
    for _ in range(rng.randint(1, 8)):
        pos = rng.randrange(len(raw) or 1)
        op = rng.choice(["flip", "bitflip", "insert", "delete", "latin1", "nul"])
        if op == "flip" and raw:
            raw[pos] = rng.randrange(256)
        elif op == "bitflip" and raw:
            raw[pos] ^= 1 << rng.randrange(8)
        elif op == "insert":
            raw[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        elif op == "delete" and len(raw) > 1:
            del raw[pos]
        elif op == "latin1":
            raw[pos:pos] = "é".encode("latin-1")
        elif op == "nul":
            raw[pos:pos] = b"\x00"
    return bytes(raw)


# ----------------------------------------------------------------------------- one case


def _check_text(kind: str, text: str):
    return check_hcd_text(text, "fuzz.hcd") if kind == "hcd" else check_pack_text(text, "fuzz.yaml")


def _check_file(kind: str, path: str):
    return check_hcd(path) if kind == "hcd" else check_pack(path)


def _accepted(kind: str, report) -> None:
    """What a user does next with an accepted file: show it, hash it, import it."""
    if kind == "hcd" and report.hcd is not None:
        report.hcd.canonical_json()
        report.hcd.content_hash()
    if kind == "pack" and report.pack is not None:
        report.pack.canonical_json()
        report.pack.content_hash()


_BREAKS = re.compile("\r\n|[\r\n\x85\u2028\u2029]")


def _unlocated(report, text: str | None = None) -> list[str]:
    """Diagnostics with no position, or (given the text) one past the end of the file or of
    its line (a byte offset taken for a column, a line counted with other line breaks)."""
    bad = []
    lines = _BREAKS.split(text) if text is not None else None
    for d in report.diagnostics:
        if not (isinstance(d.line, int) and isinstance(d.column, int) and d.line >= 1 and d.column >= 1 and d.message):
            bad.append(str(d)[:300])
        elif lines is not None and d.file in ("fuzz.hcd", "fuzz.yaml") and (
                d.line > len(lines) or d.column > len(lines[d.line - 1]) + 1):
            bad.append(f"past the end of its line ({len(lines)} lines): {str(d)[:260]}")
    return bad


def run_case(kind: str, text: str | None, raw: bytes | None, scratch: str):
    """(report or None, exception text or None)."""
    try:
        if raw is not None:
            with open(scratch, "wb") as fh:
                fh.write(raw)
            report = _check_file(kind, scratch)
        else:
            report = _check_text(kind, text)
        _accepted(kind, report)
        return report, None
    except Exception as exc:  # noqa: BLE001 - classifying every escape is this tool's purpose
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        return None, f"{type(exc).__name__}: {str(exc)[:200]} at {Path(frame.filename).name}:{frame.lineno}"


def fuzz(cases: int, seed: int, progress=None) -> dict:
    rng = random.Random(seed)
    corpus = seeds()
    crashes: dict[str, dict] = {}
    unlocated: list[dict] = []
    slow: list[dict] = []
    accepted = refused = 0
    worst = 0.0
    with tempfile.TemporaryDirectory(prefix="torchfl-fuzz-") as tmp:
        for n in range(cases):
            kind, base = rng.choice(corpus)
            other = rng.choice(corpus)[1]
            text, raw = base, None
            if rng.random() < 0.15:
                raw = byte_mutations(rng, bytearray(base.encode("utf-8")))
                how = "bytes"
            else:
                chosen = [rng.choice(TEXT_MUTATIONS) for _ in range(rng.randint(1, 3))]
                for mutate in chosen:
                    text = mutate(rng, text, other)
                how = "+".join(m.__name__[2:] for m in chosen)
            scratch = os.path.join(tmp, "case.hcd" if kind == "hcd" else "case.yaml")
            start = time.process_time()
            report, crash = run_case(kind, text, raw, scratch)
            spent = time.process_time() - start
            worst = max(worst, spent)
            where = {"case": n, "kind": kind, "mutations": how}
            if crash is not None:
                entry = crashes.setdefault(crash, {**where, "count": 0, "error": crash})
                entry["count"] += 1
                continue
            if spent > SLOW_CPU_S:
                slow.append({**where, "cpu_s": round(spent, 3)})
            bad = _unlocated(report, text if raw is None else None)
            if bad:
                unlocated.append({**where, "diagnostics": bad[:3]})
            if report.ok:
                accepted += 1
            else:
                refused += 1
            if progress and (n + 1) % 1000 == 0:
                progress(n + 1, cases)
    return {"cases": cases, "seed": seed, "accepted": accepted, "refused": refused,
            "crashes": sum(c["count"] for c in crashes.values()), "crash_kinds": list(crashes.values())[:20],
            "unlocated": len(unlocated), "unlocated_examples": unlocated[:10],
            "over_1s_cpu": len(slow), "slow_examples": slow[:10], "max_case_cpu_s": round(worst, 4)}


# ----------------------------------------------------------------------------- hostile files


def hostile(tmp: str) -> list[dict]:
    """Each hostile file, checked as a user's file: refused, located, within 0.5 s of wall time."""
    base = (bundled_hcds()[0]).read_text(encoding="utf-8")
    files: dict[str, str] = {}

    def write(name: str, data: bytes | str) -> str:
        path = os.path.join(tmp, name)
        with open(path, "wb") as fh:
            fh.write(data.encode("utf-8") if isinstance(data, str) else data)
        return path

    files["alias bomb"] = write("bomb.hcd", "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [{', '.join(['*' + p] * 10)}]\n" for p, c in zip("abcdefgh", "bcdefghi")))
    path = os.path.join(tmp, "100mb.hcd")
    with open(path, "wb") as fh:  # written in 1 MB pieces: this tool's own memory is not the loader's
        for _ in range(100):
            fh.write(b"#" * 10**6)
    files["100 MB file"] = path
    path = os.path.join(tmp, "sparse.hcd")
    with open(path, "wb") as fh:
        fh.truncate(50 * 1024**3)
    files["sparse 50 GB file"] = path
    fifo = os.path.join(tmp, "fifo.hcd")
    os.mkfifo(fifo)
    files["FIFO"] = fifo
    files["/dev/zero"] = "/dev/zero"
    files["binary"] = write("binary.hcd", bytes(range(256)) * 64)
    files["non-UTF-8"] = write("latin1.hcd", base.encode("utf-8") + "# Certifié\n".encode("latin-1"))
    files["10,000-deep nesting"] = write("deep.hcd", "a: " + "[" * 10_000 + "]" * 10_000 + "\n")
    files["10,000-deep nesting, one bracket a line"] = write("deep_lines.hcd", "a: " + "[\n" * 10_000 + "]\n" * 10_000)
    files["1 MB one-line list"] = write("flow.hcd", "x: [" + ",".join(["1"] * 500_000) + "]\n")
    files["4,301-digit integer"] = write("digits.hcd", "x: " + "1" * 4301 + "\n")
    files["directory"] = tmp
    out = []
    for name, path in files.items():
        start = time.perf_counter()
        report = check_hcd(path)
        wall = time.perf_counter() - start
        errors = [d for d in report.diagnostics if d.severity == "error"]
        located = bool(errors) and all(d.line >= 1 and d.column >= 1 for d in errors)
        out.append({"file": name, "refused": not report.ok, "located": located, "wall_s": round(wall, 4),
                    "ok": (not report.ok) and located and wall < HOSTILE_WALL_S,
                    "message": str(errors[0]).replace(tmp + "/", "")[:200] if errors else ""})
    return out


def peak_rss_mb() -> float:
    """This process's peak RSS: VmHWM, which starts afresh at exec (``ru_maxrss`` keeps the
    parent's peak across fork and exec: 561 MB when started from a test run that loaded torch)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=20)
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    report = fuzz(args.cases, args.seed, None if args.json else
                  lambda done, total: print(f"  {done:,}/{total:,} cases", file=sys.stderr))
    report["wall_s"] = round(time.perf_counter() - t0, 1)
    report["peak_rss_mb_after_cases"] = peak_rss_mb()
    with tempfile.TemporaryDirectory(prefix="torchfl-hostile-") as tmp:
        report["hostile"] = hostile(tmp)
    report["peak_rss_mb"] = peak_rss_mb()
    report["load_average"] = [round(x, 2) for x in os.getloadavg()]
    ok = (report["crashes"] == 0 and report["unlocated"] == 0 and report["over_1s_cpu"] == 0
          and all(h["ok"] for h in report["hostile"]) and report["peak_rss_mb"] < RSS_LIMIT_MB)
    report["targets_met"] = ok
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"{report['cases']:,} cases (seed {report['seed']}): {report['accepted']:,} accepted, "
              f"{report['refused']:,} refused; crashes {report['crashes']}, unlocated {report['unlocated']}, "
              f"over 1 s CPU {report['over_1s_cpu']} (slowest {report['max_case_cpu_s']} s); "
              f"peak RSS {report['peak_rss_mb']} MB; {report['wall_s']} s")
        for c in report["crash_kinds"]:
            print(f"  crash x{c['count']}: {c['error']} ({c['kind']}, {c['mutations']})")
        for u in report["unlocated_examples"]:
            print(f"  unlocated: {u}")
        for h in report["hostile"]:
            print(f"  {'ok ' if h['ok'] else 'BAD'} {h['file']}: {h['wall_s']} s  {h['message']}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
