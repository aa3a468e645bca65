"""The project built as a wheel and installed into a scratch ``site`` folder: what a user's
``pip install torchfl`` gets (bundled data files included), for the tests that run it."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def build_and_install(out: Path) -> Path:
    """Build the wheel into ``out/dist`` and install it (no dependencies) into ``out/site``;
    returns ``out``."""
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(out / "dist"), str(ROOT)], check=True)
    wheel = next((out / "dist").glob("torchfl-*.whl"))
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target",
                    str(out / "site"), str(wheel)], check=True)
    return out
