"""JSON Schema (draft 2020-12) of the HCD format, for editors and yaml-language-server.

Generated from the pydantic model, then widened by exactly one thing the model does not
hold: the legacy unit keys ``peak_gflops``/``peak_gops`` (accepted, deprecated), so the
article's own files validate in an editor as they do in ``torchfl hcd validate``.
"""

from __future__ import annotations

import copy

from torchfl.hcd.model import HCD
from torchfl.hcd.validate import LEGACY_KEYS

SCHEMA_ID = "https://torchfl.dev/schema/hcd-v1.json"


def hcd_json_schema() -> dict:
    schema = copy.deepcopy(HCD.model_json_schema(mode="validation"))
    defs = schema.get("$defs", {})
    for legacy, (canonical, _kinds) in LEGACY_KEYS.items():
        for definition in defs.values():
            props = definition.get("properties", {})
            if canonical not in props:
                continue
            unit = "TFLOPS" if canonical == "peak_tflops" else "TOPS"
            props[legacy] = {
                **{k: v for k, v in props[canonical].items() if k != "title"},
                "deprecated": True,
                "description": f"Legacy name of {canonical}; the value is in {unit} despite the name.",
            }
            required = [r for r in definition.get("required", []) if r != canonical]
            definition["required"] = required
            definition["oneOf"] = [{"required": [canonical]}, {"required": [legacy]}]
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        **schema,
        "title": "torchfl Hardware Capability Descriptor (HCD) v1.2 (every 1.0 and 1.1 file is valid 1.2)",
    }
