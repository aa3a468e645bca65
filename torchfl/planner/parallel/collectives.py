"""Collectives priced from an HCD's ``interconnect`` (ring algorithms, one fabric domain).

Why rings: NCCL, RCCL and HCCL run ring all-reduce on one node for the message sizes of a decode
step, and their own tuning model (NCCL ``src/graph/tuning.cc``) is this formula with a per-call
base latency and a per-step latency. NVLink SHARP / in-switch reduction and tree algorithms are
not modelled (a stated simplification: they make large all-reduces faster, not small ones).
"""

from __future__ import annotations


def _terms(ic) -> tuple[float, float, float]:
    """(bus bytes/s, seconds per ring step, seconds per call) of an Interconnect."""
    return ic.bus_bytes_per_s, (ic.latency_us or 0.0) * 1e-6, (ic.collective_overhead_us or 0.0) * 1e-6


def all_reduce_sent(nbytes: int, chips: int) -> float:
    """Bytes each chip sends in one ring all-reduce of ``nbytes``: 2 (p - 1) / p x nbytes (p - 1
    reduce-scatter steps then p - 1 all-gather steps, each one nbytes / p chunk). The one formula
    the pricing here and the emulated execution's check (``runtime/parallel``) share."""
    return 0.0 if chips <= 1 or nbytes <= 0 else 2 * (chips - 1) / chips * nbytes


def all_gather_sent(nbytes: int, chips: int) -> float:
    """Bytes each chip sends in one ring all-gather whose result is ``nbytes``: (p - 1) / p x nbytes."""
    return 0.0 if chips <= 1 or nbytes <= 0 else (chips - 1) / chips * nbytes


def all_to_all_sent(block: int, chips: int) -> float:
    """Bytes each chip sends in one all-to-all of ``block`` bytes to every other chip: (p - 1) x block."""
    return 0.0 if chips <= 1 or block <= 0 else (chips - 1) * block


def all_reduce_s(nbytes: int, chips: int, ic) -> float:
    """Seconds of one ring all-reduce of ``nbytes`` (the tensor each chip holds) over ``chips``:

        t = collective_overhead + 2 (p - 1) x latency + 2 (p - 1) / p x nbytes / busbw

    with p = ``chips`` and busbw = links.count x links.bandwidth_gb_per_s x sustained_fraction
    (the bus bandwidth nccl-tests reports, so its 2 (p - 1) / p factor is the algorithm's). A
    reduce-scatter then an all-gather: 2 (p - 1) steps, each moving nbytes / p per chip. 0 on one chip."""
    if chips <= 1 or nbytes <= 0:
        return 0.0
    bus, step, call = _terms(ic)
    return call + 2 * (chips - 1) * step + all_reduce_sent(nbytes, chips) / bus


def all_gather_s(nbytes: int, chips: int, ic) -> float:
    """Seconds of one ring all-gather whose result is ``nbytes`` per chip (each chip contributes
    nbytes / p): overhead + (p - 1) x latency + (p - 1) / p x nbytes / busbw. 0 on one chip."""
    if chips <= 1 or nbytes <= 0:
        return 0.0
    bus, step, call = _terms(ic)
    return call + (chips - 1) * step + all_gather_sent(nbytes, chips) / bus


def p2p_s(nbytes: int, ic) -> float:
    """Seconds of one point-to-point send of ``nbytes`` to a peer (a pipeline hand-off): overhead +
    one step's latency + nbytes over one link's sustained rate per direction (a send to one peer
    uses the links that reach it: one on a full mesh, all of them through a switch)."""
    if nbytes <= 0:
        return 0.0
    _bus, step, call = _terms(ic)
    share = 1.0 if ic.sustained_fraction is None else float(ic.sustained_fraction)
    links = ic.links.count if ic.fabric in ("nvswitch", "pcie") else 1
    return call + step + nbytes / (links * ic.links.bandwidth_gb_per_s * 1e9 * share)


def all_to_all_s(block: int, chips: int, ic) -> float:
    """Seconds of one all-to-all where every chip sends ``block`` bytes to each of the others: overhead +
    (p - 1) x latency + (p - 1) x block over the bus bandwidth (pairwise exchange, p - 1 rounds, each
    chip sending and receiving one block a round). 0 on one chip."""
    if chips <= 1 or block <= 0:
        return 0.0
    bus, step, call = _terms(ic)
    return call + (chips - 1) * step + all_to_all_sent(block, chips) / bus
