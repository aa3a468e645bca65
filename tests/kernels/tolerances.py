"""Per-dtype tolerances against torch, and why (mirrors torchfl/kernels/dtypes.py).

float32   rtol 1e-4, atol 1e-5: same inputs; only the summation order differs (tiles,
          8-wide vectors, fp32 accumulation both sides).
float16   rtol 2e-3, atol 2e-3: 11-bit significand, so one round-to-nearest-even on
          store is up to 2^-11 ~ 4.9e-4 relative; torch's CPU half ops may round
          intermediates, so allow ~4 ulp.
bfloat16  rtol 1.6e-2, atol 1e-2: 8-bit significand, RNE on store is 2^-8 ~ 3.9e-3; torch
          rounds intermediates in bf16 too (~2 ulp each side).
bf16 emulated (bfloat16_emulation): inputs rounded through fp16 and the result truncated
          to bf16: one extra bf16 ulp (2^-7 ~ 7.8e-3) one-sided: rtol 3.2e-2, atol 2e-2.
int8      exact for int32 accumulators; requantised outputs within 1 quantisation step.
Reductions over K terms (matmul, attention) widen atol by sqrt(K)*ulp (see helpers).
"""
TOL = {
    "float32": (1e-4, 1e-5),
    "float16": (2e-3, 2e-3),
    "bfloat16": (1.6e-2, 1e-2),
    "bfloat16_emulated": (3.2e-2, 2e-2),
    "int8": (0, 0),
}
