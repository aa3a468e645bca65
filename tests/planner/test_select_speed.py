"""The selection's speed-ups keep its results: the beam cut equals a full sort's first
``beam`` entries (order included: later tie-breaking depends on it), and the bulk option
check raises the same error for the same option as the per-option one."""

import random

import pytest

from torchfl.planner.select import CoverProblem, Option, SelectionError, _beam_cut, select


def _real(state):
    return state


@pytest.mark.parametrize("seed", range(6))
def test_beam_cut_equals_sorted_prefix(seed):
    rng = random.Random(seed)
    table = {}
    for i in range(rng.randint(5, 60)):
        state = (tuple(rng.choice("ABC") for _ in range(3)), rng.randint(0, 3))
        table[state] = (float(rng.choice([1, 2, 2, 3, 5])), None, None, i)  # many equal costs
    for beam in (1, 2, 4, 7):
        if len(table) <= beam:
            continue
        want = dict(sorted(table.items(), key=lambda kv: (kv[1][0], _real(kv[0])))[:beam])
        got = _beam_cut(table, beam, _real)
        assert list(got.items()) == list(want.items())


def _problem(options):
    return CoverProblem({"a": ("x",), "b": ("a",)}, {"x": "NCHW"}, (("b", "NCHW"),), tuple(options),
                        lambda v, h, n: 1.0)


def test_bad_options_raise_for_the_first_bad_one():
    good = [Option("a1", ("a",), ("x",), ("NCHW",), "NCHW", 1.0), Option("b1", ("b",), ("a",), ("NCHW",), "NCHW", 1.0)]
    assert select(_problem(good)).cost == 2.0
    unknown = Option("z", ("zz",), ("x",), ("NCHW",), "NCHW", 1.0)
    uneven = Option("u", ("a",), ("x",), (), "NCHW", 1.0)
    not_names = Option("n", ("a",), (3,), ("NCHW",), "NCHW", 1.0)
    with pytest.raises(SelectionError, match="option z covers unknown node"):
        select(_problem(good + [unknown, uneven]))
    with pytest.raises(SelectionError, match="option u: inputs"):
        select(_problem(good + [uneven, unknown]))
    with pytest.raises(SelectionError, match="option n: inputs"):
        select(_problem([not_names] + good))
