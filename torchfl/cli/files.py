"""Files the commands write (``plan report -o``, ``hcd probe -o``): the path checked before the
work that fills it, and the text written through a temporary file and a rename, so that a full
disk or a kill leaves the old file as it was. Failures raise :class:`OutputError`, whose message
says what, where and the fix; each command prints it in its own style."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


class OutputError(Exception):
    """An output path that cannot be written (missing folder, a directory, no permission, full disk)."""


def writable_output(output: str, example: str = "report.html") -> Path:
    """The resolved path of ``-o output``, after checking it can be written (a temporary file is
    created and removed in its folder)."""
    path = Path(output).expanduser()
    parent = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise OutputError(f"-o {output} is a directory; give a file name such as {output.rstrip('/')}/{example}")
    if not parent.is_dir():
        raise OutputError(f"-o {output}: the folder {parent} does not exist; create it or choose another path")
    try:
        with tempfile.NamedTemporaryFile(dir=parent, prefix=f".{path.name}.", suffix=".tmp"):
            pass
    except OSError as exc:
        raise OutputError(f"-o {output}: cannot write in {parent} ({exc.strerror or exc}); choose a writable path") \
            from None
    if path.exists() and not os.access(path, os.W_OK):
        raise OutputError(f"-o {output}: the file is not writable; choose another path or make it writable")
    return path


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in its folder and a rename (the file
    keeps its mode; a new one gets the umask's)."""
    data = text.encode("utf-8")
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        if path.exists():
            os.chmod(tmp, path.stat().st_mode & 0o7777)
        else:
            os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        kept = " (the old file is unchanged)" if path.exists() else ""
        raise OutputError(f"could not write {path}: {exc.strerror or exc}{kept}") from None


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
