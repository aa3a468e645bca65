"""Issue 53 point 1: "Not plannable (N):" counts chips, not the wrapped lines of their errors."""
from torchfl.cli.whatif_cmd.compare import _compare_text
from torchfl.cli.whatif_cmd.serving import decode_text

LONG = ("Plan for X needs 9.00 GiB of device memory at step 12 (matmul), more than its capacity of "
        "1.00 GiB; the largest buffers are listed below so that this line wraps over several lines")


def _failed(chip):
    return {"ok": False, "chip": chip, "version": "1.0.0", "error_kind": "memory", "error": LONG}


def test_compare_counts_chips_not_lines():
    res = {"rows": [_failed("NPU-V3"), _failed("NPU-V2")], "training": False, "planning_s": 1.0}
    text = _compare_text("bert-base", res)
    assert "Not plannable (2):" in text
    assert len(text.splitlines()) > 4          # the errors did wrap: the count is not the line count


def test_decode_counts_chips_not_lines():
    res = {"rows": [_failed("NPU-V3"), _failed("NPU-V2"), _failed("EDGE-C2")], "batch": 1, "prompt": 8,
           "context": 64, "planning_s": 1.0, "assumes": "engine eager, KV cache copied each step"}
    assert "Not plannable (3):" in decode_text("llama-7b", res)
