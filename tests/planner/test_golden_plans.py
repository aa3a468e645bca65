"""The planner's choices and prices on a few zoo models equal the golden file's.

A speed-up of the planner must not change any choice (kernel, layout, dtype, tiling, fusion
group, predicted time). A change that alters plans *on purpose* (cost model, fusion pattern,
kernel choice) regenerates the file in its own commit:

    PYTHONPATH=$PWD .venv/bin/python -m tests.planner.golden --update

(tests/planner/golden.py says what the dump keeps.)
"""

import json

import pytest

from tests.planner.golden import CASES, GOLDEN, dump, plan_case

_GOLDEN = json.loads(GOLDEN.read_text())


@pytest.mark.parametrize("name", sorted(CASES))
def test_plan_equals_golden(name):
    assert name in _GOLDEN, f"{name} missing from {GOLDEN.name}: regenerate it (module docstring)"
    got, want = dump(plan_case(name)), _GOLDEN[name]
    for key in sorted(want):
        if got[key] != want[key]:
            a, b = got[key], want[key]
            pairs = ([(k, a.get(k), b.get(k)) for k in sorted(set(a) | set(b))] if isinstance(a, dict)
                     else [(i, x, y) for i, (x, y) in enumerate(zip(a, b))])
            diff = [f"  {i}: {x} != golden {y}" for i, x, y in pairs if x != y][:5]
            pytest.fail(f"{name}: {key} differ from {GOLDEN.name} (lengths {len(a)} vs {len(b)}); first "
                        "differences:\n" + "\n".join(diff) +
                        "\nif the change is intended, regenerate the file (see the module docstring)")
