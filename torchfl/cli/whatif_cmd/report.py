"""``torchfl plan report``: one self-contained HTML page of a model's plans."""

from __future__ import annotations

import click

from torchfl.cli.whatif_cmd.common import (check_batch, chip_names, fail, guarded, load, model_options, output_path,
                                            precision_of, write_report)
from torchfl.hcd.dtypes import PRECISION_CHOICES


@click.command("report")
@click.argument("model")
@click.option("--chip", default=None, help="The chip whose plan the page shows (default: the fastest of --chips).")
@click.option("--chips", default=None, help="Comma-separated chips to compare on the page ('all': the registry's).")
@click.option("-o", "--output", "output", required=True, type=click.Path(dir_okay=False),
              help="The HTML file to write (self-contained: no network).")
@model_options
@click.option("--precision", type=click.Choice(PRECISION_CHOICES), default="auto", show_default=True,
              help="Precision policy; auto: none on chips with an fp32 unit, else float16 (or bfloat16).")
@click.option("--registry", default=None, help="Registry URL (default: TORCHFL_REGISTRY_URL or the user's).")
@guarded
def report(model, chip, chips, output, batch, seq_len, heads, layers, precision, registry):
    """One self-contained HTML page: the plan as a graph coloured by kernel family and
    fallback, a roofline of its steps, the memory timeline with the peak, the explain table;
    with --chips, the chips side by side too."""
    from torchfl.planner import whatif
    from torchfl.planner.report import ReportError, render_report

    if not chip and not chips:
        fail("Error", "give --chip NAME (one plan) or --chips A,B,... (a comparison; 'all' for every chip)", code=2)
    out_path = output_path(output)   # before minutes of planning, not after
    names = chip_names(None if chips == "all" else chips, registry) if chips else []
    if chip and chip not in names:
        names = [chip] + names
    targets = [whatif.chip_of(n, registry) for n in names]
    check_batch(batch, targets, seq_len)
    module, inputs = load(model, batch, seq_len, heads, layers)
    results = whatif.plan_everywhere(module, inputs, targets, precision_of(precision))
    by_name = {t.name: t for t in targets}
    comparison = None
    if chips:
        from torchfl.planner.confidence import RANK_RULE, fidelity_evidence
        from torchfl.planner.whatif.compare import ranked_by_rule

        evidence = fidelity_evidence(registry, list(by_name))
        rows = [whatif.row(p, by_name[p.chip], evidence) for p in results]
        ranked_by_rule(rows, results, targets)
        whatif.rank_compare_rows(rows)          # the order plan compare shows, the rank rule included
        comparison = {"rows": rows, "rank_rule": RANK_RULE}
    shown = next((p for p in results if p.chip == chip), None) if chip else \
        next((p for p in results if p.chip == comparison["rows"][0]["chip"]), None)
    if shown is None or not shown.ok:
        err = shown.error if shown is not None else None
        fail(getattr(err, "kind", "Error"), f"no plan of {model} on {chip or 'any chip'} to show: {err}")
    try:
        page = render_report(shown.plan, by_name[shown.chip].model, f"{model} on {shown.chip}", comparison)
    except ReportError as exc:
        fail("Error", str(exc))
    write_report(out_path, page)
    click.echo(f"wrote {output} ({len(page) / 1024:.0f} KiB): {model} on {shown.chip}"
               + (f", {len(comparison['rows'])} chips compared" if comparison else ""))
