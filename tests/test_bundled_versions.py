"""A published (name, version) is immutable: the bundled chips and rule packs may not change
content without a version bump, or every registry seeded from an earlier torchfl refuses
them at seeding (``make demo`` then fails on an existing machine).

When you change a bundled file on purpose: bump its version, then record the new hash here.
"""

from __future__ import annotations

import pytest

from torchfl.hcd import load_hcd
from torchfl.resources import bundled_hcds, bundled_rule_packs
from torchfl.rules import load_pack

PUBLISHED = {
    ("DSP-M4", "0.9.1"): "5b9a93780d04a69cec4b312c19be4f1d9410a4c5605dec0242c174f8fcf09b5a",
    ("EDGE-C2", "3.0.0"): "1b10d932f09d42e505b2aef0cd02c2dc1a5395ec9a1a511c851223f3dbb4d2ae",
    ("NPU-E1", "1.2.0"): "4f934dd534df4f30be43d72ac43bec694cb8f9c5b157036a56f59dfa1ed6d67f",
    ("NPU-V2", "2.1.0"): "57bfa8264a5ca897ccf720c9a1d3986528a038c646d6a493b5bcc6a0105280e9",
    ("NPU-V3", "1.0.0"): "ab6bd6b896bf28af70188c7884e3459fc0fdf467bda1d05e4d138cd6033bfa4e",
    ("TFL-X1", "1.0.0"): "58ed6ce9e2f24330ee0a818a27c3990df003cba35b4c57aaa5cdcf67b57e7da0",
    # real accelerators (HCD format 1.1, issue 32)
    ("A100-SXM4-80GB", "1.0.0"): "42b0b06780354bead2fb498d48923ed1b96b37571878cb4989d169852337deac",
    ("ASCEND-910B", "1.0.0"): "a53e96da095c2b9a9a778fa76f3e61a5189ad4d204b41ccd0d548510e6c48c01",
    ("GAUDI2", "1.0.0"): "5725c02d9a53ae99b066b17312b5b5616a42640a6dc2793d3bab30f2df9ff0b4",
    ("H100-SXM5-80GB", "1.0.0"): "bbdcd633e7902e4f32bc8d2410458a6dc6f1f0efb1a255d1dead18f0a733679c",
    ("JETSON-AGX-ORIN-64GB", "1.0.0"): "329daf07a1d9560c71e62fcfbab10971c10d0bda50d219f61b0fd860e6049855",
    ("MI210", "1.0.0"): "a3e39eb20e398b875220770fb0373f2937a62bf27d552535da87beab70c11361",
    # 1.1.0: execution.row_resident_elements (issue 32, helper fid2)
    ("A100-SXM4-80GB", "1.1.0"): "035a1de5c1dbeef955391a4d0ae8a68705782859982306c4251184ea6d915e28",
    ("MI210", "1.1.0"): "683e11e5950f33d929f059e91bd6fbb0fe3ff91f154f6619596ce6be86e085e6",
    # execution.graph_launch_overhead_us (issue 34 item 6, helper launch3)
    ("A100-SXM4-80GB", "1.2.0"): "21925c7cd28b0ed61d0b1f589e8f1842e172294505e79cf2df26303769b998a3",
    ("H100-SXM5-80GB", "1.1.0"): "6bca34b733809e9b07cb4d7f9c1ea8875ca1c395e429d6fdd62e192b7a021c3a",
    ("MI300X", "1.0.0"): "4a5b1977008571999b4bdf41f53ebfb908d427bc71474319a1fd4bbd2a754448",
    ("TPU-V5E", "1.0.0"): "fb565da15c91c88fbdce9633789688e67aff91bfaf9e9e38c5735d103960c9c0",
    # format 1.2: sources and provenance of every performance number, calibrated from published
    # microbenchmarks (measurements/microbench), no number fitted to an op table (issue 47, helper data)
    ("A100-SXM4-80GB", "1.3.0"): "d86140cd2ed2dc7e89e9ca443233fecdcd4211de3a782133334ec0163f956db9",
    ("ASCEND-910B", "1.1.0"): "3e4df7fc03dfea3dfe24d958e56d237b6cc6fe7da6ea11c96332d84cd68e148d",
    ("GAUDI2", "1.1.0"): "c199fd32b46fcdfaa2892c67aa7bb89672e64e5c7be635489ae64f36fc704378",
    ("H100-SXM5-80GB", "1.2.0"): "808fffa4a8efe2107b5c0a8965692ce0069874de98b6434872fb84ebc128ef06",
    ("JETSON-AGX-ORIN-64GB", "1.1.0"): "acb120fb6d0a9b9db8627e4a4f40e18bfae65a6dacea046dad4029bd00433968",
    ("MI210", "1.2.0"): "3501ec269e5174b3d10a7944df6e6bc376287a78a287fae86434041efd4d98a8",
    ("MI300X", "1.1.0"): "3a81699f03f158f7016d9fcafdbdea2a3eebbfefd838bdc3c4aa0c7511ef02da",
    ("TPU-V5E", "1.1.0"): "96694a4f5305b840c26c924924a2bb9d1b61ba146ac5c99641537dd733b4dbee",
    # format 1.2 interconnect: chip-to-chip links with their sources (issue 49, helper multichip)
    ("A100-SXM4-80GB", "1.4.0"): "3bac1b8e07c094b1a45f606da0bf183b7656a2661e69c019619a300edd2b827b",
    ("H100-SXM5-80GB", "1.3.0"): "4a947f11f2b2f1033b3ef9e6a96a9c4fc68c3a0994c46663ec0120c834bb05be",
    ("MI300X", "1.2.0"): "b1c346109da5842f04c11cd7fa5e940d4903362e34e98f0124d9d83f4c2010a7",
    ("GAUDI2", "1.2.0"): "d947d10f63b0c94347e2e685c4459fc0522ea7f5c8ce939a549b2d9f53426080",
    ("TPU-V5E", "1.2.0"): "b1db88f48c369d722e48fbfda4907b530800fab941799a56741c075177945533",
    ("core", "1.1.0"): "c15736687fbf9c6d338ee2193ad39a6d79876ac13502aaa81e6c1f3270708664",
    ("core", "1.2.0"): "56e9e7a1e3cf288b344fd8e8cadd3edb0f9063048cf58e6fa7be7a289681456d",
    ("core", "1.3.0"): "4bf2811c4fe2574b9bdfe6539edf3013d49e5153d1d829f48acf3cfe8e0bfce0",
    ("core", "1.4.0"): "0167757d73e61e2f7f4a8b2a8858ad99f9a1c38b3cb7736380daa8448ea6ca9f",
    ("core", "1.5.0"): "5b8b5920343b649e3f75dccc10f5cfe16a10e56226262b8a8878a1e60ab12e98",
    ("core", "1.6.0"): "e081b46a0772f058fac47c085924e47f968a462128e3bbdfd123f49d58edd178",
    ("core", "1.7.0"): "6764e89f901eb7138d24359540f0d3850e07bcd96c75aaf28d7aa0b0884f0104",
    ("core", "1.8.0"): "d37aafb792bba53727957a7f55e7a00209a1cf14b14506a0e9918d76d30dae85",
    # 1.9.0: LLaMA-family fusions rms_norm, silu_mul, rope (issue 34, helper fuse3)
    ("core", "1.9.0"): "174b11dab8e1c4327f15d1ba850f9f6157fbac3137ef465ad749af8d87ee9345",
    # 1.10.0: minimum, maximum, clamp.Tensor, sum of bool/int, pow.Tensor_Tensor (the eager device's zoo fallbacks)
    ("core", "1.10.0"): "9dccec93362ce919f5b239a38aa62dae2cb2b243f11868cbb3c0230907b9a206",
    # 1.11.0: linalg_vector_norm (weight norm: Wav2Vec2's last eager fallback; clip_grad_norm_)
    ("core", "1.11.0"): "79b72ecd76c56ae0c2cf672f7d7eaf3f95d0969ec791adb83317dc9bd86e5940",
    # 1.12.0: casts from an index-path integer or bool to a float (mixed-dtype elementwise operands, planner/promote.py)
    ("core", "1.12.0"): "8d57d2d935b84c81283651e5807ba6ec28d4861c87f1654b472412034ad813a2",
    # 1.13.0: attention_bshd, the transposes around attention folded into it (issue 38, helper steps4)
    ("core", "1.13.0"): "3cfb8a6a9979ec51b71e008f32ea031698c9837bb7443343a28ac3b18f7a1282",
    # 1.14.0: the order family, argmax, argmin, topk, sort (issue 48: MoE routing, CLIP's pooling; helper arch)
    ("core", "1.14.0"): "20e1af788c0c0cf138dff5c8b5ecd6ea8e04c531b93b7f3a7726554b17f09624",
    # 1.15.0: histc (kernels/count; issue 48: MoE tokens per expert, int32 ids as CUDA counts them; helper arch)
    ("core", "1.15.0"): "83be75f6f0c6c71e12acbd034a4829a7a467b7caf52b1d5d9c7c0e874eb3a2c6",
    # 1.16.0: div with a rounding mode, floor_divide (kernels/rounding; issue 48: MoE's perm // top_k; helper arch)
    ("core", "1.16.0"): "d1ad113f90388ccd7cea0a61ea2576ffb593176edb2502520ed58cd10283c394",
    # 1.17.0: log1p as Goldberg's corrected log(1 + x) (issue 48: Mamba; helper arch)
    ("core", "1.17.0"): "03e57c418b781f6648bd3001ca46ac8d9ce346ced3c2ed92c6d24db6b69ef879",
    # 1.18.0: attention with one key/value head broadcast over the query heads (issue 48: Falcon; helper arch)
    ("core", "1.18.0"): "8b168987fbbf9f33e653b7dde00af19c7e5167f5b3c4c84edd076461d75d8e6d",
    # 1.19.0: cumsum of float counts into an integer dtype (kernels/count offsets; issue 48: MoE offsets; helper arch)
    ("core", "1.19.0"): "ceaaf62186c771515b4d6ec40c98a5a889b9e699161762a20dbcce466b6a573c",
    # 1.20.0: index_put / _index_put_impl (kernels/index/put; issue 48: MoE's inverse permutation; helper moe)
    ("core", "1.20.0"): "465af328e667d2a5ea4086b1c5f39e9bfb46146a2e882eb80c30e7c26256ec10",
    # 1.21.0: torchfl.grouped_mm and the aten._grouped_mm decomposition (kernels/grouped; issue 48: MoE experts in bfloat16 and on the meta device; helper moe)
    ("core", "1.21.0"): "a2b29d542bf4e09686ec3a11323cb7440eea354819bcb1be98bad65f4551d3c7",
    # 1.22.0: a transposed GEMM operand read in place (bmm/mm/addmm trans_a/trans_b fusions; issue 47; helper bmmnt)
    ("core", "1.22.0"): "88080374440ee7fd480bf2a0a96de3181ae8114010f32018ccd02eddb06c8cc4",
    # 1.23.0: transformers.grouped_mm_fallback as the grouped_mm kernel (issue 48: MoE experts compiled in float16/float32)
    ("core", "1.23.0"): "e1ae4a6fe7c97b84b4f64086560b89ef255f50790f8ef07a067c0c9fc6842b99",
    # 1.24.0: torchfl.selective_scan (Mamba's scan, kernels/ssm) and aten.copy.default (copy/cast into a buffer: Mamba's cache) (issue 48; helper mamba)
    ("core", "1.24.0"): "269ee9f25d2da4bcc423324a756a528cc49d2fa6b4de3b9713d711b88038ea46",
    # 1.25.0: decompositions pow_scalar_base (MPT's ALiBi slopes) and slice_scatter_joined (DeepSeek-V3's key writes) (issue 48; helper zoo2)
    ("core", "1.25.0"): "4c8d74f8211238e42c56d91c8a189a683236a208a632210ab8d95ba4e9f0f4f0",
    # 1.26.0: decomposition scatter_value_put (DeepSeek-V3's group mask) (issue 48; helper zoo2)
    ("core", "1.26.0"): "0c8573fc0c269c38fb9e2bd6c970c4c49437b071461d4251d23a8f6c21ed5b50",
    # 1.27.0: the concat kernel joins 2 to 32 tensors (8 before) (issue 48; helper zoo2)
    ("core", "1.27.0"): "3bf827acd752a14a74b309f3e72c4b79c9477cb2addb62f550c53e97d5a3507d",
}


def _bundled():
    for path in bundled_hcds():
        h = load_hcd(path)
        yield path.name, h.chip.name, h.chip.version, h.content_hash()
    for path in bundled_rule_packs():
        p = load_pack(path)
        yield path.name, p.name, p.version, p.content_hash()


@pytest.mark.parametrize("file,name,version,digest", list(_bundled()), ids=lambda v: str(v)[:16])
def test_bundled_content_matches_its_published_version(file, name, version, digest):
    known = PUBLISHED.get((name, version))
    assert known is not None, f"{file}: {name} {version} is new; record its hash {digest} in PUBLISHED"
    assert digest == known, (f"{file}: the content of {name} {version} changed (hash {digest}, published "
                             f"{known}); bump its version and record the new hash")
