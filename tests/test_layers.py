"""The layers hold: each package under torchfl/ imports only the layers before it
(hcd -> kernels -> rules -> registry -> planner -> runtime -> conformance -> fidelity ->
cluster -> cli), so
``runtime/`` in particular imports nothing from ``registry/`` (a plan runs on the Target it
was made for). Read from the source with ``ast``: lazy imports inside functions count."""
from __future__ import annotations

import ast
from pathlib import Path

ORDER = ["hcd", "kernels", "rules", "registry", "planner", "runtime", "conformance", "fidelity",
         "cluster", "cli"]
#: leaf modules of the package every layer may import (they import nothing of torchfl)
LEAVES = {"version", "resources", "import_noise"}
ROOT = Path(__file__).resolve().parent.parent / "torchfl"
#: earlier layers a layer still must not import: the runtime executes a Target, never the registry
FORBIDDEN = {("runtime", "registry")}


def _imports(path: Path):
    """Every module ``path`` imports, in every form: ``import a.b``, ``from a.b import c``
    (``a.b.c`` when ``c`` is a subpackage or module, else ``a.b``), relative imports, and
    ``from torchfl import x`` (the face itself when ``x`` is no module: the face reaches every
    layer, so a layer importing it is reported)."""
    package = ["torchfl", *path.relative_to(ROOT).parts[:-1]]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from ((a.name, node.lineno) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                sub = ROOT.parent.joinpath(*base.split("."), alias.name)
                yield (f"{base}.{alias.name}" if sub.is_dir() or sub.with_suffix(".py").is_file() else base), node.lineno


def test_every_layer_imports_only_earlier_layers():
    wrong = []
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT).parts
        if len(parts) < 2 or parts[0] not in ORDER:
            continue
        mine = ORDER.index(parts[0])
        for module, line in _imports(path):
            names = module.split(".")
            if names[0] != "torchfl" or (len(names) > 1 and names[1] in LEAVES):
                continue
            if len(names) == 1:
                if parts[0] == "cli":   # the face is the user's entry, like the CLI itself
                    continue
                wrong.append(f"{path.relative_to(ROOT.parent)}:{line} imports the package face torchfl "
                             "(import the module that defines the name, e.g. torchfl.version)")
                continue
            if names[1] not in ORDER:
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
    (tmp_path / "torchfl" / "registry").mkdir()
    (tmp_path / "torchfl" / "registry" / "z.py").write_text("def v():\n    from torchfl import __version__\n")
    monkeypatch.setattr(__import__(__name__, fromlist=["ROOT"]), "ROOT", tmp_path / "torchfl")
    try:
        test_every_layer_imports_only_earlier_layers()
    except AssertionError as exc:
        assert "runtime/x.py:2 imports torchfl.registry" in str(exc)
        assert "kernels/y.py:1 imports torchfl.planner" in str(exc)
        assert "registry/z.py:2 imports the package face torchfl" in str(exc)
    else:
        raise AssertionError("runtime -> registry was not reported")


def test_the_layers_are_the_packages_and_the_architecture_page_names_them():
    """One statement of the layering: every package under torchfl/ is a layer of ORDER (a new
    package is placed in it, not left outside the check), every top-level module is a leaf, and
    docs/ARCHITECTURE.md's diagram names the same layers in the same order."""
    packages = {p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    assert packages == set(ORDER), (f"packages not in ORDER: {sorted(packages - set(ORDER))}; "
                                    f"in ORDER but absent: {sorted(set(ORDER) - packages)}")
    modules = {p.stem for p in ROOT.glob("*.py")} - {"__init__"}
    assert modules == LEAVES, f"top-level modules that are not leaves: {sorted(modules - LEAVES)}"
    page = (ROOT.parent / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    diagram = next(line for line in page.splitlines() if line.strip().startswith("hcd →"))
    assert [w.strip() for w in diagram.split("→")] == ORDER
