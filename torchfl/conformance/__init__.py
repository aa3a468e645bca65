"""Conformance: does a chip do what its rule packs claim? Evidence from execution.

``torchfl conformance --chip C`` runs PyTorch's OpInfo sample inputs (plus the project's
edge cases) for every ATen overload the rule packs map on chip C, strictly through
``torch.compile(backend="torchfl")`` on the emulated chip, compares each result with
eager torch at a stated tolerance per dtype, and records the verdicts in the registry as
evidence (``torchfl.registry.evidence``).

Sits above ``runtime`` (it executes plans) and is used by ``cli``; nothing below imports
it. Modules: ``opinfos`` (overload -> OpInfo), ``cases`` (samples and edge variants),
``compare`` (tolerances), ``execute`` (one case), ``harness`` (claims, sharding,
verdicts, recording), ``matrix`` (the ops x chips report). Only ``execute``, ``cases``
and the workers import torch.
"""
