"""Property test: mutated HCDs only ever yield diagnostics or the project's own error type.

CI runs ``TORCHFL_FUZZ_EXAMPLES`` examples per property (default 1,000 x 3 properties =
3,000 examples); set it higher locally for a longer soak.
"""

from __future__ import annotations

import copy
import os

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torchfl.hcd import TorchflInputError, check_hcd_text, load_hcd_text
from torchfl.resources import bundled_hcds

EXAMPLES = int(os.environ.get("TORCHFL_FUZZ_EXAMPLES", "1000"))
SEEDS = [p.read_text() for p in bundled_hcds()]
SEED_DATA = [yaml.safe_load(t) for t in SEEDS]
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)


def _paths(data, prefix=()):
    yield prefix
    if isinstance(data, dict):
        for k, v in data.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            yield from _paths(v, prefix + (i,))


def _check_never_crashes(text: str) -> None:
    report = check_hcd_text(text, "fuzz.hcd")  # must not raise
    assert report.ok == (report.hcd is not None)
    for d in report.diagnostics:
        assert d.line >= 1 and d.column >= 1 and d.message
    try:
        load_hcd_text(text, "fuzz.hcd")
    except TorchflInputError:
        pass


scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True),
                    st.text(max_size=20), st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=5), st.integers(), max_size=2))


@FUZZ
@given(seed=st.sampled_from(range(len(SEED_DATA))), data=st.data())
def test_structural_mutations(seed, data):
    doc = copy.deepcopy(SEED_DATA[seed])
    paths = [p for p in _paths(doc) if p]
    for _ in range(data.draw(st.integers(1, 4))):
        path = data.draw(st.sampled_from(paths))
        parent = doc
        for part in path[:-1]:
            if not isinstance(parent, (dict, list)):
                break
            try:
                parent = parent[part]
            except (KeyError, IndexError, TypeError):
                break
        else:
            action = data.draw(st.sampled_from(["delete", "replace", "nest", "rename"]))
            key = path[-1]
            try:
                if action == "delete":
                    del parent[key]
                elif action == "replace":
                    parent[key] = data.draw(scalars)
                elif action == "nest":
                    parent[key] = [[{"x": parent[key]}]] * data.draw(st.integers(1, 3))
                elif action == "rename" and isinstance(parent, dict):
                    parent[data.draw(st.text(min_size=1, max_size=12))] = parent.pop(key)
            except (KeyError, IndexError, TypeError):
                pass
    _check_never_crashes(yaml.safe_dump(doc, allow_unicode=True))


@FUZZ
@given(seed=st.sampled_from(range(len(SEEDS))), data=st.data())
def test_byte_mutations(seed, data):
    raw = bytearray(SEEDS[seed].encode())
    for _ in range(data.draw(st.integers(1, 8))):
        pos = data.draw(st.integers(0, len(raw) - 1))
        op = data.draw(st.sampled_from(["flip", "insert", "delete"]))
        if op == "flip":
            raw[pos] = data.draw(st.integers(0, 255))
        elif op == "insert":
            raw[pos:pos] = data.draw(st.binary(min_size=1, max_size=8))
        elif len(raw) > 1:
            del raw[pos]
    _check_never_crashes(raw.decode("utf-8", errors="replace"))


@FUZZ
@given(text=st.text(alphabet=st.sampled_from(list(":-[]{}&*!|>'\"#%@` \n\tabc012.,?")), max_size=200))
def test_yaml_syntax_soup(text):
    _check_never_crashes(text)


# Issue 39: the fuzzer never wrote a tag, and an independent one found 9 crash signatures in
# explicit tags alone. These properties write what YAML allows beyond what the format uses.
TAGS = st.sampled_from(["!!int", "!!float", "!!bool", "!!null", "!!str", "!!timestamp", "!!binary", "!!set",
                        "!!omap", "!!map", "!!seq", "!!merge", "!!python/tuple", "!!python/name:os.system",
                        "!<tag:yaml.org,2002:int>", "!local", "!", ""])
TEXTS = st.one_of(st.sampled_from(["'0.9.1'", ".", "+", "0b", "0b_", "0x_", "0o", "''", "_", "1_", "1:_", "0:1",
                                   "1.5", "x", "yes", "~", ".inf", "2026-13-45", "[1]", "{a: 1}", "-0", "0x1F"]),
                  st.text(alphabet=st.sampled_from(list("0123456789_.:+-xobeE")), min_size=1, max_size=8))
VALUE_LINES = [[i for i, line in enumerate(t.splitlines()) if ":" in line and not line.lstrip().startswith("#")]
               for t in SEEDS]


def _with_value(seed: int, index: int, value: str) -> str:
    lines = SEEDS[seed].splitlines()
    i = VALUE_LINES[seed][index % len(VALUE_LINES[seed])]
    head = lines[i].split(":", 1)[0]
    lines[i] = f"{head}: {value}"
    return "\n".join(lines) + "\n"


@FUZZ
@given(seed=st.sampled_from(range(len(SEEDS))), index=st.integers(0, 200), tag=TAGS, text=TEXTS)
def test_explicit_tags_on_any_value(seed, index, tag, text):
    _check_never_crashes(_with_value(seed, index, f"{tag} {text}".strip()))


@FUZZ
@given(seed=st.sampled_from(range(len(SEEDS))), data=st.data())
def test_anchors_aliases_and_merge_keys_anywhere(seed, data):
    lines = SEEDS[seed].splitlines()
    for _ in range(data.draw(st.integers(1, 3))):
        spots = [i for i, line in enumerate(lines) if ":" in line and not line.lstrip().startswith("#")]
        i = data.draw(st.sampled_from(spots))
        head, value = lines[i].split(":", 1)
        indent = head[: len(head) - len(head.lstrip())]
        kind = data.draw(st.sampled_from(["anchor", "alias", "merge", "merge_list", "key_alias", "tagged_key"]))
        name = data.draw(st.sampled_from(["a", "b"]))
        if kind == "anchor":
            lines[i] = f"{head}: &{name}{value}"
        elif kind == "alias":
            lines[i] = f"{head}: *{name}"
        elif kind == "merge":
            lines.insert(i + 1, f"{indent}<<: *{name}")
        elif kind == "merge_list":
            lines.insert(i + 1, f"{indent}<<: [*a, *b]")
        elif kind == "key_alias":
            lines.insert(i + 1, f"{indent}*{name} : 1")
        else:
            lines[i] = f"{indent}{data.draw(TAGS)} {head.strip()}:{value}"
    _check_never_crashes("\n".join(lines) + "\n")


@FUZZ
@given(seed=st.sampled_from(range(len(SEEDS))), brk=st.sampled_from(["\r", "\r\n", "\x85", "\u2028", "\u2029"]),
       pad=st.integers(0, 300), index=st.integers(0, 200), text=TEXTS)
def test_other_line_breaks_and_long_files(seed, brk, pad, index, text):
    source = _with_value(seed, index, text) + "# padding line\n" * pad
    _check_never_crashes(source.replace("\n", brk))
