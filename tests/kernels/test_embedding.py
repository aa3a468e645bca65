"""embedding / embedding_backward vs torch and autograd; tilings; counted == predicted."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from torchfl.kernels import ChipModel, DeviceMemory, DeviceTensor, KernelError
from torchfl.kernels.catalog import get
from .test_conv import close, dev, run_checked


@pytest.mark.parametrize("cache", [8 << 20, 300, 40])
@pytest.mark.parametrize("V,D,ishape", [(10, 4, (3, 5)), (1, 1, (1,)), (37, 13, (2, 3, 7)), (5, 3, (0,))])
def test_embedding_forward_backward(V, D, ishape, cache):
    chip = ChipModel(cache_bytes=cache)
    mem = DeviceMemory(chip)
    torch.manual_seed(0)
    w = torch.randn(V, D, requires_grad=True)
    idx = torch.randint(0, V, ishape)
    ref = F.embedding(idx, w)
    (y,), plan = run_checked("embedding", chip, {"weight": dev(w.detach(), mem), "indices": dev(idx, mem)})
    np.testing.assert_array_equal(y.to_numpy(), ref.detach().numpy())
    gy = torch.randn_like(ref)
    ref.backward(gy)
    layout = tuple(reversed(range(len(ishape) + 1)))   # columns outermost: a strided gather
    (gw,), plan = run_checked("embedding_backward", chip,
                              {"grad_out": dev(gy, mem, layout), "indices": dev(idx, mem)}, {"num_weights": V})
    close(gw.to_numpy(), w.grad.numpy(), "float32")


def test_embedding_backward_padding_and_freq():
    chip = ChipModel()
    mem = DeviceMemory(chip)
    idx = torch.tensor([[1, 2, 1, 0], [3, 1, 0, 2]])
    gy = torch.randn(2, 4, 6)
    ref = torch.ops.aten.embedding_dense_backward(gy, idx, 5, 0, True)
    (gw,), _ = run_checked("embedding_backward", chip, {"grad_out": dev(gy, mem), "indices": dev(idx, mem)},
                           {"num_weights": 5, "padding_idx": 0, "scale_grad_by_freq": True})
    close(gw.to_numpy(), ref.numpy(), "float32")


def test_embedding_backward_rmw_when_table_does_not_fit():
    chip = ChipModel(cache_bytes=256)
    mem = DeviceMemory(chip)
    idx = torch.randint(0, 500, (7,))
    gy = torch.randn(7, 3)
    (gw,), plan = run_checked("embedding_backward", chip, {"grad_out": dev(gy, mem), "indices": dev(idx, mem)},
                              {"num_weights": 500})
    assert plan.config.strategy == "read_modify_write"
    close(gw.to_numpy(), torch.ops.aten.embedding_dense_backward(gy, idx, 500, -1, False).numpy(), "float32")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_embedding_half_int32_ids(dtype):
    chip = ChipModel()
    mem = DeviceMemory(chip)
    w = torch.randn(9, 5).to(getattr(torch, dtype))
    idx = torch.randint(0, 9, (4, 3), dtype=torch.int32)
    (y,), _ = run_checked("embedding", chip, {"weight": dev(w, mem), "indices": dev(idx, mem)})
    assert y.dtype == dtype
    np.testing.assert_array_equal(y.to_numpy(), F.embedding(idx.long(), w).float().numpy())


def test_embedding_out_of_range_is_clear():
    chip = ChipModel()
    mem = DeviceMemory(chip)
    w = DeviceTensor.from_torch(torch.randn(4, 2), mem)
    idx = DeviceTensor.from_torch(torch.tensor([[0, 1], [7, 2]]), mem)
    with pytest.raises(KernelError, match=r"index 7 at position \(1, 0\) is out of range for a table of 4"):
        get("embedding").run(chip, {"weight": w, "indices": idx})


def test_embedding_bigger_cache_never_moves_more():
    for name, shapes, attrs in [("embedding", {"weight": (1000, 64), "indices": (8, 128)}, {}),
                                ("embedding_backward", {"grad_out": (8, 128, 64), "indices": (8, 128)},
                                 {"num_weights": 1000})]:
        spec = get(name)
        first = "weight" if name == "embedding" else "grad_out"
        prob = spec.problem(shapes, attrs, None, None, {first: "float32", "indices": "int64"})
        last = None
        for kb in [1, 4, 16, 64, 256, 4096]:
            b = spec.tile(prob, ChipModel(cache_bytes=kb << 10)).traffic.bytes
            assert last is None or b <= last
            last = b
