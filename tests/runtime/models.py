"""Small real models for the runtime tests (shapes kept small: CI has 2 cores)."""
import torch
from torch import nn


class SmallCNN(nn.Module):
    """conv-bn-relu, a residual conv block, pooling and a classifier: the ResNet vocabulary."""

    def __init__(self, c=8, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(c, classes)

    def forward(self, x):
        x = torch.relu(self.bn1(self.conv1(x)))
        x = torch.relu(self.bn2(self.conv2(x)) + x)
        return self.fc(self.pool(x).flatten(1))


class WithErfinv(nn.Module):
    """A linear layer then ``erfinv``: an op no rule pack maps, so it must fall back."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        return torch.special.erfinv(torch.tanh(self.fc(x)) * 0.5)


class TwoGraphs(nn.Module):
    """A forced graph break: Dynamo hands the backend two graphs."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(16, 32)
        self.b = nn.Linear(32, 8)

    def forward(self, x):
        x = torch.relu(self.a(x))
        torch._dynamo.graph_break()
        return self.b(x)


def seeded(factory, *args, **kw):
    torch.manual_seed(0)
    m = factory(*args, **kw)
    with torch.no_grad():   # non-trivial batch-norm statistics
        for mod in m.modules():
            if isinstance(mod, nn.BatchNorm2d):
                mod.running_mean.uniform_(-0.2, 0.2)
                mod.running_var.uniform_(0.5, 1.5)
                mod.weight.uniform_(0.5, 1.5)
                mod.bias.uniform_(-0.2, 0.2)
    return m.eval()


def rel_err(y, ref) -> float:
    """max |y - ref| / max |ref|: the tolerance measure of every end-to-end test."""
    y, ref = y.detach().float(), ref.detach().float()
    return float((y - ref).abs().max() / ref.abs().max().clamp_min(1e-12))
