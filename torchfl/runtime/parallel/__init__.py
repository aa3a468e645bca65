"""Emulated execution of a split (issue 49 item 3): tp x pp emulated chips run their shards of one
model, ring collectives move counted bytes between them, the outputs equal the unsplit model's.

* ``weights.py``: one chip's shard with the unsplit model's weights sliced (the planner's shapes);
* ``programs.py``: what a chip runs between two collectives, compiled with the torchfl backend;
* ``links.py``: the ring all-reduce / all-gather and point-to-point sends, bytes counted per link;
* ``run.py``: :func:`run_split`, the plan's steps in order, and the bytes checked against the plan's;
* ``data.py``: :func:`data_parallel_step`, one training step's gradients over data-parallel chips;
* ``experts.py``: :func:`run_expert_parallel`, a mixture-of-experts decoder with its experts split.
"""

from torchfl.runtime.parallel.data import DataParallelRun, data_parallel_step, full_batch_loss
from torchfl.runtime.parallel.experts import ExpertRun, run_expert_parallel
from torchfl.runtime.parallel.links import Links
from torchfl.runtime.parallel.run import SplitRun, run_split
from torchfl.runtime.parallel.weights import shard_weights

__all__ = ["DataParallelRun", "data_parallel_step", "full_batch_loss", "ExpertRun", "run_expert_parallel", "Links", "SplitRun", "run_split", "shard_weights"]
