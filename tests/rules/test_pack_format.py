"""Rule-pack files: structure, located errors, hostile packs, canonical form and hash."""

from __future__ import annotations

import textwrap

import pytest

from torchfl.rules import PackError, check_pack, check_pack_text, load_pack_text

GOOD = """\
pack:
  name: demo
  version: 1.2.3
rules:
  - op: aten.relu.default
    kernel: relu
    args: {self: tensor}
    requires: {layouts: chip}
    bind: {a: self}
  - op: aten.convolution.default
    kernel: conv2d
    args: {input: tensor, weight: tensor, bias: "tensor?", stride: "int[]", padding: "int[]", dilation: "int[]",
           transposed: bool, output_padding: "int[]", groups: int}
    guards:
      - not transposed
      - {if: "groups == 1", reason: "grouped convolution is another rule's"}
    bind: {x: input}
fusions:
  - name: conv_relu
    kernel: conv2d_relu
    pattern:
      - {id: conv, op: aten.convolution.default}
      - {id: act, op: aten.relu.default}
    guards: ["conv.groups == 1"]
    bind: {x: conv.input, weight: conv.weight, bias: conv.bias}
no_rule:
  - {op: aten.erf.default, reason: no erf kernel}
"""


def diags(text):
    report = check_pack_text(textwrap.dedent(text), "p.yaml")
    assert not report.ok and report.pack is None
    return [str(d) for d in report.diagnostics]


def with_rule(rule: str, head: str = "pack: {name: t, version: 1.0.0}\nrules:\n") -> str:
    return head + textwrap.indent(textwrap.dedent(rule), "  ")


def test_good_pack_loads_with_everything():
    report = check_pack_text(GOOD, "good.yaml")
    assert report.ok, report.diagnostics
    pack = report.pack
    assert (pack.name, pack.version) == ("demo", "1.2.3")
    assert [r.op for r in pack.rules] == ["aten.relu.default", "aten.convolution.default"]
    assert pack.fusions[0].pattern == (("aten.convolution.default",), ("aten.relu.default",))
    assert pack.no_rule_reason("aten.erf.default") == "no erf kernel"
    assert pack.rules[1].guards[1].reason == "grouped convolution is another rule's"
    assert report.source == GOOD


def test_canonical_form_and_hash_ignore_formatting_but_not_content():
    a = load_pack_text(GOOD)
    reformatted = GOOD.replace("{self: tensor}", "\n      self: tensor").replace("# ", "")
    b = load_pack_text("# a comment\n" + reformatted)
    assert a.canonical_json() == b.canonical_json() and a.content_hash() == b.content_hash()
    assert len(a.content_hash()) == 64 and a.canonical()["pack"]["version"] == "1.2.3"
    assert '"if":"groups == 1"' in a.canonical_json()  # aliases as written in files
    c = load_pack_text(GOOD.replace("groups == 1\"", "groups == 2\""))
    assert c.content_hash() != a.content_hash()


@pytest.mark.parametrize("rule, expected", [
    ("- {op: aten.relu.default, kernel: reluu, args: {self: tensor}, bind: {a: self}}",
     "p.yaml:3:37: error: rules[0].kernel: kernel 'reluu' is not in the kernel catalog; nearest: relu"),
    ("- {op: relu, kernel: relu}", "p.yaml:3:10: error: rules[0].op: op 'relu' is not valid (an ATen overload name"),
    ("- {op: aten.relu.default, kernel: relu, args: {self: tensor}, guards: ['sef.rank == 4'], bind: {a: self}}",
     "p.yaml:3:75: error: rules[0].guards[0]: guard 'sef.rank == 4': unknown name 'sef'; did you mean self?"),
    ("- {op: aten.relu.default, kernel: relu, args: {self: tensr}}",
     "rules[0].args.self: unknown argument type 'tensr'"),
    ("- {op: aten.relu.default, kernel: relu, args: {self: tensor}, requires: {dtypes: [float17]}}",
     "rules[0].requires.dtypes[0]: input should be 'float32'"),
    ("- {op: aten.relu.default, kernel: relu, args: {self: tensor}, requires: {layout: unit}}",
     "rules[0].requires.layout: unknown field 'layout'; nearest: layouts"),
    ("- {op: aten.relu.default, kernel: relu, args: {self: tensor}, primary: other}",
     "primary 'other' must name a tensor argument"),
    ("- {op: aten.relu.default, kernel: relu, args: {self: tensor}, defaults: {alpha: 1}}",
     "default for 'alpha', which is not in args"),
    ("- {op: aten.relu.default, kernel: relu, args: {self: tensor}, bind: {a: 'self +'}}",
     "bind expression 'self +': guard ends too early"),
    ("- {op: aten.relu.default, kernel: relu, args: {__class__: tensor}}",
     "must be an identifier not starting with _"),
])
def test_rule_errors_are_located(rule, expected):
    out = diags(with_rule(rule))
    assert any(expected in d for d in out), out


def test_guard_position_points_inside_the_yaml_value():
    text = with_rule("""\
        - op: aten.relu.default
          kernel: relu
          args: {self: tensor}
          guards:
            - self.rank = 4
            - "self.rnk == 4"
            - 'self.rank == "a" + 1'
            - |
              self.rank == 4 and
                sel.rank > 0
        """)
    out = diags(text)
    lines = text.splitlines()
    expect = {"guards[0]": ("self.rank = 4", "="), "guards[1]": ('"self.rnk == 4"', "."),
              "guards[2]": ("'self.rank == \"a\" + 1'", "\"")}
    for key, (value, char) in expect.items():
        d = next(x for x in out if key in x)
        line, col = map(int, d.split(":")[1:3])
        assert lines[line - 1].find(value) >= 0
        assert lines[line - 1][col - 1] == char, (d, lines[line - 1])
    d = next(x for x in out if "guards[3]" in x)
    line, col = map(int, d.split(":")[1:3])
    assert lines[line - 1][col - 1:].startswith("sel.rank"), (d, lines[line - 1])


def test_fusion_errors_are_located():
    text = GOOD.replace("{id: act, op: aten.relu.default}", "{id: act, op: aten.gelu.default, input: nope}").replace(
        "conv.groups == 1", "conv.grups == 1")
    out = diags(text)
    assert any("fusions[0].pattern[1].op: aten.gelu.default has no rule in this pack" in d for d in out), out
    assert any("guard 'conv.grups == 1': conv has no field 'grups'; did you mean groups?" in d for d in out), out
    out = diags(GOOD.replace("{id: act, op: aten.relu.default}", "{id: conv, op: aten.relu.default, from: act}"))
    assert any("used twice" in d for d in out) and any("not an earlier step" in d for d in out), out


def test_bind_names_are_checked_against_the_catalog_kernel():
    out = diags(GOOD.replace("bind: {x: input}", "bind: {x: input, strides: stride}"))
    assert any("kernel conv2d has no input or attribute 'strides'; nearest: stride" in d for d in out), out
    out = diags(GOOD.replace("bind: {x: input}", "bind: {}"))
    assert any("kernel conv2d needs input(s) x" in d for d in out), out


def test_op_in_rules_and_no_rule_is_a_contradiction():
    out = diags(GOOD.replace("aten.erf.default", "aten.relu.default"))
    assert any("no_rule[0].op: aten.relu.default is listed under no_rule but has a rule" in d for d in out), out


@pytest.mark.parametrize("guard, fragment", [
    ("__import__('os').system('touch /tmp/torchfl-pwned')", "dunder"),
    ("self.__class__.__mro__", "dunder"),
    ("a" * ((1 << 20) - 400), "the limit is 8,192"),  # one line: its length is refused first
    ("a" * 3000, "the limit is 2,000"),
    ("(" * 100 + "true" + ")" * 100, "nested deeper"),
    ("not " * 400 + "true", "nested deeper"),
])
def test_hostile_packs_are_refused_at_import(guard, fragment, tmp_path):
    path = tmp_path / "evil.yaml"
    path.write_text(with_rule(f"- {{op: aten.relu.default, kernel: relu, args: {{self: tensor}}, bind: {{a: self}}, "
                              f"guards: [\"{guard}\"]}}"))
    report = check_pack(path)
    assert not report.ok and report.pack is None
    assert any(fragment in d.message for d in report.diagnostics), report.diagnostics
    assert not (tmp_path / "torchfl-pwned").exists()
    with pytest.raises(PackError):
        load_pack_text(path.read_text())


def test_yaml_level_attacks_are_refused(tmp_path):
    bomb = "pack: {name: t, version: 1.0.0}\na: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n" for p, c in zip("abcdefg", "bcdefgh"))
    assert not check_pack_text(bomb, "bomb.yaml").ok
    assert not check_pack_text("pack: !!python/object/apply:os.system ['true']\n", "tag.yaml").ok
    dup = "pack: {name: t, version: 1.0.0}\npack: {name: u, version: 1.0.0}\n"
    assert any("duplicate" in d.message.lower() for d in check_pack_text(dup, "dup.yaml").diagnostics)
    big = tmp_path / "big.yaml"
    big.write_bytes(b"#" * (2 << 20))
    assert "limit" in check_pack(big).diagnostics[0].message


def _file(content: bytes | None):
    def make(d):
        if content is None:
            return d
        (d / "f.yaml").write_bytes(content)
        return d / "f.yaml"
    return make


@pytest.mark.parametrize("make, fragment", [
    (lambda p: p / "missing.yaml", "no such file"),
    (_file(None), "is a directory"),
    (_file(b"\x00\x01"), "binary"),
    (_file(b"- 1\n- 2\n"), "a rule pack is a YAML mapping"),
    (_file(b""), "empty"),
    (_file(b"pack: [\n"), "invalid YAML"),
])
def test_check_pack_never_raises_for_bad_input(make, fragment, tmp_path):
    report = check_pack(make(tmp_path))
    assert not report.ok
    assert fragment in str(report.diagnostics[0]), report.diagnostics


def test_version_must_be_semver_text():
    out = diags("pack: {name: t, version: 1.0}\nrules: []\n")
    assert any("pack.version" in d for d in out), out


QUANT_FUSION = GOOD.replace("""no_rule:""", """  - name: dq_conv
    kernel: conv2d
    pattern:
      - {id: conv, op: aten.convolution.default}
      - {id: act, op: aten.relu.default}
      - {id: res, op: aten.relu.default, into: act, input: self}
    bind: {x: conv.input, weight: conv.weight}
no_rule:""")


def test_into_steps_feed_an_earlier_step_and_are_checked():
    """A DAG pattern's second operand (into: STEP, input: ARG) links to an earlier step's
    argument; errors are located and say what to write."""
    pack = load_pack_text(QUANT_FUSION, "q.yaml")
    step = pack.fusions[1].steps[2]
    assert (step.into, step.input, step.from_) == ("act", "self", None)
    out = diags(QUANT_FUSION.replace("into: act, input: self", "into: act"))
    assert any("into: act needs input:" in d for d in out), out
    out = diags(QUANT_FUSION.replace("into: act, input: self", "into: later, input: self"))
    assert any("into: 'later' is not an earlier step" in d for d in out), out
    out = diags(QUANT_FUSION.replace("into: act, input: self", "into: act, input: other"))
    assert any("input 'other' is not an argument of aten.relu.default" in d for d in out), out
    out = diags(QUANT_FUSION.replace("into: act, input: self", "into: act, from: conv, input: self"))
    assert any("either from:" in d for d in out), out


def test_packs_without_into_keep_their_canonical_hash():
    """into: is newer than published packs: a pack that does not use it hashes as before."""
    import json

    pack = load_pack_text(GOOD, "p.yaml")
    assert "into" not in json.dumps(pack.canonical())
    assert '"into":"act"' in load_pack_text(QUANT_FUSION, "q.yaml").canonical_json()
