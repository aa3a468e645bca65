#!/usr/bin/env python
"""Kernel speed against PyTorch, side by side in one run (never a timed test).

Each case runs the torchfl kernel through the catalog (``spec.run`` with the plan made
for the reference chip: 8 MiB cache, every dtype) and the torch op on the same inputs,
alternating, after a warm-up; medians of ``--runs`` (>= 5). ``ratio`` = torch_s /
torchfl_s (higher is better); ``gflops`` is torchfl's rate; GEMM cases also report the
fraction of the machine's fp32 peak (tools/peak.py). ``first_call_s`` is the first call
(JIT compile, or a load from NUMBA_CACHE_DIR; ``--cold`` uses an empty cache directory).
Cases whose kernel is not in the catalog are skipped with a note on stderr.

    python tools/bench_kernels.py --json [--runs 7] [--cases gemm_f32_1024,softmax_f32] [--cold]
    python tools/bench_kernels.py --json --threads 1 --timer cpu --no-peak   # on a shared machine
    python tools/bench_kernels.py --threads 1 --timer cpu --no-peak --cases 'decode*'   # decode shapes
    python tools/bench_kernels.py --moe --threads 1 --timer cpu     # grouped GEMM vs one GEMM per expert
    python tools/bench_kernels.py --scan --threads 1 --timer cpu --runs 5   # Mamba's scan kernel vs its loop
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _setup_cache(cold):
    """``--cold``: an empty kernel cache; else the one every entry point shares (jitcache)."""
    if cold:
        os.environ["NUMBA_CACHE_DIR"] = tempfile.mkdtemp(prefix="torchfl-numba-cold-")


def cases():
    import torch
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g)
    n = 1024
    a, b = r(n, n), r(n, n)
    ah, bh = a.half(), b.half()
    q, k, v = r(1, 8, 1024, 64), r(1, 8, 1024, 64), r(1, 8, 1024, 64)
    xs = r(8192, 1024)
    xc = r(8, 64, 56, 56)
    wc = r(64, 64, 3, 3)
    xcl = xc.contiguous(memory_format=torch.channels_last)
    xl, wl, bl = r(8192, 768), r(768), r(768)
    # transformer projections (BERT-large layer): fp16 weights kept packed, as the executor
    # keeps a model's weights (frozen), against torch fp32
    xt, wt, bt, wf = r(128, 1024), r(1024, 1024) * 0.03, r(1024), r(4096, 1024) * 0.03
    bf = r(4096)
    xd, wd = r(128, 4096), r(1024, 4096) * 0.015     # the FFN's down projection (K = 4096)
    lin = lambda x, w, b: {"x": (x.half(), None), "w": (w.half(), None), "bias": (b.half(), None)}  # noqa: E731
    conv_attrs = {"padding": (1, 1)}
    # ResNet-50 b1 layer-1 convs: fp16 storage, weights kept packed (frozen), against torch fp32 NCHW
    x1, w1 = r(1, 64, 56, 56), r(256, 64, 1, 1) * 0.1
    return [
        # case, kernel, inputs {name: (tensor, layout)}, attrs, torch fn, flops
        ("gemm_f32_1024", "matmul", {"a": (a, None), "b": (b, None)}, {}, lambda: a @ b, 2 * n ** 3),
        ("gemm_f16_1024", "matmul", {"a": (ah, None), "b": (bh, None)}, {}, lambda: ah @ bh, 2 * n ** 3),
        ("attention_f32_s1024", "attention", {"q": (q, None), "k": (k, None), "v": (v, None)}, {},
         lambda: F.scaled_dot_product_attention(q, k, v), 4 * 8 * 1024 * 1024 * 64),
        ("softmax_f32", "softmax", {"x": (xs, None)}, {"dim": -1}, lambda: torch.softmax(xs, -1), 5 * xs.numel()),
        ("conv3x3_nhwc_f32", "conv2d", {"x": (xc, "NHWC"), "weight": (wc, None)}, conv_attrs,
         lambda: F.conv2d(xcl, wc, padding=1), 2 * 8 * 64 * 64 * 9 * 56 * 56),
        ("conv3x3_nchw_f32", "conv2d", {"x": (xc, None), "weight": (wc, None)}, conv_attrs,
         lambda: F.conv2d(xc, wc, padding=1), 2 * 8 * 64 * 64 * 9 * 56 * 56),
        ("conv1x1_f16_b1_64x256x56", "conv2d", {"x": (x1.half(), None), "weight": (w1.half(), None)}, {},
         lambda: F.conv2d(x1, w1), 2 * 64 * 256 * 56 * 56),
        ("conv3x3_f16_b1_64x64x56", "conv2d", {"x": (x1.half(), None), "weight": (wc.half(), None)}, conv_attrs,
         lambda: F.conv2d(x1, wc, padding=1), 2 * 64 * 64 * 9 * 56 * 56),
        ("layernorm_f32", "layer_norm", {"x": (xl, None), "weight": (wl, None), "bias": (bl, None)},
         {"normalized_shape": (768,), "eps": 1e-5}, lambda: F.layer_norm(xl, (768,), wl, bl), 8 * xl.numel()),
        ("linear_f16_128x1024x1024", "linear", lin(xt, wt, bt), {}, lambda: F.linear(xt, wt, bt), 2 * 128 * 1024 ** 2),
        ("linear_gelu_f16_128x4096x1024", "linear_gelu", lin(xt, wf, bf), {"approximate": "none"},
         lambda: F.gelu(F.linear(xt, wf, bf)), 2 * 128 * 4096 * 1024),
        ("linear_f16_128x1024x4096", "linear", lin(xd, wd, bt), {}, lambda: F.linear(xd, wd, bt),
         2 * 128 * 1024 * 4096),
        ("linear_f16_1x1024x1024", "linear", lin(xt[:1], wt, bt), {}, lambda: F.linear(xt[:1], wt, bt), 2 * 1024 ** 2),
    ] + int8_cases(g)


DECODE_ROWS = (1, 2, 4, 8)
DECODE_KN = ((4096, 4096), (4096, 11008), (11008, 4096), (512, 32000))   # LLaMA-7B projections, a head


def decode_cases(rows=DECODE_ROWS, kn=DECODE_KN, contexts=(1024, 4096)):
    """Decode-shaped kernels (``--cases decode*``): linear with M = 1..8 rows against torch's
    F.linear in the same dtype (float32; float16 and bfloat16 weights kept, as the executor keeps
    them), and one query over a KV cache with grouped-query attention (32 query heads over 8
    key/value heads, head dim 128) against torch's SDPA with ``enable_gqa``. Built only when
    asked for: the weights are large (4096 x 11008 float32 is 180 MB)."""
    import torch
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(1)
    out = []
    for K, N in kn:
        w32 = torch.randn(N, K, generator=g) * (1 / K ** 0.5)
        for dt, tag in ((torch.float32, "f32"), (torch.float16, "f16"), (torch.bfloat16, "bf16")):
            w = w32.to(dt)
            for m in rows:
                x = torch.randn(m, K, generator=g).to(dt)
                out.append((f"decode_linear_{tag}_{m}x{K}x{N}", "linear", {"x": (x, None), "w": (w, None)}, {},
                            (lambda x=x, w=w: F.linear(x, w)), 2 * m * K * N))
    for L in contexts:
        for dt, tag in ((torch.float32, "f32"), (torch.float16, "f16")):
            q = torch.randn(1, 32, 1, 128, generator=g).to(dt)
            k, v = (torch.randn(1, 8, L, 128, generator=g).to(dt) for _ in range(2))
            out.append((f"decode_attention_{tag}_gqa32x8_ctx{L}", "attention", {"q": (q, None), "k": (k, None),
                        "v": (v, None)}, {}, (lambda q=q, k=k, v=v: F.scaled_dot_product_attention(
                            q, k, v, enable_gqa=True)), 4 * 32 * L * 128))
    return out


def int8_cases(g):
    """int8 GEMM and conv against PyTorch's own quantised CPU ops (fbgemm: quint8 activations,
    per-channel qint8 weights, requantised output). torchfl gets the same numbers as int8
    (q - 128, zero point - 128: the same real values); its output is compared likewise."""
    import warnings

    import torch

    warnings.filterwarnings("ignore", message=".*quantize_per.*deprecated.*")
    out = []
    for case, x, w, conv in (("qlinear_int8_512x768x3072", torch.randn(512, 768, generator=g),
                              torch.randn(3072, 768, generator=g) * 0.05, False),
                             ("qconv3x3_int8_8x64x56x56", torch.randn(8, 64, 56, 56, generator=g),
                              torch.randn(64, 64, 3, 3, generator=g) * 0.05, True)):
        k = w.shape[0]
        bias = torch.randn(k, generator=g) * 0.1
        sx, zx, so, zo = float(x.abs().max()) / 127, 128, 0.05, 128
        ws = (w.reshape(k, -1).abs().amax(1) / 127).float()
        xq = torch.quantize_per_tensor(x, sx, zx, torch.quint8)
        wq = torch.quantize_per_channel(w, ws.double(), torch.zeros(k, dtype=torch.long), 0, torch.qint8)
        xi = (xq.int_repr().to(torch.int16) - 128).to(torch.int8)
        wi = wq.int_repr()
        attrs = {"x_scale": sx, "x_zero_point": zx - 128, "out_scale": so, "out_zero_point": zo - 128}
        ins = {"x": (xi, None), ("weight" if conv else "w"): (wi, None), "bias": (bias, None), "w_scales": (ws, None)}
        if conv:
            packed = torch.ops.quantized.conv2d_prepack(wq, bias, [1, 1], [1, 1], [1, 1], 1)
            fn = (lambda xq=xq, packed=packed: torch.ops.quantized.conv2d(xq, packed, so, zo))
            flops = 2 * x.shape[0] * k * w.shape[1] * 9 * x.shape[2] * x.shape[3]
            attrs["padding"] = (1, 1)
        else:
            packed = torch.ops.quantized.linear_prepack(wq, bias)
            fn = (lambda xq=xq, packed=packed: torch.ops.quantized.linear(xq, packed, so, zo))
            flops = 2 * x.shape[0] * x.shape[1] * k
        out.append((case, "qconv2d" if conv else "qlinear", ins, attrs, fn, flops))
    return out


def compile_probe(as_json):
    """First call (compile, or cache load) and second call of one small problem per family."""
    import torch

    from torchfl.kernels import DeviceMemory, DeviceTensor, reference_chip
    from torchfl.kernels.catalog import CATALOG

    ch = reference_chip()
    m = DeviceMemory(ch)
    D = lambda x, lay=None: DeviceTensor.from_torch(x, m, layout=lay)  # noqa: E731
    probes = [
        ("matmul f32", "matmul", {"a": D(torch.randn(64, 64)), "b": D(torch.randn(64, 64))}, {}),
        ("matmul f16", "matmul", {"a": D(torch.randn(64, 64).half()), "b": D(torch.randn(64, 64).half())}, {}),
        ("matmul int8", "matmul", {"a": D(torch.randint(-5, 5, (8, 8), dtype=torch.int8)),
                                   "b": D(torch.randint(-5, 5, (8, 8), dtype=torch.int8))}, {}),
        ("attention f32", "attention", {k: D(torch.randn(1, 2, 64, 32)) for k in "qkv"}, {}),
        ("softmax f32", "softmax", {"x": D(torch.randn(64, 64))}, {}),
        ("elementwise f32 (add, broadcast)", "add", {"a": D(torch.randn(64, 64)), "b": D(torch.randn(64))}, {}),
        ("elementwise f16 (gelu)", "gelu", {"a": D(torch.randn(64, 64).half())}, {}),
        ("layout f32 (NCHW->NHWC)", "layout_transform", {"x": D(torch.randn(2, 3, 4, 5))}, {"layout": "NHWC"}),
        ("cast f32->f16", "cast", {"x": D(torch.randn(64, 64))}, {"to": "float16"}),
    ]
    for name, k, ins, attrs in probes:
        t = time.perf_counter()
        CATALOG[k].run(ch, ins, attrs)
        a = time.perf_counter() - t
        t = time.perf_counter()
        CATALOG[k].run(ch, ins, attrs)
        b = time.perf_counter() - t
        r = {"case": f"first_call {name}", "first_call_s": round(a, 2), "second_call_ms": round(b * 1e3, 2)}
        print(json.dumps(r) if as_json else f"{name:34s} first {a:6.2f} s  second {b * 1e3:7.2f} ms", flush=True)


def host_scaling(as_json, runs=7):
    """What the host gives a second thread, wall time, medians of ``runs``: a compute-bound loop
    (independent FMAs in registers, no memory traffic), a memory-bound one (a sum over 256 MB), both
    split in equal halves over Numba's threads, and torch's own 2048^3 float32 matmul; each at 1 and
    at every core. A speed-up below the thread count here is the host's (shared cores, a shared
    memory bus), not a kernel's: issue 38's two-thread goal is measured against it."""
    import numba
    import numpy as np
    import torch
    from numba import njit, prange

    @njit(parallel=True, fastmath=True)
    def fma_loop(n, nthreads):
        out = np.zeros(nthreads * 16, np.float32)
        for t in prange(nthreads):
            acc = np.zeros(16, np.float32)
            x = np.full(16, np.float32(1.0000001), np.float32)
            for _ in range(n // nthreads):
                for j in range(16):
                    acc[j] = acc[j] * x[j] + np.float32(1e-7)
            out[t * 16:(t + 1) * 16] = acc
        return out.sum()

    @njit(parallel=True, fastmath=True)
    def stream(a, nthreads):
        s = np.zeros(nthreads, np.float64)
        n = a.size
        for t in prange(nthreads):
            acc = np.float32(0.0)
            for i in range(t * n // nthreads, (t + 1) * n // nthreads):
                acc += a[i]
            s[t] = acc
        return s.sum()

    big = np.ones(64 << 20, np.float32)
    x, y = torch.randn(2048, 2048), torch.randn(2048, 2048)
    cores = numba.config.NUMBA_NUM_THREADS
    cases = (("compute (register FMAs)", lambda t: fma_loop(200_000_000 // 16, t)),
             ("memory (sum of 256 MB)", lambda t: stream(big, t)),
             ("torch matmul 2048^3 f32", lambda t: torch.mm(x, y)))
    for name, fn in cases:
        res = {}
        for t in (1, cores):
            numba.set_num_threads(t)
            torch.set_num_threads(t)
            fn(t)
            ts = []
            for _ in range(runs):
                t0 = time.perf_counter()
                fn(t)
                ts.append(time.perf_counter() - t0)
            res[t] = _median(ts)
        r = {"case": f"host_scaling {name}", "threads": cores, "wall_1_s": round(res[1], 4),
             f"wall_{cores}_s": round(res[cores], 4), "speedup": round(res[1] / res[cores], 2),
             "load_avg": round(os.getloadavg()[0], 2)}
        print(json.dumps(r) if as_json else f"{name:26s} 1 thread {res[1] * 1e3:8.1f} ms  {cores} threads "
              f"{res[cores] * 1e3:8.1f} ms  x{r['speedup']:.2f}  (load {r['load_avg']})", flush=True)


_clock = time.perf_counter     # --timer cpu: time.process_time (steady on a shared machine)


MOE_SHAPES = ((8, 1024, 2048, 8), (256, 1024, 2048, 8))    # (tokens, K, N, experts), top-2 routing
MOE_CHIP = "H100-SXM5-80GB"


def moe_compare(as_json, runs, shapes=MOE_SHAPES, chip_name=MOE_CHIP):
    """The grouped GEMM (kernels/grouped) against the same experts run as one GEMM each (the
    ``matmul`` kernel on each expert's rows, as transformers' loop does) on one random top-2
    routing: emulator seconds (medians), predicted seconds on ``chip_name`` (its launch paid once
    against once per expert with tokens), counted bytes of both, and torch's loop for scale."""
    import torch

    from torchfl.hcd import load_hcd
    from torchfl.kernels import ChipModel, DeviceMemory, DeviceTensor
    from torchfl.kernels.catalog import CATALOG
    from torchfl.kernels.tiling import simulated_time
    from torchfl.resources import bundled_hcds

    path = next(p for p in bundled_hcds() if load_hcd(p).name == chip_name)
    chip = ChipModel.from_hcd(load_hcd(path))
    g = torch.Generator().manual_seed(0)
    grouped, mm = CATALOG["grouped_mm"], CATALOG["matmul"]
    for tokens, K, N, E in shapes:
        ids = torch.stack([torch.randperm(E, generator=g)[:2] for _ in range(tokens)]).reshape(-1)
        counts = torch.bincount(ids, minlength=E)
        offs = counts.cumsum(0).to(torch.int32)
        S = int(offs[-1])
        x = torch.randn(S, K, generator=g).half()
        w = (torch.randn(E, K, N, generator=g) / K ** 0.5).half()
        mem = DeviceMemory(chip)
        dx, dw, do = (DeviceTensor.from_torch(t, mem) for t in (x, w, offs))
        gin = {"x": dx, "w": dw, "offs": do}
        gplan = grouped.tile(grouped.problem({k: t.shape for k, t in gin.items()}, {}, None, {},
                                             {k: t.dtype for k, t in gin.items()}), chip)
        experts = []
        start = 0
        for e, end in enumerate(offs.tolist()):
            if end > start:
                a, b = DeviceTensor.from_torch(x[start:end], mem), DeviceTensor.from_torch(w[e], mem)
                ins = {"a": a, "b": b}
                experts.append((ins, mm.tile(mm.problem({k: t.shape for k, t in ins.items()}, {}, None, {},
                                                        {k: t.dtype for k, t in ins.items()}), chip)))
            start = end

        def run_grouped():
            outs, counted = grouped.run(chip, gin, {}, plan=gplan)
            for o in outs:
                o.free()
            return counted

        def run_experts():
            total = None
            for ins, plan in experts:
                outs, counted = mm.run(chip, ins, {}, plan=plan)
                for o in outs:
                    o.free()
                total = counted if total is None else total + counted
            return total

        def torch_loop():
            out, st = torch.zeros(S, N, dtype=torch.float16), 0
            for e, end in enumerate(offs.tolist()):
                if end > st:
                    torch.mm(x[st:end], w[e], out=out[st:end])
                st = end
            return out

        cg, ce = run_grouped(), run_experts()
        tg, te, tt = [], [], []
        for _ in range(runs):
            t = _clock()
            run_grouped()
            tg.append(_clock() - t)
            t = _clock()
            run_experts()
            te.append(_clock() - t)
            t = _clock()
            torch_loop()
            tt.append(_clock() - t)
        pg = simulated_time(gplan, chip, "float16")
        pe = sum(simulated_time(plan, chip, "float16") for _, plan in experts)
        res = {"case": f"moe_grouped_f16_{tokens}tok_top2_{E}x{K}x{N}", "experts_with_tokens": len(experts),
               "grouped_s": round(_median(tg), 6), "per_expert_s": round(_median(te), 6),
               "torch_loop_s": round(_median(tt), 6), "grouped_bytes": cg.bytes, "per_expert_bytes": ce.bytes,
               "grouped_planned_bytes": gplan.traffic.bytes,
               "weight_passes": [gplan.config.tile("weight_passes_min"), gplan.config.tile("weight_passes_max")],
               f"predicted_grouped_s_{chip_name}": pg, f"predicted_per_expert_s_{chip_name}": pe}
        if as_json:
            print(json.dumps(res), flush=True)
        else:
            print(f"{res['case']:40s} grouped {res['grouped_s'] * 1e3:8.2f} ms  per-expert "
                  f"{res['per_expert_s'] * 1e3:8.2f} ms  torch loop {res['torch_loop_s'] * 1e3:8.2f} ms  "
                  f"predicted on {chip_name}: {pg * 1e6:.1f} us vs {pe * 1e6:.1f} us", flush=True)


def _median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


def run_case(case, kernel, inputs, attrs, torch_fn, flops, runs, chip, peak):
    from torchfl.kernels import DeviceMemory, DeviceTensor
    from torchfl.kernels.catalog import CATALOG

    spec = CATALOG[kernel]
    mem = DeviceMemory(chip)
    dev = {nm: DeviceTensor.from_torch(t, mem, layout=lay) for nm, (t, lay) in inputs.items()}
    # a model's weights as the executor keeps them: linear's, and the fp16 (ResNet-50 b1) convs'
    kept = dev.get("w") if kernel in ("linear", "linear_gelu") else dev.get("weight") if kernel == "conv2d" else None
    if kept is not None and kept.dtype != "int8" and (kernel != "conv2d" or kept.dtype == "float16"):
        from torchfl.kernels.frozen import freeze

        freeze(kept.buffer)     # a model's weight, as the executor keeps it
    prob = spec.problem({k: t.shape for k, t in dev.items()}, attrs, None,
                        {k: t.layout for k, t in dev.items()}, {k: t.dtype for k, t in dev.items()})
    plan = spec.tile(prob, chip)
    t0 = time.perf_counter()
    outs, counted = spec.run(chip, dev, attrs, plan=plan)
    first = time.perf_counter() - t0
    ref = torch_fn()
    if ref.is_quantized:   # quint8 from fbgemm: as int8 quanta (q - 128), like torchfl's output
        ref = ref.int_repr().float() - 128
    err = float((outs[0].to_torch().float() - ref.float()).abs().max()) if ref.numel() else 0.0
    for o in outs:
        o.free()
    for _ in range(2):   # warm-up both (page faults, thread pools)
        for o in spec.run(chip, dev, attrs, plan=plan)[0]:
            o.free()
        torch_fn()
    tf, tt = [], []
    for _ in range(runs):
        t = _clock()
        outs, _ = spec.run(chip, dev, attrs, plan=plan)
        tf.append(_clock() - t)
        for o in outs:
            o.free()
        t = _clock()
        torch_fn()
        tt.append(_clock() - t)
    f, g = _median(tf), _median(tt)
    res = {"case": case, "kernel": kernel, "torchfl_s": round(f, 6), "torch_s": round(g, 6),
           "ratio": round(g / f, 3), "gflops": round(flops / f / 1e9, 2), "first_call_s": round(first, 2),
           "max_abs_err": err, "strategy": plan.config.strategy, "counted_equals_predicted": counted == plan.traffic}
    if peak and case.startswith("gemm_f32"):
        res["fraction_of_peak"] = round(flops / f / 1e9 / peak, 3)
    return res


SCAN_SHAPES = ((1, 128, 16, 8), (2, 256, 16, 8))     # (batch, channels, state, length <= 8: the loop's stack stays on chip)


def scan_compare(as_json, runs, shapes=SCAN_SHAPES, chip_name="NPU-V3"):
    """Mamba's scan as the selective_scan kernel (kernels/ssm) against transformers' loop over time
    planned step by step (per step a multiply-add, a matmul with C, then a stack), both planned by
    ``plan_module`` strict on ``chip_name`` in float16: predicted seconds and steps of each plan,
    emulator seconds (medians), and torch's loop for scale."""
    import torch
    from transformers.models.mamba import modeling_mamba as mm

    from torchfl.kernels.ssm.hf_route import patch
    from torchfl.planner import plan_module
    from torchfl.runtime.executor import Executor

    patch(mm)
    routed, loop = mm.mamba_selective_scan, mm.mamba_selective_scan.torchfl_original

    class Scan(torch.nn.Module):
        def __init__(self, fn):
            super().__init__()
            self.fn = fn

        def forward(self, u, dt, A, B, C, D, z, bias):
            return self.fn(u, dt, A, B, C, D=D, z=z, delta_bias=bias, delta_softplus=True)

    g = torch.Generator().manual_seed(0)
    for bt, d, n, l in shapes:
        args = (torch.randn(bt, d, l, generator=g), torch.randn(bt, d, l, generator=g) * 0.5 - 1,
                -torch.rand(d, n, generator=g) * 4, torch.randn(bt, n, l, generator=g), torch.randn(bt, n, l, generator=g),
                torch.randn(d, generator=g), torch.randn(bt, d, l, generator=g), torch.randn(d, generator=g) * 0.1)
        res = {"case": f"mamba_scan_f16_{bt}x{d}x{l}_state{n}"}
        for name, fn in (("kernel", routed), ("loop", loop)):
            plan = plan_module(Scan(fn), args, chip=chip_name, precision="float16", strict=True)
            ex = Executor(plan)
            ex.run(args)
            times = []
            for _ in range(runs):
                t = _clock()
                ex.run(args)
                times.append(_clock() - t)
            res[f"{name}_steps"] = len(plan.steps)
            res[f"{name}_predicted_s_{chip_name}"] = sum(s.predicted_time_s for s in plan.steps)
            res[f"{name}_emulator_s"] = round(_median(times), 6)
        times = []
        for _ in range(runs):
            t = _clock()
            loop(*args[:5], D=args[5], z=args[6], delta_bias=args[7], delta_softplus=True)
            times.append(_clock() - t)
        res["torch_loop_s"] = round(_median(times), 6)
        if as_json:
            print(json.dumps(res), flush=True)
        else:
            pk, pl = res[f"kernel_predicted_s_{chip_name}"], res[f"loop_predicted_s_{chip_name}"]
            print(f"{res['case']:34s} predicted on {chip_name}: kernel {pk * 1e6:8.2f} us ({res['kernel_steps']} steps) "
                  f"vs loop {pl * 1e6:8.2f} us ({res['loop_steps']} steps); emulator {res['kernel_emulator_s'] * 1e3:.2f} "
                  f"vs {res['loop_emulator_s'] * 1e3:.2f} ms; torch loop {res['torch_loop_s'] * 1e3:.2f} ms", flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="one JSON object per line")
    ap.add_argument("--runs", type=int, default=7, help="timed runs per side (median; at least 5)")
    ap.add_argument("--cases", default="", help="comma-separated case names (default: all)")
    ap.add_argument("--cold", action="store_true", help="empty NUMBA_CACHE_DIR: first_call_s is the compile time")
    ap.add_argument("--threads", type=int, default=0,
                    help="threads for both sides (default: all cores); 1 is steadier on a shared machine")
    ap.add_argument("--compile-times", action="store_true",
                    help="only probe first-call time per family (use with --cold for compile time)")
    ap.add_argument("--host-scaling", action="store_true",
                    help="only measure what a second thread gives on this host (compute, memory, torch's matmul)")
    ap.add_argument("--moe", action="store_true",
                    help="only compare the grouped GEMM with one GEMM per expert (mixture-of-experts shapes)")
    ap.add_argument("--scan", action="store_true",
                    help="Mamba's selective scan kernel against transformers' loop planned step by step")
    ap.add_argument("--no-peak", action="store_true", help="skip tools/peak.py's fp32 peak measurement")
    ap.add_argument("--timer", choices=("wall", "cpu"), default="wall",
                    help="cpu: the process's CPU time (with --threads 1: steady on a loaded machine)")
    a = ap.parse_args(argv)
    global _clock
    if a.timer == "cpu":
        _clock = time.process_time
    if a.runs < 5:
        ap.error("--runs must be at least 5")
    _setup_cache(a.cold)
    if a.threads:
        os.environ["NUMBA_NUM_THREADS"] = str(a.threads)
    import torch

    if a.threads:
        torch.set_num_threads(a.threads)

    from torchfl.kernels import reference_chip
    from torchfl.kernels.catalog import CATALOG

    if a.compile_times:
        compile_probe(a.json)
        return
    if a.host_scaling:
        host_scaling(a.json, a.runs)
        return
    if a.moe:
        moe_compare(a.json, a.runs)
        return
    if a.scan:
        scan_compare(a.json, a.runs)
        return
    peak = None
    if not a.no_peak:
        sys.path.insert(0, str(ROOT / "tools"))
        import peak as peakmod

        peak = peakmod.fp32_peak(0.5)[0] / 1e9
        info = {"case": "machine", "fp32_peak_gflops": round(peak, 1), "torch_threads": torch.get_num_threads()}
        print(json.dumps(info) if a.json else f"fp32 peak {peak:.1f} GFLOP/s", flush=True)
    want = {c for c in a.cases.split(",") if c}
    chip = reference_chip()
    prefixes = tuple(c[:-1] for c in want if c.endswith("*"))
    extra = decode_cases() if any(p.startswith("decode") or "decode".startswith(p) for p in prefixes) else []
    for case, kernel, inputs, attrs, fn, flops in cases() + extra:
        if want and case not in want and not (prefixes and case.startswith(prefixes)):
            continue
        if kernel not in CATALOG:
            print(f"note: {case}: kernel {kernel!r} is not in the catalog yet; skipped", file=sys.stderr)
            continue
        try:
            res = run_case(case, kernel, inputs, attrs, fn, flops, a.runs, chip, peak)
        except Exception as e:   # report and go on: one family's bug must not hide the others
            print(f"note: {case}: failed: {type(e).__name__}: {e}", file=sys.stderr)
            continue
        if a.json:
            print(json.dumps(res), flush=True)
        else:
            print(f"{case:36s} torchfl {res['torchfl_s'] * 1e3:8.2f} ms  torch {res['torch_s'] * 1e3:8.2f} ms  "
                  f"ratio {res['ratio']:5.2f}  {res['gflops']:7.1f} GF/s  first {res['first_call_s']:.1f} s", flush=True)


if __name__ == "__main__":
    main()
