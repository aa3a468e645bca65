"""Issue 48, 3b: ``max_batch_size`` is the model's batch, not the first dimension of every
tensor an eager op sees. GPT-J and CodeGen look their rotary sin/cos up in a buffer of
``n_positions`` rows (2048 by default): ``embed_positions[position_ids]`` on NPU-V3 (max_batch_size
512) was refused, ``Batch size 2048 of input arg0_1 exceeds max_batch_size 512``, where the
compile path (which lifts the buffer as a weight) runs it. The table a lookup reads (index,
embedding, index_select) carries no batch: the indices do. An activation of 600 rows is still
refused (tests/eager/test_training.py)."""
import pytest
import torch


class Table(torch.nn.Module):
    def __init__(self, rows=2048, dim=8):
        super().__init__()
        self.table = torch.nn.Buffer(torch.randn(rows, dim), persistent=False)

    def forward(self, pos):
        sincos = self.table[pos]                          # GPT-J's _get_embed_positions
        rows = torch.index_select(self.table, 0, pos[0])
        emb = torch.nn.functional.embedding(pos, self.table)
        return sincos * 2 + emb, rows


@pytest.mark.parametrize("lazy", [False, True], ids=["eager", "lazy"])
def test_a_lookup_table_longer_than_max_batch_size_is_no_batch(fp16_dev, lazy):
    torch.manual_seed(0)
    m = Table()
    pos = torch.arange(16).view(1, 16).repeat(2, 1) * 100
    ref = m(pos)
    npu = Table().half().to(fp16_dev)
    npu.table.copy_(m.table.half().to(fp16_dev))
    if lazy:
        with torch.npu.lazy():
            got = npu(pos.to(fp16_dev))
    else:
        got = npu(pos.to(fp16_dev))
    for g, r in zip(got, ref):
        torch.testing.assert_close(g.cpu().float(), r, rtol=2e-3, atol=2e-3)


def test_an_activation_above_max_batch_size_is_still_refused(fp16_dev):
    from torchfl.planner.errors import HardConstraintError

    with pytest.raises(HardConstraintError, match="max_batch_size 512"):
        torch.relu(torch.randn(600, 4).half().to(fp16_dev))
