"""Two known third-party import messages dropped from a user's program, nothing else.

With torchao installed (the `quant` and `test` extras; transformers imports it), a program
that does ``import torch; import torchfl`` and then runs a model printed, on a CPU machine,
one torchao line per CUDA extension it cannot load ("Failed to load .../torchao/_C_mxfp8...so:
Could not load this library: ...") and one torch ``_pytree`` deprecation per Enum that torchao
registers ("<enum 'KernelPreference'> is an Enum subclass and is now natively supported by
torch.compile ..."): 200-280 columns each, about torchao's own packaging, nothing about the
user's model or anything the user can fix. ``import torchfl`` adds a logging filter to those two
loggers that drops exactly these records (a torchao "Failed to load" of a file of torchao's own
package; the _pytree Enum deprecation of an Enum defined in torchao) and lets every other record
through at the level the program configured (unlike the CLI's :mod:`torchfl.cli.quiet`, which
raises the loggers to ERROR in torchfl's own processes). ``TORCHFL_VERBOSE_IMPORTS=1`` keeps them.
"""
from __future__ import annotations

import logging
import os

__all__ = ["install"]

# torch/utils/_pytree.py register_constant(): log.warning("%s is an Enum subclass and is now ...", cls)
_PYTREE_ENUM = "%s is an Enum subclass and is now natively supported by torch.compile"
_installed = {"done": False}


def _torchao_extension(record: logging.LogRecord) -> bool:
    """torchao/__init__.py: ``logger.warning(f"Failed to load {file}: {e}")`` for its ``_C*.so``."""
    msg = record.getMessage()
    return msg.startswith("Failed to load ") and "/torchao/_C" in msg.split(":", 1)[0]


def _torchao_enum(record: logging.LogRecord) -> bool:
    """torch's deprecation of ``register_constant`` on an Enum, for an Enum of torchao's."""
    if not isinstance(record.msg, str) or not record.msg.startswith(_PYTREE_ENUM):
        return False
    args = record.args if isinstance(record.args, tuple) else ()
    return bool(args) and str(getattr(args[0], "__module__", "")).startswith("torchao")


class _Drop(logging.Filter):
    def __init__(self, known) -> None:
        super().__init__()
        self.known = known

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.known(record)


def install() -> None:
    """Add the two filters (once per process; before or after torchao is imported)."""
    if _installed["done"] or os.environ.get("TORCHFL_VERBOSE_IMPORTS") == "1":
        return
    logging.getLogger("torchao").addFilter(_Drop(_torchao_extension))
    logging.getLogger("torch.utils._pytree").addFilter(_Drop(_torchao_enum))
    _installed["done"] = True
