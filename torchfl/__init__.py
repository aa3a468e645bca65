"""torchfl: standard PyTorch on any AI chip described by one declarative HCD file.

Importing the package is cheap: torch and numba are loaded only by the layers that
execute or capture graphs (planner, runtime, kernels' compiled modules).
"""

from torchfl import import_noise
from torchfl.version import __version__

import_noise.install()   # drops two known torchao import messages, nothing else (see import_noise)

__all__ = ["__version__", "explain"]


def explain(model, *inputs, **options):
    """Return the plan of ``model`` on a chip as text (see ``torchfl.runtime.explain``)."""
    from torchfl.runtime.explain import explain as _explain

    return _explain(model, *inputs, **options)
