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
