"""Decode speed: tokens/s of a 2-layer LLaMA at context 1024 on the emulated chip
(``torch.compile(backend="torchfl")``) against torch eager on the host, and where a token's time
goes (plan instance, executor, kernels).

    NUMBA_CACHE_DIR=.cache/numba python tools/bench_decode.py [--chip TFL-X1] [--context 1024]
        [--tokens 16] [--hidden 512] [--dtype float32] [--json] [--profile FILE]

The model: LlamaForCausalLM, 2 layers, hidden 512, 8 heads, 4 key/value heads, MLP 1408,
vocabulary 32000 (random weights, seed 0). A prompt of ``context - tokens - warm`` tokens is
prefilled (eager, once, shared); each side then decodes ``warm`` tokens untimed (Dynamo's
recompiles, the kernels' first calls, the symbolic capture) and ``tokens`` timed, one forward
per token with the DynamicCache, as generate() runs them. Greedy tokens are checked equal.

A token's graph call is split into kernels (time inside kernel calls) and what is not kernels:
the plan instance of that length (``planner.lengths``), the executor's own work around the
kernels (the per-call executor cost) and the backend's rest of the call.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time


def build(hidden: int, dtype):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=32000, hidden_size=hidden, intermediate_size=int(hidden * 2.75), num_hidden_layers=2,
                      num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=4096)
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).eval().to(dtype)


def decode(forward, cache, first, n, timed_from, profiler=None):
    """Greedy decode of ``n`` tokens from ``first``; per-token seconds of tokens >= timed_from
    (``profiler``: a cProfile.Profile enabled over those tokens' forwards only)."""
    import copy

    import torch

    cache = copy.deepcopy(cache)
    ids, tokens, times, logits = first, [], [], []
    with torch.no_grad():
        for i in range(n):
            prof = profiler is not None and i >= timed_from
            if prof:
                profiler.enable()
            t0 = time.perf_counter()
            out = forward(input_ids=ids, cache=cache, use_cache=True)
            dt = time.perf_counter() - t0
            if prof:
                profiler.disable()
            cache = out.cache
            logits.append(out.logits[0, -1].float().clone())
            ids = logits[-1].argmax().view(1, 1)
            tokens.append(int(ids))
            if i >= timed_from:
                times.append(dt)
    return tokens, times, logits


def first_divergence(a_tokens, a_logits, b_logits):
    """(step, max |logit difference| there, the reference's top-2 gap there) where the greedy
    tokens first differ, else None: a tie within rounding is not a wrong result."""
    for i, (x, y) in enumerate(zip(a_logits, b_logits)):
        if int(x.argmax()) != int(y.argmax()):
            top = x.topk(2).values
            return i, float((x - y).abs().max()), float(top[0] - top[1])
    return None


def chip_decode(args, m, cache, first, n):
    """The emulated chip's decode (``decode``), each call's time split: the plan instance
    (specialise + re-price), the executor's run (``executor``: kernels, and its own work
    ``executor_own``), the backend's rest of the call (``rest``: signature, entry, outputs) and
    ``run`` the whole graph call (Dynamo's guards and transformers' Python are outside it)."""
    import torch

    from torchfl.planner import lengths as lengths_mod
    from torchfl.runtime import backend

    split = {k: [] for k in ("instance", "run", "kernel", "executor", "executor_own", "rest")}
    pending = [0.0]
    plan_of, call = lengths_mod.LengthPlanner.plan, backend.CompiledGraph.__call__

    def timed_plan(self, call_args):
        t0 = time.perf_counter()
        try:
            return plan_of(self, call_args)
        finally:
            pending[0] += time.perf_counter() - t0

    def timed_call(self, *call_args):
        t0 = time.perf_counter()
        try:
            return call(self, *call_args)
        finally:
            run = time.perf_counter() - t0
            ex = getattr(next(reversed(self.entries.values()), None), "executor", None)
            kern, total = getattr(ex, "last_kernel_s", 0.0), getattr(ex, "last_total_s", 0.0)
            split["run"].append(run)
            split["instance"].append(pending[0])
            split["kernel"].append(kern)
            split["executor"].append(total)
            split["executor_own"].append(total - kern)
            split["rest"].append(run - pending[0] - total)
            pending[0] = 0.0
    lengths_mod.LengthPlanner.plan, backend.CompiledGraph.__call__ = timed_plan, timed_call
    profiler = None
    if args.profile:
        import cProfile

        profiler = cProfile.Profile()
    try:
        compiled = torch.compile(m.forward, backend="torchfl", options={"chip": args.chip})
        tokens, times, logits = decode(compiled, cache, first, n, args.warm, profiler)
    finally:
        lengths_mod.LengthPlanner.plan, backend.CompiledGraph.__call__ = plan_of, call
    if profiler is not None:
        profiler.dump_stats(args.profile)
    return tokens, times, logits, split


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chip", default="TFL-X1")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--tokens", type=int, default=16, help="timed decode steps")
    ap.add_argument("--warm", type=int, default=4, help="untimed decode steps first")
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--dtype", default="float32", choices=["float32", "float16"])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--profile", metavar="FILE", help="cProfile the emulated chip's timed tokens into FILE "
                    "(pstats; the timings then include the profiler's overhead)")
    args = ap.parse_args(argv)

    import torch

    load_before = os.getloadavg()[0]
    dtype = getattr(torch, args.dtype)
    m = build(args.hidden, dtype)
    n = args.warm + args.tokens
    prompt = torch.randint(0, 32000, (1, args.context - n), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        pre = m(input_ids=prompt, use_cache=True)
    first = pre.logits[:, -1:].argmax(-1)

    eager_tokens, eager_s, eager_logits = decode(m.forward, pre.cache, first, n, args.warm)

    chip_tokens, chip_s, chip_logits, split = chip_decode(args, m, pre.cache, first, n)

    t_eager, t_chip = statistics.median(eager_s), statistics.median(chip_s)
    timed = slice(-args.tokens, None)
    med = {k: statistics.median(v[timed]) for k, v in split.items()}
    inst, run, kern, total = med["instance"], med["run"], med["kernel"], med["executor"]
    result = {
        "chip": args.chip, "context": args.context, "tokens": args.tokens, "hidden": args.hidden,
        "dtype": args.dtype, "same_tokens": eager_tokens == chip_tokens,
        "eager_tokens_per_s": 1 / t_eager, "chip_tokens_per_s": 1 / t_chip, "ratio": t_eager / t_chip,
        "chip_ms_per_token": 1e3 * t_chip, "eager_ms_per_token": 1e3 * t_eager,
        "instance_ms": 1e3 * inst, "graph_call_ms": 1e3 * run, "kernel_ms": 1e3 * kern,
        "executor_ms": 1e3 * total, "executor_own_ms": 1e3 * med["executor_own"],
        "per_call_rest_ms": 1e3 * med["rest"], "not_kernel_ms": 1e3 * (run - kern),
        "load_avg_before": load_before, "load_avg": os.getloadavg()[0],
        "max_logit_diff_step0": float((eager_logits[0] - chip_logits[0]).abs().max()),
        "divergence": first_divergence(eager_tokens, eager_logits, chip_logits),
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"2-layer LLaMA (hidden {args.hidden}, {args.dtype}) decode at context {args.context}, "
              f"{args.tokens} timed tokens")
        print(f"  torch eager:        {result['eager_ms_per_token']:8.2f} ms/token  "
              f"{result['eager_tokens_per_s']:8.1f} tokens/s")
        print(f"  emulated {args.chip:8}: {result['chip_ms_per_token']:8.2f} ms/token  "
              f"{result['chip_tokens_per_s']:8.1f} tokens/s  ({result['ratio']:.2f}x eager)")
        print(f"    of which graph call {result['graph_call_ms']:.2f} ms: kernels {result['kernel_ms']:.2f} ms, "
              f"not kernels {result['not_kernel_ms']:.2f} ms = plan instance {result['instance_ms']:.2f} ms "
              f"+ executor's own {result['executor_own_ms']:.2f} ms + backend's per call "
              f"{result['per_call_rest_ms']:.2f} ms (medians)")
        print(f"    same greedy tokens: {result['same_tokens']}; load average {result['load_avg_before']:.1f} before, "
              f"{result['load_avg']:.1f} after")
        print(f"    max |logit difference| at the first step {result['max_logit_diff_step0']:.3g}"
              + ("" if result["divergence"] is None else
                 " ; tokens first differ at step {0}: max |diff| {1:.3g}, eager's top-2 gap {2:.3g}".format(
                     *result["divergence"])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
