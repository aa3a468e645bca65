"""Third-party import noise, silenced where torchfl's own programs import those libraries.

Importing transformers loads torchao when it is installed; torchao then logs one warning per
CUDA extension it cannot load on a CPU machine ("Failed to load .../_C_mxfp8...so"), and torch
logs a deprecation warning for each Enum torchao registers with pytree: 200-280 columns of
text that say nothing about the user's model. The CLI, the demo and tools/calibrate.py call
:func:`silence_import_noise` before anything imports them; a user's own program (``import
torchfl``) keeps its logging as it configured it. ``TORCHFL_VERBOSE_IMPORTS=1`` keeps the noise.
"""
from __future__ import annotations

import logging
import os

# loggers whose warnings at import time are noise for torchfl's users (ERROR still shows)
NOISY_LOGGERS = ("torchao", "torch.utils._pytree")


def silence_import_noise() -> None:
    """Raise the noisy loggers to ERROR (before or after their modules are imported)."""
    if os.environ.get("TORCHFL_VERBOSE_IMPORTS") == "1":
        return
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
