"""Several chips, one model (issue 49): the analytic slice.

A decoder LM split over N identical chips of one fabric domain (the chip's HCD ``interconnect``):

* ``collectives.py``: ring all-reduce, all-gather and point-to-point transfers priced from the links;
* ``shard.py``: one tensor-parallel shard of a Hugging Face decoder (heads, key/value heads, MLP width
  and vocabulary divided by ``tp``), built on the meta device, so the existing single-chip planner
  plans it unchanged;
* ``split.py``: ``--chips NxCHIP`` parsed, the (tp, pp) candidates, each priced (the shard's plan +
  its collectives + pipeline hand-offs) and the split chosen by cost or fixed by the user.

``data.py``: data-parallel training's gradient all-reduce (its bytes and its price); ``experts.py``:
expert parallel's all-to-alls (fixed-capacity buffers: bytes independent of the routing).

Emulated multi-device execution of a split is ``torchfl.runtime.parallel`` (issue 49 item 3); it
checks its counted link bytes against :func:`collective_bytes`, the schedule the pricing reads.
"""

from torchfl.planner.parallel.collectives import all_gather_s, all_reduce_s, p2p_s
from torchfl.planner.parallel.shard import ShardError, shard_config, shard_lm
from torchfl.planner.parallel.split import (Chips, ParallelError, Split, candidates, collective_bytes,
                                            collective_seconds, parse_chips, plan_parallel)

__all__ = ["all_gather_s", "all_reduce_s", "p2p_s", "ShardError", "shard_config", "shard_lm", "Chips",
           "ParallelError", "Split", "candidates", "collective_bytes", "collective_seconds", "parse_chips", "plan_parallel"]
