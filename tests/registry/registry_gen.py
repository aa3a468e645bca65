"""Valid HCD texts generated in memory, so tests and benchmarks need no fixture files."""

from __future__ import annotations

from pathlib import Path

TEMPLATE = """\
chip:
  name: {name}
  vendor: generated
  version: {version}
  device_type: gen_chip
compute_units:
  fp16:
    count: {count}
    peak_tflops: {peak}
    supported_layouts: [NCHW, NHWC]
  int8:
    count: 64
    peak_tops: 8.0
  attention:
    enabled: true
    max_sequence_length: 2048
    supported_heads: [1, 2, 4, 8]
memory:
  on_chip_cache:
    size_kb: {cache_kb}
    bandwidth_gb_per_s: 512
  off_chip_memory:
    bandwidth_gb_per_s: 64
tensor:
  max_rank: 6
  supported_dtypes: [torch.float16, torch.int8]
  default_layout: NCHW
constraints:
  max_batch_size: 256
  max_sequence_length: 4096
  memory_alignment_bytes: {alignment}
"""


def hcd_text(name: str, version: str = "1.0.0", *, count: int = 128, peak: float = 12.8,
             cache_kb: int = 4096, alignment: int = 256) -> str:
    return TEMPLATE.format(name=name, version=version, count=count, peak=peak, cache_kb=cache_kb,
                           alignment=alignment)


def write_hcds(folder: Path, specs) -> list[str]:
    """Write ``(filename, text)`` pairs; return their paths."""
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for filename, text in specs:
        p = folder / filename
        p.write_text(text)
        out.append(str(p))
    return out


def many(prefix: str, n: int, version: str = "1.0.0") -> list[tuple[str, str]]:
    """``n`` distinct chips ``{prefix}-0000...``."""
    return [(f"{prefix.lower()}_{i:04d}.hcd", hcd_text(f"{prefix}-{i:04d}", version, count=16 + i))
            for i in range(n)]


MINI_PACK = """\
pack:
  name: mini
  version: {version}
  description: smallest real pack, for registry tests
rules:
  - op: aten.relu.default
    kernel: relu
    args: {{self: tensor}}
    bind: {{a: self}}
    note: {note}
"""


def pack_text(version: str = "1.0.0", note: str = "first") -> str:
    return MINI_PACK.format(version=version, note=note)


def one_chip_registry(url: str, tmp_path: Path):
    """An initialised Registry at ``url`` holding chip ``A-1`` and the mini rule pack (the
    smallest registry a fidelity run can be recorded in); the caller closes it."""
    from torchfl.registry import Registry

    r = Registry(url)
    r.init()
    r.import_texts([("a.hcd", hcd_text("A-1"))])
    pack = tmp_path / "mini.yaml"
    pack.write_text(pack_text())
    r.import_files([pack])
    return r
