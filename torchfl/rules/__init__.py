"""Rule packs: declarative op -> kernel and fusion rules, a safe guard language, matching.

    from torchfl.rules import check_pack, load_pack, match, candidates, Call, TensorMeta
    report = check_pack("rules/core.yaml")     # PackReport(.pack, .diagnostics, .source, .ok); never raises
    pack = report.pack                         # .name .version .canonical() .canonical_json() .content_hash()
    m = match(pack, hcd, "aten.convolution.default", Call(args, kwargs), layout="NHCW")
    m.ok -> Match(.kernel .dtype .unit .layout .layouts .inputs .attrs .warnings .rule)
         or Rejection(.reasons: Reason(code, message, field, value, rule, guard))

Where fusion patterns occur in a graph: :mod:`torchfl.rules.groups`; matching a group:
:func:`torchfl.rules.matching.match_fusion`; the support
queries (ops / support / why-not): :mod:`torchfl.rules.support`. The file format is in
:mod:`torchfl.rules.format`, the guard language in :mod:`torchfl.rules.guards`.
Imports neither torch nor numba (the kernel catalog is pure Python).
"""

from torchfl.rules.call import Call, TensorMeta
from torchfl.rules.compile import PackError, PackReport, check_pack, check_pack_text, load_pack, load_pack_text
from torchfl.rules.pack import Fusion, Rule, RulePack

__all__ = [
    "Call", "Fusion", "Match", "PackError", "PackReport", "Reason", "Rejection", "Rule", "RulePack", "TensorMeta",
    "candidates", "check_pack", "check_pack_text", "load_pack", "load_pack_text", "match",
    "match_fusion",
]

_LAZY = ("match", "candidates", "Match", "Rejection", "Reason", "match_fusion")


def __getattr__(name):  # matching loads on first use
    if name in _LAZY:
        from torchfl.rules import matching

        return getattr(matching, name)
    raise AttributeError(f"module 'torchfl.rules' has no attribute {name!r}")
