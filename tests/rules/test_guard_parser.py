"""The hand-written guard parser against the specification (grammar.lark, parsed by lark).

Both must accept exactly the same texts and build the same trees (positions included);
hypothesis generates both well-formed expressions from the grammar and random token soup.
"""

from __future__ import annotations

from hypothesis import given, settings, strategies as st

from tests.rules.guard_reference import parse_reference
from torchfl.rules.guards.syntax import GuardSyntaxError, parse

NAMES = st.sampled_from(["x", "groups", "shape", "s", "true", "none", "inx", "fort", "a_b"])
ATOMS = st.one_of(
    NAMES,
    st.integers(0, 10 ** 6).map(str),
    st.sampled_from(["1.5", ".5", "2e3", "1.", "'s'", '"t"']),
)


def _compound(inner):
    return st.one_of(
        st.tuples(inner, st.sampled_from([" + ", " - ", " * ", " / ", " // ", " % ", " == ", " != ", " < ",
                                          " <= ", " > ", " >= ", " in ", " not in ", " and ", " or "]), inner)
        .map("".join),
        inner.map(lambda e: f"not {e}"),
        inner.map(lambda e: f"-{e}"),
        inner.map(lambda e: f"({e})"),
        st.tuples(NAMES, NAMES).map(lambda t: f"{t[0]}.{t[1]}"),
        st.tuples(inner, inner).map(lambda t: f"{t[0]}[{t[1]}]"),
        st.tuples(inner, st.sampled_from(["", "1"]), st.sampled_from(["", "-1"])).map(
            lambda t: f"{t[0]}[{t[1]}:{t[2]}]"),
        st.lists(inner, max_size=3).map(lambda xs: "[" + ", ".join(xs) + "]"),
        st.tuples(st.sampled_from(["len", "min", "max", "abs", "all", "any", "range", "f"]),
                  st.lists(inner, max_size=3)).map(lambda t: f"{t[0]}({', '.join(t[1])})"),
        st.tuples(st.sampled_from(["all", "any"]), inner, NAMES, inner).map(
            lambda t: f"{t[0]}({t[1]} for {t[2]} in {t[3]})"),
        st.tuples(inner, NAMES, inner).map(lambda t: f"[{t[0]} for {t[1]} in {t[2]}]"),
        st.tuples(inner, inner, inner).map(lambda t: f"{t[0]} if {t[1]} else {t[2]}"),
    )


EXPRS = st.recursive(ATOMS, _compound, max_leaves=12)
SOUP = st.lists(st.sampled_from(["x", "1", "2.5", "'a'", "(", ")", "[", "]", ",", ":", ".", "+", "-", "*", "**",
                                 "/", "//", "%", "==", "=", "!=", "<", ">=", "and", "or", "not", "in", "if",
                                 "else", "for", "len", "all", "_x", "&", "!", " "]), max_size=14).map(" ".join)


def outcome(fn, text):
    try:
        return ("ok", fn(text))
    except GuardSyntaxError:
        return ("refused", None)


def check_same(text):
    mine, spec = outcome(parse.__wrapped__, text), outcome(parse_reference, text)
    assert mine[0] == spec[0], (text, mine, spec)
    assert mine[1] == spec[1], text


@settings(max_examples=500, deadline=None)
@given(EXPRS)
def test_well_formed_expressions_parse_identically(text):
    check_same(text)


@settings(max_examples=500, deadline=None)
@given(SOUP)
def test_token_soup_is_accepted_or_refused_identically(text):
    check_same(text)


def test_known_cases():
    for text in ("a.b.c[1:][0] == -2", "not not x", "1 if x else 2 if y else 3", "x[:]", "f()", "[]",
                 "- -1", "a < b <= c", "x not in [1, 2]", "all(s > 0 for s in x.shape[2:])",
                 "(a or b) and c", "a or b and c", "-x.y", "[[1], [2]]", "len([e for e in x]) > 0",
                 "--(1.) // (groups)", "-(2) * -(3) + (-(4))"):  # folded parenthesised constants
        check_same(text)
        assert outcome(parse.__wrapped__, text)[0] == "ok", text
    for text in ("x[]", "()", "(1, 2)", "f(1,)", "x[1:2:3]", "a if b", "not", "x.5", "1.x", "a.(b)",
                 "x.f(1)", "in", "x = 1"):
        check_same(text)
        assert outcome(parse.__wrapped__, text)[0] == "refused", text
