"""Child processes that end with the process they serve, however that ends.

Issue 39: kill -9 or SIGTERM of ``torchfl conformance --jobs N`` left its spawn workers (~500 MB
each) and multiprocessing's resource tracker running indefinitely, and a first call's compile
helpers (:mod:`torchfl.kernels.precompile`) compiled on for nobody. Here, the lowest layer that
starts such a child, one guard serves them all (conformance, ``kernels warmup``, the cluster's
local workers, the compile helpers)."""
from __future__ import annotations

import os

_PR_SET_PDEATHSIG = 1
WATCH_S = 1.0


def die_with_parent(parent: int | None) -> None:
    """Call first thing in a child: the kernel kills it when the thread that spawned it ends
    (``PR_SET_PDEATHSIG``, Linux), and a watch thread ends it when it is orphaned elsewhere
    (it sees a new parent pid; ``parent`` None: the kernel's signal alone)."""
    import ctypes
    import signal
    import threading
    import time

    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):   # no prctl (not Linux): the watch thread alone
        pass
    if parent is None:
        return
    if os.getppid() != parent:          # the parent died before prctl took effect
        os._exit(1)

    def watch():
        while os.getppid() == parent:
            time.sleep(WATCH_S)
        os._exit(1)

    threading.Thread(target=watch, name="torchfl-parent-watch", daemon=True).start()
