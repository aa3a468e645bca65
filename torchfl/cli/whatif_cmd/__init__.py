"""``torchfl plan memory|max-batch|max-context|decode|compare|impact|report``: what-if planning, a thin face.

The answers come from :mod:`torchfl.planner.whatif` (and :mod:`torchfl.planner.report`);
this module loads the model, formats text or ``--json`` and turns a user's mistake into one
``Kind: message`` line on stderr with exit code 1. torch is imported inside the commands.

One module per question (``memory``, ``limits``: max-batch and max-context, ``compare``,
``serving``: decode, ``impact``, ``report``), over ``common`` (options, failures, output).
"""

from torchfl.cli.whatif_cmd.compare import compare
from torchfl.cli.whatif_cmd.common import impact_status
from torchfl.cli.whatif_cmd.impact import impact
from torchfl.cli.whatif_cmd.limits import max_batch, max_context
from torchfl.cli.whatif_cmd.memory import memory
from torchfl.cli.whatif_cmd.report import report
from torchfl.cli.whatif_cmd.serving import decode

__all__ = ["COMMANDS", "impact_status"]

COMMANDS = [memory, max_batch, max_context, decode, compare, impact, report]
