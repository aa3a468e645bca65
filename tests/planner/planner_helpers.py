"""Planner test helpers: captures cached per session, HCD variants."""

_CAPTURES = {}


def captured(name, **options):
    """(captured graph, example inputs) of a zoo model, captured once per session."""
    key = (name, tuple(sorted(options.items())))
    if key not in _CAPTURES:
        from torchfl.planner.capture import capture_module
        from torchfl.planner.zoo import load_model

        module, inputs = load_model(name, **options)
        _CAPTURES[key] = (capture_module(module, inputs), inputs)
    return _CAPTURES[key]


def capture_of(module, inputs, key):
    if key not in _CAPTURES:
        from torchfl.planner.capture import capture_module

        _CAPTURES[key] = (capture_module(module, inputs), inputs)
    return _CAPTURES[key]


def hcd_variant(hcd, edit):
    """An HCD with its canonical data edited by ``edit(dict)`` (validated again)."""
    import json

    from torchfl.hcd import load_hcd_text

    data = json.loads(hcd.canonical_json())
    edit(data)
    return load_hcd_text(json.dumps(data), f"{hcd.chip.name}-variant.hcd")
