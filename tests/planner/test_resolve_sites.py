"""The chip is resolved once at each entry point (issue 35): ``resolve_target`` is called only
from the functions listed here, each at most the number of times given. Everything below an
entry takes the Target it is handed; a new call site is a second resolution of the same chip
(or an entry that belongs here: add it, with the reason, in the same change)."""
import ast
from collections import Counter
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "torchfl"

ALLOWED = {   # file:function (dotted for a method or a nested function) -> calls
    "planner/api.py:_prepared": 1,                       # every planner entry (plan_module, plan_graph, ...)
    "planner/whatif/planning.py:chip_of": 1,                     # the what-if questions (CLI and cluster)
    "cli/plan_cmd.py:_target_and_precision": 1,          # torchfl plan explain|report
    "cli/fidelity_cmd.py:_score.resolve": 1,             # torchfl fidelity score
    "cluster/fidelity.py:_resolver.resolve": 1,          # a cluster fidelity unit
    "conformance/bf16.py:check_native_bf16": 1,          # conformance entries
    "conformance/harness.py:run_unit": 1,
    "conformance/across.py:run_unit_across": 1,          # the same check for a unit of several chips
    "conformance/shared.py:ChipGraph._plan": 1,          # the backend's _plan, over a capture the chips share
    "conformance/execute.py:_early_refusals": 1,         # the layouts a chip takes, before a group's capture
    "runtime/backend.py:CompiledGraph._plan": 1,         # torch.compile backend
    "runtime/backend.py:training_decompositions": 1,     # the backend's AOT decompositions (runtime's)
    "runtime/device.py:device_memory": 1,
    "runtime/eager/device.py:target_of": 1,              # the eager device
    "fidelity/host.py:score_host": 1,                    # fidelity score on this host
}


def resolve_calls() -> Counter:
    """``file:function`` -> number of ``resolve_target(...)`` calls in it, over the package."""
    counts = Counter()
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()

        def walk(node, chain):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    walk(child, chain + [child.name])
                    continue
                if isinstance(child, ast.Call):
                    f = child.func
                    if (f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)) == "resolve_target":
                        counts[f"{rel}:{'.'.join(chain) or '<module>'}"] += 1
                walk(child, chain)
        walk(ast.parse(path.read_text()), [])
    return counts


def test_resolve_target_is_called_only_at_the_entry_points():
    calls = resolve_calls()
    new = {site: n for site, n in calls.items() if site not in ALLOWED}
    assert not new, f"resolve_target called outside the entry points (take the Target from the caller): {new}"
    twice = {site: n for site, n in calls.items() if n > ALLOWED[site]}
    assert not twice, f"an entry resolves its chip more than once (resolve it once, pass the Target): {twice}"


def test_the_scan_sees_a_call_site():
    """The scan is not vacuous: the planner's own entry is found."""
    assert resolve_calls()["planner/api.py:_prepared"] == 1
