"""The ops real models need beyond the core path (issue 17 item 1) run strict on NPU-V3 fp16
through torch.compile: the padding-mask lookup (index.Tensor on a bool mask), position ids
(cumsum, gather), ALiBi's float * int64 positions, TF padding in a non-default layout,
Swin's index_select / as_strided / squeeze.dims, Wav2Vec2's 1-D and grouped convolutions
and group norm. Real planner, real kernels, compared with eager."""
import torch
import torch.nn.functional as F

from tests.runtime.models import rel_err

V3 = {"chip": "NPU-V3", "precision": "float16", "strict": True}


class MaskAndPositions(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(32, 8))
        self.register_buffer("slopes", torch.tensor([0.5, 0.25]))

    def forward(self, x, mask):
        b = torch.arange(mask.shape[0]).view(-1, 1, 1, 1)
        kv = torch.arange(mask.shape[1]).view(1, 1, 1, -1)
        pad = mask.bool()[b, kv]                                   # (B, 1, 1, L) bool
        pos = torch.cumsum(mask, dim=1) * mask - 1                  # RoBERTa/OPT position ids
        alibi = self.slopes[:, None] * pos[:, None, :]              # float * int64 (BLOOM)
        emb = self.table.index_select(0, pos.clamp(min=0).view(-1)).view(*pos.shape, 8)
        g = torch.gather(x, 1, pos.clamp(min=0)[..., None].expand(-1, -1, x.shape[-1]))
        return (emb + g).masked_fill(~pad[:, 0, 0, :, None], 0.0).sum(-1) + alibi.sum(1)


class AudioAndVision(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = torch.nn.Conv1d(1, 8, 10, stride=5)
        self.gn = torch.nn.GroupNorm(8, 8)
        self.c2 = torch.nn.Conv1d(8, 8, 4, padding=2, groups=4)
        self.dw = torch.nn.Conv2d(8, 8, 3, groups=8)

    def forward(self, wave):
        h = self.c2(F.gelu(self.gn(self.c1(wave[:, None]))))        # (B, 8, L)
        img = F.pad(h[..., :16].reshape(-1, 8, 4, 4), (0, 1, 0, 1))  # TF-style asymmetric padding
        img = self.dw(img)
        flat = torch.as_strided(img.mean((2, 3), keepdim=True), (img.shape[0], 8, 1, 1), (8, 1, 8, 8))
        return flat.squeeze((-2, -1))


def _check(model, *args):
    from torchfl.runtime.backend import recording

    model.eval()
    with torch.no_grad():
        ref = model(*args)
        with recording() as r:
            out = torch.compile(model, backend="torchfl", options=V3)(*args)
    assert sum(len(p.fallbacks) for _cg, p, _ in r.entries) == 0
    assert rel_err(out.float(), ref.float()) < 1e-2


def test_mask_and_position_ops_run_on_chip():
    torch.manual_seed(0)
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, 9:] = 0
    _check(MaskAndPositions(), torch.randn(2, 12, 8), mask)


def test_audio_and_vision_ops_run_on_chip():
    torch.manual_seed(0)
    _check(AudioAndVision(), torch.randn(2, 200))


class FusedQKV(torch.nn.Module):
    """BLOOM's attention input: a fused q/k/v projection viewed 5-D, each part selected out
    (select.int on dim 3) and transposed to (B, heads, L, D). The plan once applied the 4-D
    transpose to the 5-D one-wide slice (select kept its dim on the chip: ``KernelError:
    layout_transform: layout [0, 2, 1, 3] is not a permutation of 5 axes``)."""

    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(16, 48)

    def forward(self, x):
        b, l, _ = x.shape
        f = self.qkv(x).view(b, l, 4, 3, 4)
        q, k = f[..., 0, :].transpose(1, 2), f[..., 1, :].transpose(1, 2)
        return q @ k.transpose(-1, -2)


def test_bloom_fused_qkv_select_then_transpose_regression():
    torch.manual_seed(0)
    _check(FusedQKV(), torch.randn(2, 6, 16))
