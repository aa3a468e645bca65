"""Training on the npu eager device as the article walks it: autocast float16 + GradScaler.

    python tools/bench_train.py [--steps 100] [--models resnet,bert] [--chip TFL-X1] [--json]

Two models, built from fixed seeds: a small ResNet (BasicBlock x [1,1,1,1], width 16, 10 classes,
32x32 images, batch 16, SGD lr 0.005 momentum 0.9, batch-norm in training mode) and one BERT encoder
layer (``transformers.BertLayer``, hidden 64, 4 heads, sequence 16, batch 8, mean-pooled into
a 4-class head, AdamW; dropout 0 so that both runs see the same network: the device draws
its masks from its own generator). Each trains ``--steps`` steps on a fixed set of 4 batches
(cycled) twice, with the same code:

- on ``npu:0`` (the chip ``--chip``): ``torch.autocast("npu", dtype=torch.float16)`` and
  ``torch.amp.GradScaler("npu")``, float32 master weights on the chip;
- on the CPU: ``torch.autocast("cpu", dtype=torch.float16)`` and ``GradScaler("cpu")``
  (the same casts; products in float16 with float32 accumulation).

Reported per model: both loss curves' first and last values, the largest gap
``|npu_t - cpu_t| / cpu_0`` over all steps (``max_gap``: in units of the initial loss, so that
a loss near zero at the end does not inflate it) and over the last 10 (``end_gap``), the
same gap between CPU with autocast and CPU in float32 (``amp_floor``: how far float16
rounding alone moves this training on one machine),
whether the npu loss fell by the same factor as CPU's, steps skipped by the scaler (inf/NaN
gradients), wall time per step on each, and the gradient dtype (float32: gradients of the
float32 master weights accumulate in float32; the chip's float16 kernels accumulate their
products in float32, as the plan's steps say).

Tolerance (``TOLERANCE``): 5e-2 of the initial loss on every step. Both runs round to
float16 at nearly the same points, but the chip's kernels sum in another order than CPU's
(tiles), and the npu policy keeps batch-norm in float32 where CPU autocast runs it in
float16, so each step's float16 results differ by an ulp here and there (2^-11 = 4.9e-4
relative); training feeds those differences back into the weights, where they grow with the
steps. ``amp_floor`` measures that growth for float16 rounding itself (CPU autocast against
CPU float32, 1.4e-2 for the ResNet over 100 steps, BENCHMARKS.md); the npu curve may sit
that far from CPU's autocast curve, and the tolerance leaves it 3.5x. A fault (a wrong
kernel, a lost gradient, a scaler that skips every step) moves the curve by far more: the
loss falls by more than half in these 100 steps. The configurations were chosen where
training is not chaotic (at 16x16 images, batch 8, lr 0.02 the two CPU runs alone end 50 %
apart).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("NUMBA_CACHE_DIR", os.path.join(os.path.dirname(__file__), "..", ".cache", "numba"))

TOLERANCE = 5e-2
# GradScaler's default 2**16 overflows float16 gradients in the first steps, and which steps
# overflow depends on rounding the two runs do not share (CPU autocast keeps batch-norm in
# float16, the npu policy computes it in float32): a skipped step on one side only would
# shift one curve by a whole step. 2**10 overflows on neither (both skip counts reported).
INIT_SCALE = 2.0 ** 10
MODELS = ("resnet", "bert")


def _resnet():
    import torch

    from torchfl.planner.zoo import _resnet_classes

    basic, _bottleneck, resnet = _resnet_classes()
    torch.manual_seed(0)
    model = resnet(basic, [1, 1, 1, 1], num_classes=10, width=16)
    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(16, 3, 32, 32, generator=g), torch.randint(0, 10, (16,), generator=g)) for _ in range(4)]
    return model, data, "sgd"


def _bert():
    import torch
    import transformers as tr

    class BertClassifier(torch.nn.Module):
        def __init__(self):
            super().__init__()
            cfg = tr.BertConfig(hidden_size=64, num_attention_heads=4, intermediate_size=128,
                                hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                                attn_implementation="sdpa")
            self.layer = tr.models.bert.modeling_bert.BertLayer(cfg)
            self.head = torch.nn.Linear(64, 4)

        def forward(self, x):
            out = self.layer(x)
            h = out[0] if isinstance(out, tuple) else out
            return self.head(h.mean(1))

    torch.manual_seed(0)
    model = BertClassifier()
    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(8, 16, 64, generator=g), torch.randint(0, 4, (8,), generator=g)) for _ in range(4)]
    return model, data, "adamw"


BUILD = {"resnet": _resnet, "bert": _bert}


def train(name, device, steps, amp=True):
    """Train model ``name`` on ``device`` (``"cpu"`` or ``"npu:0"``) with autocast float16 and
    GradScaler (``amp``, else float32); returns (losses, skipped steps, seconds per step,
    gradient dtypes)."""
    import torch

    model, data, opt_name = BUILD[name]()
    model = model.to(device).train()
    data = [(x.to(device), y.to(device)) for x, y in data]
    if opt_name == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=0.005, momentum=0.9)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    kind = torch.device(device).type
    scaler = torch.amp.GradScaler(kind, init_scale=INIT_SCALE, enabled=amp)
    losses, skipped = [], 0
    t0 = time.perf_counter()
    for step in range(steps):
        x, y = data[step % len(data)]
        opt.zero_grad(set_to_none=True)
        with torch.autocast(kind, dtype=torch.float16, enabled=amp):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scale = scaler.get_scale()
        scaler.step(opt)
        scaler.update()
        skipped += scaler.get_scale() < scale
        losses.append(loss.item())
    per_step = (time.perf_counter() - t0) / max(steps, 1)
    grad_dtypes = sorted({str(p.grad.dtype) for p in model.parameters() if p.grad is not None})
    return losses, skipped, per_step, grad_dtypes


def compare(name, steps, device="npu:0"):
    npu, skipped, npu_s, gdt = train(name, device, steps)
    cpu, cpu_skipped, cpu_s, _ = train(name, "cpu", steps)
    cpu32, _s, _t, _g = train(name, "cpu", steps, amp=False)
    unit = max(abs(cpu[0]), 1e-6)
    gaps = [abs(a - b) / unit for a, b in zip(npu, cpu)]
    floor = [abs(a - b) / unit for a, b in zip(cpu, cpu32)]
    return {"model": name, "steps": steps, "npu_first": npu[0], "npu_last": npu[-1], "cpu_first": cpu[0],
            "cpu_last": cpu[-1], "cpu32_last": cpu32[-1], "max_gap": max(gaps), "end_gap": max(gaps[-10:]),
            "amp_floor": max(floor), "within_tolerance": max(gaps) <= TOLERANCE, "tolerance": TOLERANCE,
            "npu_skipped": int(skipped), "cpu_skipped": int(cpu_skipped), "npu_s_per_step": round(npu_s, 4),
            "cpu_s_per_step": round(cpu_s, 4), "grad_dtypes": gdt, "npu_losses": npu, "cpu_losses": cpu}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma-separated subset of {', '.join(MODELS)}")
    ap.add_argument("--chip", default="TFL-X1", help="the chip npu:0 is (needs float32 and float16 units for "
                                                    "float32 master weights under autocast float16)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    models = a.models.split(",")
    bad = [m for m in models if m not in MODELS]
    if bad:
        ap.error(f"unknown model {', '.join(bad)}; choose from {', '.join(MODELS)}")
    os.environ["TORCHFL_DEVICES"] = a.chip
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.getLogger("torchfl").setLevel(logging.ERROR)
    from torchfl.runtime import eager

    eager.register()
    eager.ensure_adapter()
    results = [compare(m, a.steps) for m in models]
    load = os.getloadavg()
    if a.json:
        print(json.dumps({"chip": a.chip, "results": results, "loadavg": load}, indent=1))
    else:
        for r in results:
            print(f"{r['model']:7s} {a.chip} {r['steps']} steps: loss npu {r['npu_first']:.4f} -> {r['npu_last']:.4f}, "
                  f"cpu {r['cpu_first']:.4f} -> {r['cpu_last']:.4f}; max gap {r['max_gap']:.2e} of the first "
                  f"loss (last 10: {r['end_gap']:.2e}, tolerance {r['tolerance']:.0e}, amp floor "
                  f"{r['amp_floor']:.2e})"
                  f"{'' if r['within_tolerance'] else ' (!)'}; skipped npu {r['npu_skipped']} cpu "
                  f"{r['cpu_skipped']}; grads {','.join(r['grad_dtypes'])}; "
                  f"{r['npu_s_per_step'] * 1e3:.0f} ms/step npu, {r['cpu_s_per_step'] * 1e3:.0f} ms/step cpu")
        print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    return 0 if all(r["within_tolerance"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
