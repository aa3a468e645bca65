"""What-if planning moves the right way when HCD numbers move, and the CLI faces of it
(``torchfl plan memory|max-batch|compare|impact``) on a real SQLite registry.

Checks: a larger ``size_gb`` never lowers max-batch; halving the off-chip bandwidth never
lowers a predicted time; a chip version that drops a layout or a head count shows up in
``impact`` as changed plans or errors (exit status 1 for a model that no longer plans)."""

import json
import textwrap

import pytest
from click.testing import CliRunner

from tests.planner.planner_helpers import captured, hcd_variant

from torchfl.cli.main import cli

TINY = textwrap.dedent('''
    import torch
    from torch import nn

    def conv(batch=1):
        torch.manual_seed(0)
        m = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                          nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(8, 4)).eval()
        return m, (torch.randn(batch, 3, 16, 16),)

    def attention(batch=1):
        torch.manual_seed(0)
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.att = nn.MultiheadAttention(64, 16, batch_first=True)
            def forward(self, x):
                return self.att(x, x, x, need_weights=False)[0]
        return M().eval(), (torch.randn(batch, 8, 64),)
''')


def _with(hcd, path, value, version=None):
    def edit(d):
        node = d
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = value(node[path[-1]]) if callable(value) else value
        if version:
            d["chip"]["version"] = version
    return hcd_variant(hcd, edit)


def _chip(hcd):
    from torchfl.planner.target import Target

    return Target.of(hcd)


def test_larger_memory_never_lowers_max_batch(chips):
    from torchfl.planner.whatif import max_batch
    from torchfl.planner.zoo import load_model

    module, inputs = load_model("mlp", batch=1, width=128, depth=2)
    found = []
    for mib in (0.3, 0.45, 0.7, 64):
        hcd = _with(chips["NPU-V3"], ("memory", "off_chip_memory", "size_gb"), mib / 1024)
        res = max_batch(module, inputs, _chip(hcd), precision="float16")
        found.append((res.batch, res.limit))
        fits = [p.batch for p in res.probes if p.ok]
        refused = [p.batch for p in res.probes if not p.ok]
        assert res.batch == max(fits) and all(b > res.batch for b in refused)      # found by planning
    batches = [b for b, _ in found]
    assert batches == sorted(batches) and batches[0] < batches[-1], found
    assert found[0][1] == "memory" and found[-1] == (512, "max_batch_size"), found


@pytest.mark.parametrize("model,options,chip,precision", [
    ("resnet18", dict(image=32), "NPU-V3", "float16"),
    ("gpt2", dict(seq_len=16, layers=1, hidden=64, num_heads=16), "NPU-V3", "float16"),
    ("mlp", dict(width=256), "EDGE-C2", "float16"),
    ("resnet18", dict(image=32), "TFL-X1", None),
])
def test_halving_bandwidth_never_lowers_predicted_time(chips, model, options, chip, precision):
    from torchfl.planner.api import plan_captured

    cap, inputs = captured(model, **options)
    hcd = chips[chip]
    half = _with(hcd, ("memory", "off_chip_memory", "bandwidth_gb_per_s"), lambda bw: bw / 2)
    t_full = plan_captured(cap, inputs, _chip(hcd), precision=precision).summary.predicted_time_s
    t_half = plan_captured(cap, inputs, _chip(half), precision=precision).summary.predicted_time_s
    assert t_half >= t_full > 0


def test_bound_resource_follows_bandwidth(chips):
    """Starve the off-chip link and a compute-heavy plan becomes memory-bound."""
    from torchfl.planner.api import plan_captured
    from torchfl.planner.whatif import bound_resource

    cap, inputs = captured("resnet18", image=32)
    slow = _chip(_with(chips["NPU-V3"], ("memory", "off_chip_memory", "bandwidth_gb_per_s"), 0.01))
    plan = plan_captured(cap, inputs, slow, precision="float16")
    assert bound_resource(plan, slow.model)[0] == "memory"


# ---------------------------------------------------------------- CLI, on a registry with chip versions

@pytest.fixture(scope="module")
def registry(tmp_path_factory, chips):
    """A seeded registry plus NPU-V3 1.1.0 (NCHW, the layout its plans of small convs use,
    dropped from every unit) and 1.2.0 (16 attention heads dropped too), imported as HCDs."""
    from torchfl.registry import Registry

    tmp = tmp_path_factory.mktemp("whatif")
    url = f"sqlite:///{tmp / 'registry.db'}"
    reg = Registry(url)
    reg.init(seed=True)
    base = chips["NPU-V3"]

    def no_nchw(d):
        d["chip"]["version"] = "1.1.0"
        for unit in d["compute_units"].values():
            if isinstance(unit, dict) and unit.get("supported_layouts"):
                unit["supported_layouts"] = [x for x in unit["supported_layouts"] if x != "NCHW"]

    def no_16_heads(d):
        no_nchw(d)
        d["chip"]["version"] = "1.2.0"
        d["compute_units"]["attention"]["supported_heads"] = [
            h for h in d["compute_units"]["attention"]["supported_heads"] if h != 16]

    texts = []
    for edit in (no_nchw, no_16_heads):
        texts.append((f"npu_v3_{edit.__name__}.hcd", hcd_variant(base, edit).canonical_json()))
    reg.import_texts(texts)
    reg.close()
    (tmp / "tiny.py").write_text(TINY)
    return url, str(tmp / "tiny.py"), base


def plan_cli(*args):
    return CliRunner().invoke(cli, ["plan", *args])


def test_impact_shows_a_dropped_layout_and_fails_on_a_dropped_head_count(registry):
    url, tiny, base = registry
    v0 = str(base.chip.version)
    models = f"{tiny}:conv,{tiny}:attention"
    out = plan_cli("impact", "--chip", "NPU-V3", "--from", v0, "--to", "1.1.0", "--models", models,
                   "--precision", "float16", "--registry", url, "--json")
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    assert any(c["path"].endswith("supported_layouts") for c in data["changes"])
    conv = next(m for m in data["models"] if m["model"].endswith(":conv"))
    assert conv["before"]["ok"] and conv["after"]["ok"] and not conv["broke"]
    layouts = [c for c in conv["changed_steps"] if "layout" in c["changed"] or "layouts_in" in c["changed"]]
    assert layouts and all(c["before"]["layout"] == "NCHW" != c["after"]["layout"] for c in layouts
                           if c["before"] and c["after"] and "layout" in c["changed"]), conv["changed_steps"]

    out = plan_cli("impact", "--chip", "NPU-V3", "--from", "1.1.0", "--to", "1.2.0", "--models", models,
                   "--precision", "float16", "--registry", url)
    assert out.exit_code == 1, out.output
    assert "attention: BROKEN" in out.stdout and "num_heads=16 not supported" in out.stdout
    assert out.stdout.rstrip().endswith("(exit status 1)")
    assert "compute_units.attention.supported_heads" in out.stdout


def test_memory_max_batch_compare_text_and_json(registry):
    url, tiny, _base = registry
    out = plan_cli("memory", f"{tiny}:conv", "--chip", "EDGE-C2", "--batch", "2", "--registry", url, "--json")
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    (g,) = data["graphs"]
    assert data["fits"] and data["peak_bytes"] == g["peak_bytes"] == max(g["live_bytes"] + [g["upload_bytes"]])
    assert sum(g["breakdown_at_peak"].values()) == g["peak_bytes"] and data["capacity_bytes"] == 1 << 30
    out = plan_cli("memory", f"{tiny}:conv", "--chip", "EDGE-C2", "--registry", url)
    assert out.exit_code == 0 and "peak" in out.stdout and "largest buffers at peak" in out.stdout

    out = plan_cli("max-batch", f"{tiny}:conv", "--chip", "EDGE-C2", "--registry", url, "--json")
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    assert data["batch"] == 8 and data["limit"] == "max_batch_size"      # EDGE-C2: max_batch_size 8, 1 GiB
    out = plan_cli("max-batch", f"{tiny}:conv", "--chip", "EDGE-C2", "--registry", url, "--training")
    assert out.exit_code == 0, out.output
    assert "training step" in out.stdout and "limited by: max_batch_size" in out.stdout

    out = plan_cli("compare", f"{tiny}:attention", "--registry", url, "--json")
    assert out.exit_code == 0, out.output
    rows = json.loads(out.stdout)["rows"]
    ok = [r for r in rows if r["ok"]]
    rank = [r.get("rank_time_s") or r["per_call_time_s"] for r in ok]   # the rank rule: confidence.rank_time
    assert rank == sorted(rank)
    assert {r["chip"] for r in rows} >= {"NPU-V2", "NPU-V3", "TFL-X1"}
    bad = {r["chip"]: r for r in rows if not r["ok"]}
    assert "NPU-V2" in bad and "num_heads=16" in bad["NPU-V2"]["error"]        # NPU-V2: no 16 heads
    assert all(r["bound"] in ("launch", "compute", "memory", "cache", "host") for r in ok)
    assert all(0 <= r["confidence"]["assumption_share"] <= 1 for r in ok)
    out = plan_cli("compare", f"{tiny}:conv", "--chips", "NPU-V3,TFL-X1", "--registry", url)
    assert out.exit_code == 0, out.output
    assert "fastest first" in out.stdout and "NPU-V3" in out.stdout and "TFL-X1" in out.stdout


def test_unknown_chip_is_one_line_error(registry):
    url, tiny, _base = registry
    out = plan_cli("compare", f"{tiny}:conv", "--chips", "NO-SUCH-CHIP", "--registry", url)
    assert out.exit_code == 1 and "unknown chip 'NO-SUCH-CHIP'" in out.stderr


def test_a_chip_version_is_resolved_once_checked_and_cached(registry):
    """``chip_of(name, registry, version)`` is one resolve_target: that version's HCD with the
    registry's packs, cached like any target (it was built anew, unchecked, on every call), and
    a version that is not there is the registry's one-line error."""
    from torchfl.planner import whatif
    from torchfl.planner.errors import ChoiceError
    from torchfl.planner.target import resolve_target
    from torchfl.registry import NotFound

    url, _tiny, base = registry
    old, new = whatif.chip_of("NPU-V3", url, "1.0.0"), whatif.chip_of("NPU-V3", url, "1.2.0")
    assert (old.version, new.version) == ("1.0.0", "1.2.0") and old.chip_hash != new.chip_hash
    assert whatif.chip_of("NPU-V3", url, "1.2.0") is new            # cached, not built again
    assert new.packs == resolve_target("NPU-V3", url).packs          # the registry's packs
    assert resolve_target("NPU-V3", url).version == "1.2.0"          # the latest, as before
    with pytest.raises(NotFound, match="has no version 9.9.9"):
        whatif.chip_of("NPU-V3", url, "9.9.9")
    with pytest.raises(ChoiceError, match="unknown chip 'NO-SUCH'"):
        whatif.chip_of("NO-SUCH", url, "1.0.0")
    with pytest.raises(ChoiceError, match="by chip name"):
        resolve_target(base, url, version="1.0.0")
