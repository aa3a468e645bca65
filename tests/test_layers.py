"""The layers hold: each package under torchfl/ imports only the layers before it
(hcd -> kernels -> rules -> registry -> planner -> runtime -> conformance -> cli), so
``runtime/`` in particular imports nothing from ``registry/`` (a plan runs on the Target it
was made for). Read from the source with ``ast``: lazy imports inside functions count."""
from __future__ import annotations

import ast
from pathlib import Path

ORDER = ["hcd", "kernels", "rules", "registry", "planner", "runtime", "conformance", "cli"]
ROOT = Path(__file__).resolve().parent.parent / "torchfl"
#: earlier layers a layer still must not import: the runtime executes a Target, never the registry
FORBIDDEN = {("runtime", "registry")}


def _imports(path: Path):
    package = ["torchfl", *path.relative_to(ROOT).parts[:-1]]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from ((a.name, node.lineno) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level + 1]
                yield ".".join(base + ([node.module] if node.module else [])), node.lineno
            else:
                yield node.module or "", node.lineno


def test_every_layer_imports_only_earlier_layers():
    wrong = []
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT).parts
        if len(parts) < 2 or parts[0] not in ORDER:
            continue
        mine = ORDER.index(parts[0])
        for module, line in _imports(path):
            names = module.split(".")
            if names[0] != "torchfl" or len(names) < 2 or names[1] not in ORDER:
                continue
            if ORDER.index(names[1]) > mine or (parts[0], names[1]) in FORBIDDEN:
                wrong.append(f"{path.relative_to(ROOT.parent)}:{line} imports {module}")
    assert wrong == [], "a layer imports a later one:\n" + "\n".join(wrong)


def test_the_check_sees_a_violation(tmp_path, monkeypatch):
    """The walk above reports runtime -> registry and a layer importing a later one."""
    bad = tmp_path / "torchfl" / "runtime" / "x.py"
    bad.parent.mkdir(parents=True)
    bad.write_text("def f():\n    from torchfl.registry import Registry\n")
    (tmp_path / "torchfl" / "kernels").mkdir()
    (tmp_path / "torchfl" / "kernels" / "y.py").write_text("from ..planner import plan_module\n")
    monkeypatch.setattr(__import__(__name__, fromlist=["ROOT"]), "ROOT", tmp_path / "torchfl")
    try:
        test_every_layer_imports_only_earlier_layers()
    except AssertionError as exc:
        assert "runtime/x.py:2 imports torchfl.registry" in str(exc)
        assert "kernels/y.py:1 imports torchfl.planner" in str(exc)
    else:
        raise AssertionError("runtime -> registry was not reported")
