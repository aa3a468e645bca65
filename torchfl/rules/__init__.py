"""Rule packs: declarative op -> kernel and fusion rules, a safe guard language, matching.

    from torchfl.rules import check_pack, load_pack, match, candidates
    report = check_pack("rules/core.yaml")        # PackReport(.pack, .diagnostics, .source, .ok)
    m = match(report.pack, hcd, "aten.convolution.default", call)   # Match | Rejection

Imports neither torch nor numba (the kernel catalog is pure Python).
"""

from torchfl.rules.call import Call, TensorMeta, call_from_node
from torchfl.rules.compile import PackError, PackReport, check_pack, check_pack_text, load_pack, load_pack_text
from torchfl.rules.pack import Fusion, Rule, RulePack

__all__ = [
    "Call", "Fusion", "PackError", "PackReport", "Rule", "RulePack", "TensorMeta", "call_from_node",
    "check_pack", "check_pack_text", "load_pack", "load_pack_text",
]


def __getattr__(name):  # matching and support load on first use (they need nothing heavy either)
    if name in ("match", "candidates", "Match", "Rejection", "Reason", "match_fusion", "static_support"):
        from torchfl.rules import matching

        return getattr(matching, name)
    raise AttributeError(name)
