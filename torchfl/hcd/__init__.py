"""The HCD layer: the format's model, its safe located loading and its validation.

Flow: file -> :func:`located_yaml` (plain data + positions) -> :func:`check_hcd`
(normalise legacy units, pydantic structure, cross-field consistency) -> :class:`HCD`.
"""

from torchfl.hcd.diagnostics import Diagnostic, HCDError, TorchflInputError, YAMLLoadError, format_path
from torchfl.hcd.model import HCD
from torchfl.hcd.provenance import PERFORMANCE_FIELDS, Source
from torchfl.hcd.source import LocatedDocument, located_yaml, read_text
from torchfl.hcd.validate import HCDReport, check_hcd, check_hcd_text, load_hcd, load_hcd_text

__all__ = [
    "HCD", "HCDError", "PERFORMANCE_FIELDS", "Source", "HCDReport", "Diagnostic", "LocatedDocument", "TorchflInputError", "YAMLLoadError",
    "check_hcd", "check_hcd_text", "format_path", "load_hcd", "load_hcd_text", "located_yaml", "read_text",
]
