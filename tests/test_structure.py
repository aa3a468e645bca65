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
