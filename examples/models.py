"""Two small models for the README's `torchfl plan` examples (MODEL is `path/to/file.py:factory`:
a function returning the module and its example inputs)."""
import torch


def conv():
    """A conv -> relu -> conv block in NCHW, 1x16x32x32."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(),
                              torch.nn.Conv2d(32, 16, 3, padding=1)).eval()
    return net, (torch.randn(1, 16, 32, 32),)


class _Attention(torch.nn.Module):
    def __init__(self, dim=256, heads=16):
        super().__init__()
        self.mha = torch.nn.MultiheadAttention(dim, heads, batch_first=True)

    def forward(self, x):
        return self.mha(x, x, x, need_weights=False)[0]


def attention():
    """One 16-head self-attention (256 wide) over 64 tokens."""
    torch.manual_seed(0)
    return _Attention().eval(), (torch.randn(1, 64, 256),)
