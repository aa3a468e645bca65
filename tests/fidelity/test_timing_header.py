"""A scored table says how its rows were timed (issue 47 item 4: "event-timed and host-timed
harnesses differ by the launch and sync; say how each is handled"): ``# timing: call`` (the
default: one eager call, its launch in the row) or ``# timing: kernel`` (a profiler's per-kernel
durations, or back-to-back calls: the kernels' device time alone). A kernel-timed row is predicted
without any launch; before, such a table (per-node profiler times of a model, say) was priced with
every kernel's launch added and read as predictions far too slow on small ops."""
from __future__ import annotations

import pytest

from torchfl.fidelity.oneop import predict
from torchfl.fidelity.tables import TableError, parse_table
from torchfl.planner.target import resolve_target
from torchfl.registry import Registry

HEADER = "chip,op,shapes,dtype,args,seconds,source\n"
ROWS = ("A100-SXM4-80GB,softmax,1024x1024,float16,,2.0e-05,s\n"
        "A100-SXM4-80GB,matmul,256x256;256x256,float16,,2.0e-05,s\n")


@pytest.fixture(scope="module")
def a100(tmp_path_factory):
    reg = Registry(f"sqlite:///{tmp_path_factory.mktemp('reg')}/r.db")
    reg.init(seed=True)
    yield resolve_target("A100-SXM4-80GB", reg)
    reg.close()


def test_a_kernel_timed_row_is_predicted_without_its_launch(a100):
    call = parse_table("# timing: call (host-timed)\n" + HEADER + ROWS, "call.csv")
    kernel = parse_table("# timing: kernel (torch.profiler per-kernel durations)\n" + HEADER + ROWS, "k.csv")
    plain = parse_table(HEADER + ROWS, "plain.csv")
    assert (call.timing, kernel.timing, plain.timing) == ("call", "kernel", None)
    assert {r.timing for r in kernel.rows} == {"kernel"} and {r.timing for r in plain.rows} == {"call"}
    ex = a100.hcd.execution
    for c, k, p, launch_us in zip(call.rows, kernel.rows, plain.rows,
                                  (ex.launch_overhead_us, ex.matrix_launch_overhead_us)):
        pc, pk, pp = predict(c, a100), predict(k, a100), predict(p, a100)
        assert pc.predicted_s == pp.predicted_s                       # call is the default
        assert pc.predicted_s - pk.predicted_s == pytest.approx(launch_us * 1e-6, rel=1e-9), c.label()
        assert 0 < pk.predicted_s and any("launches (the table times kernels alone)" in n for n in pk.notes)


def test_a_timing_word_other_than_call_or_kernel_is_refused_where_it_stands():
    with pytest.raises(TableError, match=r"t.csv:2: timing: write '# timing: call'"):
        parse_table("# source: x\n# timing: events\n" + HEADER + ROWS, "t.csv")
