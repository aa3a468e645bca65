"""Every code block of README.md and of the docs pages (docs/*.md) runs as printed (issue 36;
issue 53 moved most of the README into docs/ pages): what a user reads is true.

How the pages' blocks are run (whoever edits the README or a docs page follows these rules):

- A fenced ``python`` block is a script: it runs verbatim in a fresh interpreter and must
  exit 0. It defines everything it uses (no hidden preamble).
- A fenced ``console`` block is a terminal transcript: each line starting with ``$ `` is a
  command (a trailing backslash continues it), run by bash in a scratch directory that
  holds links to the checkout's top-level files (so ``hcd_registry/...`` and ``examples/...``
  resolve and written files stay out of the checkout); the lines after it, up to the next
  command, are its output (stdout and stderr together, as a terminal shows them). Output is
  compared after collapsing runs of spaces, dropping blank lines and writing every wall-clock
  duration (``4.1 s``) as ``N s``; a line ``...`` stands for any number of lines, and
  ``...`` inside a line for any text; no printed line may be wider than 100 columns (the
  width in a pipe), except a located diagnostic (``file:line: ...``, one per line for editors). A command must exit 0 unless the block is marked
  ``exit N`` (then its last command must exit N). A command with no output lines below it
  is only checked for its exit status.
- A fenced ``sh``/``bash`` block runs as one bash script and must exit 0.
- Other fences (``text``, ``yaml``, ``json``) and indented blocks are not run, and may not
  contain a ``$ `` or ``>>> `` prompt (a transcript must be a tested block).
- An HTML comment on the line(s) just above a fence marks it:
  ``<!-- readme-test: needs models -->`` (skipped, with the reason, when the optional
  extra is not installed: ``models``, ``report``, ``quant``, ``cluster``), or
  ``<!-- readme-test: exit 1 -->``. Several marks: ``<!-- readme-test: needs models; exit 1 -->``.

Every block runs against a registry of its own test session (``XDG_DATA_HOME`` in a
temporary directory: the default registry a new user gets, seeded on first use) and the one
kernel cache every entry point uses (``$NUMBA_CACHE_DIR`` or the user cache directory).
``TORCHFL_DEVICES`` and the other ``TORCHFL_*`` settings the test session may set are
removed: a block sees what a user's shell would.
"""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
# the README and the pages it links: each block runs from the checkout's top, as the README's do
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]

EXTRAS = {"models": "transformers", "report": "matplotlib", "quant": "torchao", "cluster": "ray"}
RUN = {"python", "console", "sh", "bash"}
NOT_RUN = {"text", "yaml", "json", "toml", "ini", "html", "dot", ""}
MARK = re.compile(r"^<!--\s*readme-test:\s*(.*?)\s*-->\s*$")
TIMEOUT_S = 900
PIPE_WIDTH = 100        # what every command prints in a pipe fits it (tests/cli/test_widths.py)
# a located diagnostic (`file:line[:col]: ...`) stays one line, as compilers print it, for
# editors and grep: the one kind of line allowed past the width
LOCATED = re.compile(r"^\s*[\w./-]+:\d+(:\d+)?: ")


@dataclass
class Block:
    lang: str
    text: str
    line: int                                  # 1-based line of the opening fence
    marks: dict = field(default_factory=dict)
    page: str = "README.md"                    # the file, relative to the checkout's top

    @property
    def id(self) -> str:
        return f"{self.page}:{self.lang}@L{self.line}"


def parse(text: str, page: str = "README.md") -> tuple[list[Block], list[tuple[int, str]]]:
    """(fenced blocks with their marks, indented code lines as (line, text)) of one page."""
    lines = text.splitlines()
    blocks, indented = [], []
    i = 0
    in_list_or_para = False
    while i < len(lines):
        line = lines[i]
        m = re.match(r"^```\s*([\w+-]*)\s*$", line)
        if m:
            start = i
            j = i + 1
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            if j == len(lines):
                raise AssertionError(f"{page}:{start + 1}: fence never closed")
            marks = {}
            k = start - 1
            while k >= 0 and MARK.match(lines[k]):      # marks sit on the lines just above
                marks.update(_marks(MARK.match(lines[k]).group(1), k + 1, page))
                k -= 1
            blocks.append(Block(m.group(1).lower(), "\n".join(lines[start + 1:j]) + "\n", start + 1, marks, page))
            i = j + 1
            in_list_or_para = False
            continue
        if line.startswith("    ") and not in_list_or_para:
            indented.append((i + 1, line[4:]))
        elif line.strip():
            in_list_or_para = not line.startswith("    ")
        else:
            in_list_or_para = False
        i += 1
    return blocks, indented


def _marks(spec: str, line: int, page: str = "README.md") -> dict:
    out = {}
    for part in (p.strip() for p in spec.split(";") if p.strip()):
        word, _, rest = part.partition(" ")
        if word == "needs":
            extras = [e.strip() for e in rest.split(",") if e.strip()]
            unknown = [e for e in extras if e not in EXTRAS]
            assert not unknown, (f"{page}:{line}: readme-test mark needs unknown extra(s) {unknown}; "
                                 f"known: {', '.join(EXTRAS)} (add one to EXTRAS in tests/test_readme.py)")
            out.setdefault("needs", []).extend(extras)
        elif word == "exit":
            out["exit"] = int(rest)
        else:
            raise AssertionError(f"{page}:{line}: unknown readme-test mark {part!r}; use 'needs EXTRA' or 'exit N'")
    return out


def _parse_pages():
    blocks, indented = [], []
    for path in PAGES:
        page = path.relative_to(ROOT).as_posix()
        b, ind = parse(path.read_text(encoding="utf-8"), page)
        blocks += b
        indented += [(page, n, t) for n, t in ind]
    return blocks, indented


BLOCKS, INDENTED = _parse_pages()        # INDENTED: (page, line, text)
RUNNABLE = [b for b in BLOCKS if b.lang in RUN]


# ------------------------------------------------------------------ environment

@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    """(cwd, env) for the blocks: links to the checkout's top level, a fresh default registry."""
    base = tmp_path_factory.mktemp("readme")
    cwd = base / "work"
    cwd.mkdir()
    for entry in ROOT.iterdir():
        if entry.name not in (".git", ".venv", ".cache"):
            (cwd / entry.name).symlink_to(entry)
    env = {k: v for k, v in os.environ.items()
           if not (k.startswith("TORCHFL_") or k.startswith("TORCH_FL_") or k in ("COLUMNS", "LINES"))}
    env["XDG_DATA_HOME"] = str(base / "data")
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(base / "inductor"))
    return cwd, env


def _skip_missing(block: Block) -> None:
    missing = [e for e in block.marks.get("needs", []) if importlib.util.find_spec(EXTRAS[e]) is None]
    if missing:
        pytest.skip(f"{block.page}:{block.line} needs the {', '.join(missing)} extra "
                    f"(pip install 'torchfl[{','.join(missing)}]')")


# ------------------------------------------------------------------ transcripts

DURATION = re.compile(r"\b\d+(?:\.\d+)? s\b")


def normalise(line: str) -> str:
    return re.sub(r"\s+", " ", DURATION.sub("N s", line)).strip()


def commands(block: Block) -> list[tuple[str, list[str]]]:
    """(command, expected output lines) pairs of a console block."""
    out: list[tuple[str, list[str]]] = []
    lines = block.text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("$ "):
            cmd = line[2:]
            while cmd.endswith("\\") and i + 1 < len(lines):
                i += 1
                cmd += "\n" + lines[i]                # bash reads the backslash-newline
            out.append((cmd, []))
        else:
            assert out, f"{block.page}:{block.line + 1 + i}: console block output before any `$ ` command"
            out[-1][1].append(line)
        i += 1
    return out


def matches(expected: list[str], actual: list[str]) -> bool:
    """Line-wise match: a line ``...`` skips any lines, ``...`` in a line is any text."""
    exp = [normalise(x) for x in expected if x.strip()]
    act = [normalise(x) for x in actual if x.strip()]
    pats = [None if e == "..." else re.compile(".*".join(re.escape(p) for p in e.split("...")) + r"\Z")
            for e in exp]
    memo: dict = {}

    def go(i, j):
        if (i, j) in memo:
            return memo[i, j]
        if i == len(pats):
            r = j == len(act)
        elif pats[i] is None:
            r = any(go(i + 1, k) for k in range(j, len(act) + 1))
        else:
            r = j < len(act) and bool(pats[i].match(act[j])) and go(i + 1, j + 1)
        memo[i, j] = r
        return r

    return go(0, 0)


def _run(args, cwd, env, **kw):
    return subprocess.run(args, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=TIMEOUT_S, **kw)


# ------------------------------------------------------------------ the tests

@pytest.mark.slow
@pytest.mark.parametrize("block", RUNNABLE, ids=[b.id for b in RUNNABLE])
def test_block_runs_as_printed(block: Block, sandbox, tmp_path):
    _skip_missing(block)
    cwd, env = sandbox
    where = f"{block.page}:{block.line} ({block.lang} block)"
    if block.lang == "python":
        script = tmp_path / f"readme_{block.line}.py"
        script.write_text(block.text, encoding="utf-8")
        res = _run([sys.executable, str(script)], cwd, env)
        assert res.returncode == 0, f"{where} exited {res.returncode}:\n{res.stdout[-4000:]}"
        return
    if block.lang in ("sh", "bash"):
        res = _run(["bash", "-e", "-c", block.text], cwd, env)
        assert res.returncode == 0, f"{where} exited {res.returncode}:\n{res.stdout[-4000:]}"
        return
    cmds = commands(block)
    assert cmds, f"{where}: a console block with no `$ ` command"
    for n, (cmd, expected) in enumerate(cmds):
        res = _run(["bash", "-c", cmd], cwd, env)
        want = block.marks.get("exit", 0) if n == len(cmds) - 1 else 0
        assert res.returncode == want, (f"{where}: `{cmd}` exited {res.returncode}, the README implies {want}:\n"
                                        f"{res.stdout[-4000:]}")
        wide = [line for line in res.stdout.splitlines() if len(line) > PIPE_WIDTH and not LOCATED.match(line)]
        assert not wide, f"{where}: `{cmd}` printed {len(wide)} line(s) over {PIPE_WIDTH} columns in a pipe:\n{wide[0]}"
        if any(x.strip() for x in expected):
            assert matches(expected, res.stdout.splitlines()), (
                f"{where}: `{cmd}` printed something else than the README shows.\n--- README:\n"
                + "\n".join(expected) + "\n--- printed:\n" + res.stdout)


def test_every_fence_is_known_and_prompts_are_tested():
    """A transcript in an untested block (indented, ``text``) could say anything."""
    unknown = [b.id for b in BLOCKS if b.lang not in RUN | NOT_RUN]
    assert not unknown, f"fences of unknown kind {unknown}; use one of {sorted(RUN | NOT_RUN)}"
    untested = [f"{p}:{n}" for p, n, t in INDENTED if t.lstrip().startswith(("$ ", ">>> "))]
    untested += [f"{b.page}:{b.line}" for b in BLOCKS if b.lang in NOT_RUN
                 for ln in b.text.splitlines() if ln.lstrip().startswith(("$ ", ">>> "))]
    assert not untested, ("prompts outside tested blocks (make them a ```console or ```python "
                          f"block): {untested[:5]}")
    readme = [b for b in BLOCKS if b.page == "README.md"]
    assert any(b.lang == "console" for b in readme) and any(b.lang == "python" for b in readme)


def test_marks_attach_to_a_block():
    """A mark separated from its fence by text would silently mark nothing."""
    for path in PAGES:
        lines = path.read_text(encoding="utf-8").splitlines()
        for n, line in enumerate(lines):
            if MARK.match(line):
                nxt = next((x for x in lines[n + 1:] if not MARK.match(x)), "")
                assert nxt.startswith("```"), \
                    f"{path.relative_to(ROOT)}:{n + 1}: a readme-test mark must sit on the line just above a fence"


def _synopsis() -> list[tuple[str, list[str], list[str]]]:
    """(page:line, command path, options) of each `torchfl ...` line of the command-line synopsis
    (docs/COMMANDS.md; any page may show such lines)."""
    out = []
    for page, n, text in INDENTED:
        words = re.split(r"\s{2,}", text.strip())[0].split()   # the description follows 2+ spaces
        if not words or words[0] != "torchfl":
            continue
        path = []
        for w in words[1:]:
            if re.fullmatch(r"[a-z][a-z-]*(\|[a-z][a-z-]*)*", w):
                path.append(w)
            else:
                break
        opts = re.findall(r"(?<![\w-])(--?[a-z][a-z-]*)", " ".join(words[1 + len(path):]))
        out.append((f"{page}:{n}", path, opts))
    return out


def test_synopsis_names_real_commands_and_options():
    """Each `torchfl ...` line of the synopsis names a command that exists and options it takes."""
    import click

    from torchfl.cli.main import cli

    lines = _synopsis()
    assert len(lines) >= 10, "docs/COMMANDS.md: the command-line synopsis was not found"
    for n, path, opts in lines:
        expanded = [[]]
        for w in path:
            expanded = [p + [alt] for p in expanded for alt in w.split("|")]
        for p in expanded:
            cmd = cli
            for w in p:
                assert isinstance(cmd, click.Group) and w in cmd.commands, \
                    f"{n}: `torchfl {' '.join(p)}`: no command {w!r}"
                cmd = cmd.commands[w]
            if len(expanded) > 1:
                continue                         # options of `a|b|c` lines belong to several commands
            names = {o for prm in cmd.params for o in (*getattr(prm, "opts", ()), *getattr(prm, "secondary_opts", ()))}
            names |= {"--help", "-h"}
            missing = [o for o in opts if o not in names]
            assert not missing, f"{n}: `torchfl {' '.join(p)}` has no option(s) {missing}"


def test_synopsis_lists_every_command():
    """Every command a user can run is in the synopsis (issue 53: it left out plan decode, plan
    max-context, fidelity and hcd probe)."""
    import click

    from torchfl.cli.main import cli

    listed = set()
    for _n, path, _opts in _synopsis():
        expanded = [[]]
        for w in path:
            expanded = [p + [alt] for p in expanded for alt in w.split("|")]
        listed |= {" ".join(p) for p in expanded}

    def leaves(cmd, path):
        if isinstance(cmd, click.Group):
            return [x for name, sub in cmd.commands.items() for x in leaves(sub, [*path, name])]
        return [" ".join(path)]

    missing = sorted(set(leaves(cli, [])) - listed)
    assert not missing, f"docs/COMMANDS.md: the synopsis leaves out `torchfl {'`, `torchfl '.join(missing)}`"


def test_readme_is_short_and_links_the_pages():
    """A newcomer reads the README in five minutes (issue 53: it was 538 lines); the rest is in
    docs/ pages it links, each of which exists."""
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 130, len(text.splitlines())
    for cmd in ("make demo", "make test"):
        assert cmd in text
    links = re.findall(r"\]\((docs/[\w.-]+\.md)\)", text)
    assert {"docs/COMMANDS.md", "docs/WHATIF.md", "docs/LM.md", "docs/EAGER.md", "docs/HCD.md"} <= set(links)
    assert all((ROOT / link).is_file() for link in links), links
    for path in PAGES[1:]:
        for link in re.findall(r"\]\(([\w./-]+\.md)\)", path.read_text(encoding="utf-8")):
            assert (path.parent / link).resolve().is_file(), f"{path.relative_to(ROOT)}: broken link {link}"


def test_matcher_rules():
    """The transcript comparison itself: it must be able to fail."""
    assert matches(["a  1.5 s", "...", "z"], ["a 12.0 s", "b", "c", "z"])
    assert not matches(["a", "z"], ["a", "b", "z"])
    assert matches(["wrote x (... KiB): y"], ["wrote x (351 KiB): y"])
    assert not matches(["time 2.36 ms"], ["time 2.37 ms"])
    assert not matches(["a", "..."], ["b"])
    cmds = commands(Block("console", "$ echo a \\\n  b\na b\n$ true\n", 1))
    assert cmds == [("echo a \\\n  b", ["a b"]), ("true", [])]
