"""Golden plans: a canonical dump of what the planner chooses for a few zoo models, so a
change meant only to make planning faster cannot silently change a choice or a price.

The dump keeps, per step: kind, kernel, FX nodes (the fusion group), value names, layouts,
dtype, tiling, kernel attributes and the predicted time; plus conversions, casts, fallbacks,
the rejected alternatives and the summary. Floats are rounded to 12 significant digits.

Regenerate (after an *intended* plan change: cost model, fusion pattern, kernel choice) with

    PYTHONPATH=$PWD .venv/bin/python -m tests.planner.golden --update

and say in the commit message which choices changed and why. Without ``--update`` the
module prints the cases that differ from tests/planner/data/golden_plans.json.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

GOLDEN = Path(__file__).resolve().parent / "data" / "golden_plans.json"

# name -> (zoo model or "chainN", its options, chip, precision)
CASES = {
    "resnet50-64/NPU-V3/fp16": ("resnet50", {"image": 64}, "NPU-V3", "float16"),
    "bert-base-1layer/NPU-V3/fp16": ("bert-base", {"layers": 1, "seq_len": 32, "num_heads": 8}, "NPU-V3", "float16"),
    "bert-base-1layer/DSP-M4/fp16": ("bert-base", {"layers": 1, "seq_len": 32, "num_heads": 8}, "DSP-M4", "float16"),
    "mlp/NPU-V3/bf16": ("mlp", {}, "NPU-V3", "bfloat16"),
    "mlp/TFL-X1/fp32": ("mlp", {}, "TFL-X1", None),
    "mlp/EDGE-C2/fp16": ("mlp", {}, "EDGE-C2", "float16"),
    "chain12/NPU-V3/fp16": ("chain12", {}, "NPU-V3", "float16"),
}


def _num(x):
    return x if not isinstance(x, float) else float(f"{x:.12g}")


def _canon(value):
    """JSON-ready value with floats rounded (tuples as lists, dict keys as strings)."""
    if isinstance(value, dict):
        return {str(k): _canon(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_canon(v) for v in value]
    return _num(value)


def _digest(texts) -> str:
    """A short hash of the rejection reasons (their wording is long; a change still shows)."""
    import hashlib

    return hashlib.sha256("\n".join(texts).encode()).hexdigest()[:12]


def dump(plan) -> dict:
    """The canonical dump of ``plan``'s choices and prices."""
    steps = [[s.kind, s.kernel, s.nodes, s.inputs, s.outputs, s.layouts_in, s.layout_out, s.dtype, s.tile,
              s.attrs, s.static, s.predicted_time_s] for s in plan.steps]
    rejected = [[r.nodes, r.kernel, _digest(r.reasons), r.predicted_time_s, r.chosen_time_s] for r in plan.rejected]
    return _canon({
        "steps": steps,
        "conversions": [c.to_dict() for c in plan.conversions],
        "casts": [c.to_dict() for c in plan.casts],
        "fallbacks": [f.to_dict() for f in plan.fallbacks],
        "folded": [f.to_dict() for f in plan.folded],
        "rejected": rejected,
        "summary": plan.summary.to_dict(),
    })


def _chain(n):
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.Sequential(*[nn.Linear(64, 64) for _ in range(n)]).eval(), (torch.randn(8, 64),)


def plan_case(name):
    """Plan one case of :data:`CASES` (captures cached per process)."""
    from tests.planner.planner_helpers import capture_of, captured
    from torchfl.hcd import load_hcd
    from torchfl.planner.api import plan_captured
    from torchfl.planner.target import Target, bundled_packs
    from torchfl.resources import bundled_hcds

    model, options, chip, precision = CASES[name]
    if model.startswith("chain"):
        cap, x = capture_of(*_chain(int(model[5:])), key=("golden", model))
    else:
        cap, x = captured(model, **options)
    hcd = next(h for h in map(load_hcd, bundled_hcds()) if h.chip.name == chip)
    return plan_captured(cap, x, Target.of(hcd, bundled_packs()), precision=precision)


def current() -> dict:
    return {name: dump(plan_case(name)) for name in CASES}


def render(cases: dict) -> str:
    """JSON with one line per step / rejected alternative, so a regenerated file diffs well."""
    out = ["{"]
    for i, (name, case) in enumerate(sorted(cases.items())):
        out.append(f" {json.dumps(name)}: {{")
        for j, (key, items) in enumerate(sorted(case.items())):
            sep = "," if j < len(case) - 1 else ""
            if isinstance(items, list) and items:
                lines = ",\n".join("   " + json.dumps(x, sort_keys=True) for x in items)
                out.append(f"  {json.dumps(key)}: [\n{lines}\n  ]{sep}")
            else:
                out.append(f"  {json.dumps(key)}: {json.dumps(items, sort_keys=True)}{sep}")
        out.append(" }" + ("," if i < len(cases) - 1 else ""))
    return "\n".join(out) + "\n}\n"


def main(argv=None) -> int:
    warnings.filterwarnings("ignore")
    argv = sys.argv[1:] if argv is None else argv
    now = current()
    if "--update" in argv:
        GOLDEN.write_text(render(now))
        print(f"wrote {GOLDEN} ({len(now)} cases)")
        return 0
    old = json.loads(GOLDEN.read_text())
    differ = [n for n in CASES if old.get(n) != now[n]]
    print("differ: " + (", ".join(differ) if differ else "none"))
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
