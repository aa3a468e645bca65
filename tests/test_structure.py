"""Rules of ARCHITECTURE.md that a text scan of the package can hold."""
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "torchfl"
# every directory is held now (runtime/eager/ was audited by issue 38's helper "speed")
NOT_YET = ()


def test_every_catch_all_says_why_it_must_stay():
    """"Nothing catches Exception to keep going": a handler of ``Exception`` (or a bare
    ``except:``) stays only with a comment on its line saying why (user code may raise
    anything, the error is kept and raised later, ...); else catch the specific types."""
    bare = re.compile(r"^\s*except\s*(Exception\b[^:]*)?:(.*)$")
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if NOT_YET and rel.startswith(NOT_YET):
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            m = bare.match(line)
            if m and "#" not in m.group(2):
                found.append(f"torchfl/{rel}:{n}: {line.strip()}")
    assert not found, "catch-alls without a reason:\n" + "\n".join(found)


# --- the census of issue 35: small modules, short functions, no import loops -------------
# A module over MAX_MODULE_LINES lines or a function over MAX_FUNCTION_LINES lines stays only with a
# stated reason: a comment ``# long: <why>`` on the line above its ``def`` (or above its first
# decorator) for a function, on the first line of the file for a module. TO_SPLIT lists what is
# still to split; each group belongs to one helper, and a helper deletes only its own lines.
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80
TO_SPLIT: set = set()   # every group is done: planner, runtime and the CLI, kernels, hcd/rules/fidelity
LOOP_FREE = ("planner", "runtime/eager")
LOOPS_NOT_YET = set()     # planner/ and runtime/eager/ are loop-free


def _has_reason(lines, index):
    """A ``# long: why`` comment on the line above ``lines[index]`` (0-based)."""
    return index > 0 and lines[index - 1].strip().startswith("# long:") and len(lines[index - 1].strip()) > 12


def _census():
    import ast
    modules, functions = [], []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = "torchfl/" + path.relative_to(PACKAGE).as_posix()
        lines = path.read_text().splitlines()
        if len(lines) > MAX_MODULE_LINES and not (lines and lines[0].startswith("# long:")):
            modules.append((rel, f"{rel}: {len(lines)} lines"))
        for node in ast.walk(ast.parse("\n".join(lines))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                size = node.end_lineno - node.lineno + 1
                first = min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1
                if size > MAX_FUNCTION_LINES and not _has_reason(lines, first):
                    functions.append((f"{rel}:{node.name}", f"{rel}:{node.lineno} {node.name}: {size} lines"))
    return modules, functions


def test_no_module_or_function_too_long_without_a_reason():
    modules, functions = _census()
    found = [text for key, text in modules + functions if key not in TO_SPLIT]
    assert not found, ("split these, or say why on the line above (`# long: why`):\n" + "\n".join(found))


def test_not_yet_lists_only_what_is_still_too_long():
    """A split module or function leaves TO_SPLIT in the same change."""
    modules, functions = _census()
    still = {key for key, _ in modules + functions}
    assert not (TO_SPLIT - still), f"done, remove from TO_SPLIT: {sorted(TO_SPLIT - still)}"


def _import_graph(folder):
    """Edges module -> module of one folder, counting every import (a function-level one too:
    an import inside a function is still a dependency, only a later one)."""
    import ast
    import networkx as nx
    pkg = "torchfl." + folder.replace("/", ".")
    here = {p.stem for p in (PACKAGE / folder).glob("*.py")} - {"__init__"}
    graph = nx.DiGraph()
    for path in (PACKAGE / folder).glob("*.py"):
        if path.stem == "__init__":
            continue
        graph.add_node(path.stem)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = pkg if node.level == 1 else (".".join(pkg.split(".")[:-(node.level - 1)])
                                                    if node.level else "")
                module = (base + "." + node.module if base and node.module else base or node.module or "")
                names = [module] + [module + "." + a.name for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                if name.startswith(pkg + ".") and name[len(pkg) + 1:] in here and name[len(pkg) + 1:] != path.stem:
                    graph.add_edge(path.stem, name[len(pkg) + 1:])
    return graph


def test_no_import_loops_in_the_planner_and_the_eager_device():
    import networkx as nx
    loops = {folder: sorted(sorted(c) for c in nx.strongly_connected_components(_import_graph(folder)) if len(c) > 1)
             for folder in LOOP_FREE}
    assert {k for k, v in loops.items() if v} == set(LOOPS_NOT_YET), (
        f"LOOPS_NOT_YET is {sorted(LOOPS_NOT_YET)}; loops now: { {k: v for k, v in loops.items() if v} }")
    loops = {k: v for k, v in loops.items() if v and k not in LOOPS_NOT_YET}
    assert not loops, f"import loops (every import counts, function-level ones too): {loops}"
