"""The HTML report (issue 36): every figure has its numbers beside it as an HTML table, the
"chips side by side" charts' labels do not overlap, the memory timeline's peak label sits above
the bars, and the page prints (print CSS)."""
from __future__ import annotations

import html
import re

import pytest

pytest.importorskip("matplotlib")

from torchfl.planner import whatif  # noqa: E402
from torchfl.planner.report import compare_fig, memory_fig, memory_series, render_report  # noqa: E402
from torchfl.planner.texttable import human_time  # noqa: E402
from torchfl.planner.zoo import load_model  # noqa: E402


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    from torchfl.registry import Registry

    url = f"sqlite:///{tmp_path_factory.mktemp('report') / 'reg.sqlite3'}"
    Registry(url).init(seed=True)
    module, inputs = load_model("resnet18", image=32)
    targets = [whatif.chip_of(n, url) for n in ("NPU-V3", "EDGE-C2", "TFL-X1", "DSP-M4")]
    results = whatif.plan_everywhere(module, inputs, targets, "auto")
    rows = [whatif.row(p, t) for p, t in zip(results, targets)]
    return results[0].plan, targets[0].model, rows


def _overlap(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def test_chips_side_by_side_labels_do_not_overlap(planned):
    _plan, _chip, rows = planned
    fig = compare_fig(rows)
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    texts = [t for ax in fig.axes for t in (ax.title, ax.xaxis.label, *ax.get_xticklabels(), *ax.get_yticklabels())
             if t.get_text()]
    boxes = [(t.get_text(), t.get_window_extent(r)) for t in texts]
    clashes = [(a, b) for i, (a, ba) in enumerate(boxes) for b, bb in boxes[i + 1:] if _overlap(ba, bb)]
    assert not clashes, clashes


def test_memory_peak_label_is_above_the_bars(planned):
    plan, _chip, _rows = planned
    fig = memory_fig(plan)
    fig.canvas.draw()
    (ax,) = [a for a in fig.axes if a.get_ylabel()]
    label = next(t for t in ax.texts if t.get_text().startswith("peak"))
    box = label.get_window_extent(fig.canvas.get_renderer()).transformed(ax.transData.inverted())
    steps, series = memory_series(plan)
    top = [sum(v[i] for v in series.values()) / (1 << 20) for i in range(len(steps))]
    under = [top[i] for i, s in enumerate(steps) if box.x0 - 1 <= s <= box.x1 + 1]
    assert box.y0 >= max(under) - 1e-9, (box, max(under))
    assert box.y1 <= ax.get_ylim()[1]


def test_page_has_the_numbers_as_tables(planned):
    plan, chip, rows = planned
    page = render_report(plan, chip, "resnet18 on NPU-V3", {"rows": rows})
    for table_id in ("tab-compare", "tab-families", "tab-roofline", "tab-memory", "tab-buffers"):
        assert f'id="{table_id}"' in page, table_id
    compare = page[page.index('id="tab-compare"'):]
    compare = compare[:compare.index("</table>")]
    for r in rows:
        assert human_time(r["per_call_time_s"]) in compare and human_time(r["run_once_time_s"]) in compare
    assert f"{plan.memory.peak_bytes:,}" in page
    assert "@media print" in page
    # the explain text in the page: no word broken across lines (the "weight_s/tationar/y")
    pre = html.unescape(page[page.index("<pre>") + 5:page.index("</pre>")])
    assert not re.search(r"weight_s\s+tationar", pre) and all(len(x) <= 100 for x in pre.splitlines())
