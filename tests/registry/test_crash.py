"""SIGKILL in the middle of a multi-file import: the registry holds all of it or none of it.

The child reports when its write transaction begins; the parent kills it at a random
moment from then until a little after the time a whole write takes (measured first), so
the kills land inside the transaction, around its commit, and just after it.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import signal
import time

from tests.registry.registry_gen import many

from torchfl.registry import Registry

TRIALS = 20
FILES = 60


def _child(url: str, items, conn) -> None:
    def progress(stage, done, total):
        if stage == "writing" and done == 0:
            conn.send(("writing", time.monotonic()))

    with Registry(url) as r:
        r.schema_revision()
        conn.send(("ready", time.monotonic()))
        r.import_texts(items, progress=progress)
        conn.send(("done", time.monotonic()))
    conn.close()


def _start(ctx, url, items):
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_child, args=(url, items, child))
    proc.start()
    child.close()
    return proc, parent


def _count(url: str, prefix: str) -> int:
    with Registry(url) as r:
        assert r.integrity_check() == "ok"
        return sum(1 for c in r.chips() if c.name.startswith(prefix + "-"))


def test_sigkill_mid_import_is_all_or_nothing(registry_url):
    with Registry(registry_url) as r:
        r.init()
    ctx = mp.get_context("fork")
    # calibrate: how long one write transaction of FILES chips takes here
    proc, pipe = _start(ctx, registry_url, many("CAL", FILES))
    events = dict(pipe.recv() for _ in range(3))
    proc.join(60)
    write_time = events["done"] - events["writing"]
    assert proc.exitcode == 0 and _count(registry_url, "CAL") == FILES

    rng = random.Random(1234)
    outcomes = []
    for trial in range(TRIALS):
        prefix = f"K{trial:02d}"
        proc, pipe = _start(ctx, registry_url, many(prefix, FILES))
        assert pipe.recv()[0] == "ready"
        assert pipe.poll(60) and pipe.recv()[0] == "writing"
        time.sleep(rng.uniform(0, 1.3 * write_time))
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(60)
        landed = _count(registry_url, prefix)
        assert landed in (0, FILES), f"trial {trial}: {landed} of {FILES} chips landed: a torn import"
        outcomes.append(landed == FILES)
    # the registry still works after all that, and holds exactly the whole imports
    with Registry(registry_url) as r:
        r.import_texts(many("AFTER", 3))
        total = len(r.chips())
    assert total == FILES * (1 + sum(outcomes)) + 3
    print(f"{registry_url.split(':')[0]}: {sum(outcomes)} of {TRIALS} kills after commit, "
          f"{TRIALS - sum(outcomes)} before; write {write_time * 1000:.0f} ms")
