"""Planning time of the SME (capture excluded): warm median of 5 runs per case, and cold.

``plan_s`` is wall time, ``cpu_s`` the process's CPU time (less sensitive to a shared
machine). Warm: the same graph planned again in the process (the rule-match/tiling outcome cache is
filled, as after a first compile); cold: the first plan with that cache cleared (``cold_s`` wall,
``cold_cpu_s`` CPU; the first case of a run is also the process's first plan: planner imports,
empty kernel tile memo).

    .venv/bin/python tools/bench_planner.py [--json] [--chip NPU-V3] [--repeat 5]

Cases: resnet50 (224x224, batch 1), bert-base with 8 heads (seq 128), and chains of
50/100/200/400/800 linear layers (64 wide). One JSON object per case with ``case``,
``nodes`` (ATen op nodes) and ``plan_s``; targets (issue 25, CPU time): ResNet-50 warm <= 50 ms,
BERT-base <= 100 ms, <= 2.1x per doubling of the chain, cold <= 0.5 s.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings


def _chain(n):
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.Sequential(*[nn.Linear(64, 64) for _ in range(n)]).eval(), (torch.randn(8, 64),)


def main(argv=None) -> int:
    warnings.filterwarnings("ignore")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="one JSON object per line")
    ap.add_argument("--chip", default="NPU-V3")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--cases", default="resnet50,bert-base,chain50,chain100,chain200,chain400,chain800")
    args = ap.parse_args(argv)

    from torchfl.planner.api import plan_captured
    from torchfl.planner.candidates import clear_caches
    from torchfl.planner.capture import capture_module
    from torchfl.hcd import load_hcd
    from torchfl.planner.target import Target
    from torchfl.resources import bundled_hcds
    from torchfl.planner.zoo import load_model

    target = Target.of(next(h for h in map(load_hcd, bundled_hcds()) if h.chip.name == args.chip))
    results = []
    for case in args.cases.split(","):
        if case.startswith("chain"):
            module, inputs = _chain(int(case[5:]))
        elif case == "bert-base":
            module, inputs = load_model("bert-base", num_heads=8, seq_len=128)
        else:
            module, inputs = load_model(case)
        cap = capture_module(module, inputs)
        clear_caches()
        t0, c0 = time.perf_counter(), time.process_time()
        plan = plan_captured(cap, inputs, target, precision="float16")  # cold: empty outcome cache
        cold, cold_cpu = time.perf_counter() - t0, time.process_time() - c0
        times, cpu = [], []
        for _ in range(args.repeat):
            t0, c0 = time.perf_counter(), time.process_time()
            plan_captured(cap, inputs, target, precision="float16")
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
        row = {"case": case, "nodes": plan.summary.nodes_total, "plan_s": round(statistics.median(times), 5),
               "cpu_s": round(statistics.median(cpu), 5), "cold_s": round(cold, 5), "cold_cpu_s": round(cold_cpu, 5),
               "chip": args.chip, "fallbacks": plan.summary.fallbacks}
        results.append(row)
        print(json.dumps(row) if args.json else f"{case:10s} {row['nodes']:6d} nodes  warm {row['plan_s'] * 1e3:8.1f} ms"
              f"  cold {cold * 1e3:8.1f} ms (CPU {cold_cpu * 1e3:.1f})",
              flush=True)
    chains = [r for r in results if r["case"].startswith("chain")]
    if not args.json and len(chains) > 1:
        ratios = [b["cpu_s"] / a["cpu_s"] for a, b in zip(chains, chains[1:])]
        print("per doubling (CPU time): " + ", ".join(f"{r:.2f}x" for r in ratios))
    return 0


if __name__ == "__main__":
    sys.exit(main())
