"""What-if planning: questions answered by planning, before a chip is in hand.

One module per question, each over the common step of ``planning.py`` (a chip resolved, a
model captured once per shape and planned on each chip: a capture costs seconds, a plan well
under one):

* ``batch.py``: :func:`max_batch`, the largest batch whose plan fits the chip (memory,
  ``max_batch_size``, sequence length), found by planning at a few batches, never by running;
* ``context.py``: a decoder's :func:`max_context` and :func:`max_batch_at_context` (the KV
  cache grows with both);
* ``compare.py``: :func:`compare`, one model planned on several chips, side by side, ranked;
* ``impact.py``: :func:`impact`, one model set planned on two versions of a chip, what changed;
* ``serving.py``: :func:`compare_decode`, a causal LM's predicted serving speed per chip.

Results are plain data with ``to_dict()`` for ``--json``; the CLI (``torchfl plan
memory|max-batch|max-context|decode|compare|impact``) only formats them. The names below are
the package's face: callers use ``whatif.<name>``.
"""

from torchfl.planner.whatif.batch import LIMIT_FIELDS, MaxBatch, Probe, batched, max_batch
from torchfl.planner.whatif.compare import bound_resource, compare, rank_compare_rows, row
from torchfl.planner.whatif.context import Decoder, MaxContext, max_batch_at_context, max_context, plan_decode
from torchfl.planner.whatif.impact import Impact, ModelImpact, diff_plans, impact
from torchfl.planner.whatif.planning import (Planned, auto_precision, capture, chip_of, example_error, plan_everywhere,
                                             plan_on, training_peak)
from torchfl.planner.whatif.serving import CACHES, Engine, compare_decode, decode_row, prefill_capture

__all__ = ["LIMIT_FIELDS", "MaxBatch", "Probe", "batched", "max_batch", "bound_resource", "compare",
           "rank_compare_rows", "row", "Decoder", "MaxContext", "max_batch_at_context", "max_context", "plan_decode",
           "Impact", "ModelImpact", "diff_plans", "impact", "Planned", "auto_precision", "capture", "chip_of",
           "example_error", "plan_everywhere", "plan_on", "training_peak", "compare_decode", "decode_row", "CACHES", "Engine",
           "prefill_capture"]
