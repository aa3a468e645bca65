"""The links between emulated chips: ring collectives that move real tensors and count every byte.

A :class:`Links` object is the fabric of one run. Each collective is executed as its algorithm is,
step by step, so the bytes counted per directed link ``(src, dst)`` are the algorithm's traffic,
not a formula's:

* ring all-reduce over a group of p chips: every chip's tensor cut into p chunks; p - 1
  reduce-scatter steps (chip i sends chunk i - k to chip i + 1, which adds it to its own), then
  p - 1 all-gather steps (the completed chunks passed on and copied): each chip sends
  2 (p - 1) / p x the tensor's bytes, and every chip ends with the same sum;
* ring all-gather: each chip's block passed p - 1 times around: (p - 1) / p x the result's bytes;
* all-to-all: every chip's block for each other chip, once (p - 1 blocks a chip);
* point-to-point: the tensor, once.

Every received tensor is a copy (``clone``): no chip ever reads another chip's tensor in place.
The reduction's additions run where the ring runs them (on the receiving chip, in the tensor's
dtype), so the sum's rounding is the ring's order, not a single host sum's.
"""

from __future__ import annotations

from collections import defaultdict

import torch


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def log_seconds(log, ic) -> float:
    """A run's logged collectives (``Links.log``: kind, bytes, chips) priced with the planner's formulas
    (``planner.parallel.collectives``) over the interconnect ``ic``, one after another: what the plan
    charges for exactly the collectives that ran."""
    from torchfl.planner.parallel.collectives import all_gather_s, all_reduce_s, all_to_all_s, p2p_s

    price = {"all_reduce": all_reduce_s, "all_gather": all_gather_s, "all_to_all": all_to_all_s,
             "p2p": lambda n, _p, ic: p2p_s(n, ic)}
    return sum(price[kind](n, p, ic) for kind, n, p in log)


class Counted:
    """What every run result shares (a dataclass with ``links``, a ``Links.report()``, and ``planned``,
    the plan's link bytes per kind): the counted bytes per kind, the check, the priced log."""

    @property
    def counted(self) -> dict:
        return {kind: self.links["by_kind"].get(kind, 0) for kind in self.planned}

    def matches_plan(self) -> bool:
        """Counted bytes per collective kind == the plan's."""
        return self.counted == self.planned

    def link_seconds(self, ic) -> float:
        """The collectives that ran, priced by the plan's formulas over ``ic`` (an HCD's ``interconnect``)."""
        return log_seconds(self.links["log"], ic)


class Links:
    """Directed links between chip indices, each with the bytes it carried, per collective kind."""

    def __init__(self):
        self.bytes: dict = defaultdict(int)              # (src, dst) -> bytes
        self.by_kind: dict = defaultdict(int)            # "all_reduce" | "all_gather" | "p2p" -> bytes
        self.calls: dict = defaultdict(int)              # kind -> collectives run
        self.log: list = []                              # (kind, bytes the collective is priced on, chips)

    def _send(self, kind: str, src: int, dst: int, t: torch.Tensor) -> torch.Tensor:
        n = _nbytes(t)
        self.bytes[(src, dst)] += n
        self.by_kind[kind] += n
        return t.clone()

    def all_reduce(self, chips: list[int], tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """The ring all-reduce (sum) of ``tensors[i]`` held by chip ``chips[i]``: one sum per chip."""
        p = len(chips)
        if p == 1:
            return [tensors[0]]
        self.calls["all_reduce"] += 1
        self.log.append(("all_reduce", _nbytes(tensors[0]), p))
        shape = tensors[0].shape
        parts = [list(t.contiguous().reshape(-1).clone().tensor_split(p)) for t in tensors]
        for k in range(p - 1):                           # reduce-scatter
            moved = [(i, (i - k) % p, self._send("all_reduce", chips[i], chips[(i + 1) % p], parts[i][(i - k) % p]))
                     for i in range(p)]
            for i, c, got in moved:
                j = (i + 1) % p
                parts[j][c] = parts[j][c] + got
        for k in range(p - 1):                           # all-gather of the completed chunks
            moved = [(i, (i + 1 - k) % p, self._send("all_reduce", chips[i], chips[(i + 1) % p],
                                                     parts[i][(i + 1 - k) % p])) for i in range(p)]
            for i, c, got in moved:
                parts[(i + 1) % p][c] = got
        return [torch.cat(chunks).reshape(shape) for chunks in parts]

    def all_gather(self, chips: list[int], tensors: list[torch.Tensor], dim: int = -1) -> list[torch.Tensor]:
        """The ring all-gather of the blocks ``tensors[i]`` (chip ``chips[i]``'s) along ``dim``."""
        p = len(chips)
        if p == 1:
            return [tensors[0]]
        self.calls["all_gather"] += 1
        self.log.append(("all_gather", p * _nbytes(tensors[0]), p))
        held = [{i: tensors[i]} for i in range(p)]
        for k in range(p - 1):
            moved = [(i, (i - k) % p, self._send("all_gather", chips[i], chips[(i + 1) % p], held[i][(i - k) % p]))
                     for i in range(p)]
            for i, b, got in moved:
                held[(i + 1) % p][b] = got
        return [torch.cat([h[b] for b in range(p)], dim=dim) for h in held]

    def all_to_all(self, chips: list[int], blocks: list[list[torch.Tensor]]) -> list[list[torch.Tensor]]:
        """``blocks[i][j]``: what chip ``chips[i]`` sends chip ``chips[j]``; returns ``got[j][i]``. A
        chip's block to itself stays (no link); every other block crosses its link once."""
        p = len(chips)
        if p > 1:
            self.calls["all_to_all"] += 1
            self.log.append(("all_to_all", _nbytes(blocks[0][1]), p))
        return [[blocks[i][j] if i == j else self._send("all_to_all", chips[i], chips[j], blocks[i][j])
                 for i in range(p)] for j in range(p)]

    def send(self, src: int, dst: int, t: torch.Tensor) -> torch.Tensor:
        """Point-to-point: chip ``src``'s tensor, copied to chip ``dst``."""
        return self.exchange([(src, dst)], [t])[0]

    def exchange(self, pairs: list[tuple[int, int]], tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """Concurrent point-to-point sends over distinct links (a pipeline hand-off of every tp rank):
        one step, priced as one send of the largest tensor."""
        self.calls["p2p"] += 1
        self.log.append(("p2p", max(_nbytes(t) for t in tensors), len(pairs)))
        return [self._send("p2p", s, d, t) for (s, d), t in zip(pairs, tensors)]

    def report(self) -> dict:
        """Plain data: bytes per link (``"0->1"``), per kind, collectives run, the total."""
        return {"links": {f"{s}->{d}": n for (s, d), n in sorted(self.bytes.items())},
                "by_kind": dict(self.by_kind), "calls": dict(self.calls), "total": sum(self.bytes.values()),
                "log": list(self.log)}
