"""The confidence of a what-if answer as the commands print it: table cells, the legend under a
table, one sentence (:mod:`torchfl.planner.confidence` computes it; rows carry its ``to_dict()``)."""

from __future__ import annotations

from torchfl.cli.whatif_cmd.common import para, show_time


def confidence_cells(r) -> tuple[str, str]:
    """(assumed, checked) cells of a row's confidence: ``62%!`` (``!``: a number the chip's
    file leaves out priced this time as nothing), ``12% on 84`` (out-of-sample mean error on
    that many rows) or ``no``."""
    c = r.get("confidence") or {}
    if not c:
        return "-", "-"
    assumed = f"{100 * c['assumption_share']:.0f}%" + ("!" if c["missing"] else "")
    if c["state"] == "checked" and c["checked_rows"] and c["out_of_sample_mae"] is not None:
        checked = f"{100 * c['out_of_sample_mae']:.0f}% on {c['checked_rows']}"
    else:
        checked = {"stale": "stale", "unknown": "?"}.get(c["state"], "no")
    return assumed, checked


def confidence_legend(rows) -> list[str]:
    """What the two confidence columns and their marks mean (only what the rows show)."""
    text = ("assumed = share of the time priced from numbers of kind assumption or unstated (HCD "
            "provenance); checked = out-of-sample mean error on that many published rows (no: none)")
    if any((r.get("confidence") or {}).get("missing") for r in rows):
        text += ("; ! = the chip's file leaves out a number this time reads (a launch cost, a sustained fraction; "
                 "--json lists them), priced as nothing")
    if any("rank_time_s" in r for r in rows):
        from torchfl.planner.confidence import RANK_RULE

        marked = ", ".join(f"{r['chip']} as {show_time(r['rank_time_s'])}" for r in rows if "rank_time_s" in r)
        text += f"; {RANK_RULE}: {marked}"
    return para(text)


def confidence_sentence(c: dict) -> str:
    """A row's confidence (its ``to_dict()``) as one sentence."""
    from torchfl.planner.confidence import Confidence

    return Confidence.from_dict(c).line()
