"""Conformance: does a chip do what its rule packs claim? Evidence from execution.

``torchfl conformance --chip C`` runs PyTorch's OpInfo sample inputs (plus the project's
edge cases) for every ATen overload the rule packs map on chip C, strictly through
``torch.compile(backend="torchfl")`` on the emulated chip (``--mode eager``: op by op on
the ``npu`` device, as a user's eager code runs; ``--samples all``: every sample op_db has),
compares each result with eager torch at a stated tolerance per dtype, and records the
verdicts in the registry as evidence (``torchfl.registry.evidence``). A chip whose HCD
claims native bfloat16 is also probed beyond float16's range (``bf16``).

Sits above ``runtime`` (it executes plans) and is used by ``cli``; nothing below imports
it. Modules: ``opinfos`` (overload -> OpInfo), ``cases`` (samples and edge variants),
``compare`` (tolerances), ``execute`` (one case, compiled or eager), ``harness`` (claims,
sharding, verdicts, recording), ``bf16`` (the native-bfloat16 probe), ``matrix`` (the ops x
chips report). Only ``execute``, ``cases``
and the workers import torch.
"""
