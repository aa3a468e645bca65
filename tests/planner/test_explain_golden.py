"""``plan.explain()`` text and ``plan.to_json()`` bytes on two golden cases equal the stored
digests, so a planner speed-up (a lazily built ``Plan.rejected``, a faster DP) cannot change
what a user reads. Cases and models as in tests/planner/golden.py. After an *intended* plan
change (which also regenerates the golden plans) regenerate with

    PYTHONPATH=$PWD .venv/bin/python -m tests.planner.test_explain_golden --update
"""

import hashlib
import json
import pickle
import sys
import warnings
from pathlib import Path

import pytest

from tests.planner.golden import plan_case
from torchfl.planner.plan import LazyTuple

DIGESTS = Path(__file__).resolve().parent / "data" / "explain_digests.json"
CASES = ("resnet50-64/NPU-V3/fp16", "bert-base-1layer/NPU-V3/fp16")


ROOT = str(Path(__file__).resolve().parents[2])


def _portable(text: str) -> str:
    """The text as any checkout prints it: explain's notes name the HCD file by its path
    (and wrap at 120 columns around it), so the checkout's root becomes ``<repo>`` and runs
    of whitespace one space; every other character is compared exactly."""
    return " ".join(text.replace(ROOT, "<repo>").split())


def digests(name: str) -> dict:
    plan = plan_case(name)
    texts = {"explain": plan.explain(width=100), "json": plan.to_json()}   # 100: as in a pipe, whatever COLUMNS
    return {k: hashlib.sha256(_portable(v).encode()).hexdigest() for k, v in texts.items()}


@pytest.mark.parametrize("name", CASES)
def test_explain_and_json_unchanged(name):
    want = json.loads(DIGESTS.read_text())[name]
    assert digests(name) == want, (f"{name}: explain text or plan JSON differs from {DIGESTS.name}; if the "
                                   "plan change is intended, regenerate it (module docstring)")


def test_lazy_rejected_behaves_as_a_tuple():
    plan = plan_case(CASES[1])
    assert isinstance(plan.rejected, LazyTuple) and plan.rejected._items is None, "built before anything read it"
    eager = tuple(plan.rejected)
    assert eager and plan.rejected == eager and eager == plan.rejected and len(plan.rejected) == len(eager)
    assert plan.rejected[:3] == eager[:3] and list(plan.rejected) == list(eager)
    assert plan.to_dict()["rejected"] == [r.to_dict() for r in eager]
    assert pickle.loads(pickle.dumps(plan.rejected)) == eager


if __name__ == "__main__":
    warnings.filterwarnings("ignore")
    if "--update" in sys.argv[1:]:
        DIGESTS.write_text(json.dumps({n: digests(n) for n in CASES}, indent=1, sort_keys=True) + "\n")
        print(f"wrote {DIGESTS}")
    else:
        print(json.dumps({n: digests(n) for n in CASES}, indent=1, sort_keys=True))
