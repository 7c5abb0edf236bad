"""Accelerators and networks the planner knows, with the vendor figures they come from.

Peak FLOP/s are dense (no 2:4 sparsity) tensor-core figures from the vendors' datasheets; memory is
the usable HBM/GDDR capacity as sold. Bandwidths are per GPU and per direction.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, replace

TERA = 10**12
GB = 10**9  # vendors quote decimal gigabytes
GIB = 1 << 30


def _require(condition: bool, name: str, rule: str) -> None:
    if not condition:
        raise ValueError(f"{name} {rule}")


@dataclass(frozen=True, kw_only=True)
class GpuSpec:
    name: str
    peak_bf16_flops: float  # dense, per GPU
    peak_fp8_flops: float | None  # None: no fp8 tensor cores
    # Dense FP32 on the CUDA cores (no TF32: torch leaves fp32 matmuls at "highest" precision),
    # the rate of the stages that train in fp32 (post-training on the worker).
    peak_fp32_flops: float
    memory_bytes: int
    intra_node_bandwidth: float  # bytes/s per GPU, one direction (NVLink, or PCIe without it)
    has_nvlink: bool
    source: str

    def __post_init__(self) -> None:
        _require(self.peak_bf16_flops > 0, "peak_bf16_flops", "must be positive")
        _require(self.peak_fp32_flops > 0, "peak_fp32_flops", "must be positive")
        _require(self.peak_fp8_flops is None or self.peak_fp8_flops > 0, "peak_fp8_flops", "must be positive or None")
        _require(self.memory_bytes > 0, "memory_bytes", "must be positive")
        _require(self.intra_node_bandwidth > 0, "intra_node_bandwidth", "must be positive")

    @property
    def supports_fp8(self) -> bool:
        return self.peak_fp8_flops is not None


GPUS: dict[str, GpuSpec] = {
    spec.name: spec
    for spec in (
        GpuSpec(
            name="H100-SXM", peak_bf16_flops=989.4 * TERA, peak_fp8_flops=1978.9 * TERA, memory_bytes=80 * GB,
            peak_fp32_flops=67 * TERA, intra_node_bandwidth=450 * GB, has_nvlink=True,
            source="NVIDIA H100 Tensor Core GPU datasheet (SXM5): BF16 1,979 TFLOPS and FP8 3,958 TFLOPS with "
            "sparsity (half dense), FP32 67 TFLOPS, 80 GB HBM3, NVLink 900 GB/s bidirectional",
        ),
        GpuSpec(
            name="H200", peak_bf16_flops=989.4 * TERA, peak_fp8_flops=1978.9 * TERA, memory_bytes=141 * GB,
            peak_fp32_flops=67 * TERA, intra_node_bandwidth=450 * GB, has_nvlink=True,
            source="NVIDIA H200 Tensor Core GPU datasheet (SXM): BF16 1,979 TFLOPS and FP8 3,958 TFLOPS with "
            "sparsity (half dense), FP32 67 TFLOPS, 141 GB HBM3e, NVLink 900 GB/s bidirectional",
        ),
        GpuSpec(
            name="A100-80GB", peak_bf16_flops=312 * TERA, peak_fp8_flops=None, memory_bytes=80 * GB,
            peak_fp32_flops=19.5 * TERA, intra_node_bandwidth=300 * GB, has_nvlink=True,
            source="NVIDIA A100 Tensor Core GPU datasheet (SXM 80GB): BF16 312 TFLOPS dense, FP32 19.5 TFLOPS, no FP8, "
            "80 GB HBM2e, NVLink 600 GB/s bidirectional",
        ),
        GpuSpec(
            name="H100-PCIe", peak_bf16_flops=756.5 * TERA, peak_fp8_flops=1513 * TERA, memory_bytes=80 * GB,
            peak_fp32_flops=51 * TERA, intra_node_bandwidth=64 * GB, has_nvlink=False,
            source="NVIDIA H100 Tensor Core GPU datasheet (PCIe): BF16 1,513 TFLOPS and FP8 3,026 TFLOPS with "
            "sparsity (half dense), FP32 51 TFLOPS, 80 GB HBM2e; NVLink bridges join pairs only, so a node's GPUs meet over "
            "PCIe Gen5 x16 (128 GB/s bidirectional)",
        ),
        GpuSpec(
            name="A100-40GB-PCIe", peak_bf16_flops=312 * TERA, peak_fp8_flops=None, memory_bytes=40 * GB,
            peak_fp32_flops=19.5 * TERA, intra_node_bandwidth=32 * GB, has_nvlink=False,
            source="NVIDIA A100 Tensor Core GPU datasheet (PCIe 40GB): BF16 312 TFLOPS dense, FP32 19.5 TFLOPS, no FP8, "
            "40 GB HBM2; NVLink bridges join pairs only (PCIe Gen4 x16: 64 GB/s bidirectional)",
        ),
        GpuSpec(
            name="L40S", peak_bf16_flops=362.05 * TERA, peak_fp8_flops=733 * TERA, memory_bytes=48 * GB,
            peak_fp32_flops=91.6 * TERA, intra_node_bandwidth=32 * GB, has_nvlink=False,
            source="NVIDIA L40S datasheet: BF16 362.05 TFLOPS and FP8 733 TFLOPS dense, FP32 91.6 TFLOPS, 48 GB GDDR6, "
            "no NVLink (PCIe Gen4 x16: 64 GB/s bidirectional)",
        ),
        GpuSpec(
            name="CPU", peak_bf16_flops=0.192 * TERA, peak_fp8_flops=None, memory_bytes=8 * GIB,
            peak_fp32_flops=0.192 * TERA, intra_node_bandwidth=10 * GB, has_nvlink=False,
            source="nominal x86-64 host for the embedded default: 2 cores x 3.0 GHz x 32 FP32 FLOP/cycle "
            "(two 256-bit FMA units), the same for bf16 (no bf16 units assumed); 8 GiB for training; memory copy ~10 GB/s",
        ),
    )
}


class Network(str, enum.Enum):
    """The inter-node fabric a booking names."""

    INFINIBAND = "infiniband"
    ROCE = "roce"
    ETHERNET = "ethernet"


@dataclass(frozen=True, kw_only=True)
class NetworkSpec:
    kind: Network
    bandwidth: float  # bytes/s per GPU, one direction
    link_gbit_per_s: int  # the nominal link speed `bandwidth` is for (a booking's label may name another)
    source: str


NETWORKS: dict[Network, NetworkSpec] = {
    Network.INFINIBAND: NetworkSpec(
        kind=Network.INFINIBAND, bandwidth=50 * GB, link_gbit_per_s=400,
        source="one NDR 400 Gb/s ConnectX-7 adapter per GPU (NVIDIA DGX H100 reference architecture)",
    ),
    Network.ROCE: NetworkSpec(
        kind=Network.ROCE, bandwidth=50 * GB, link_gbit_per_s=400,
        source="one 400 GbE RoCEv2 NIC per GPU (the Llama 3 training clusters, Dubey et al. 2024, section 3.3)",
    ),
    Network.ETHERNET: NetworkSpec(
        kind=Network.ETHERNET, bandwidth=100 / 8 * GB / 8, link_gbit_per_s=100,
        source="one 100 GbE TCP link per node shared by 8 GPUs (commodity cloud instances without RDMA)",
    ),
}

# Below this inter-node bandwidth per GPU, a fabric is "slow": all-gathering a full shard across
# nodes every layer costs more than keeping a replica per node. 25 GB/s = a 200 Gb/s RDMA NIC per
# GPU, the smallest fabric the DGX/HGX reference designs use.
SLOW_INTERCONNECT_BANDWIDTH = 25 * GB


def gpu_spec(name: str) -> GpuSpec:
    if name not in GPUS:
        raise ValueError(f"gpu_type must be one of {sorted(GPUS)}")
    return GPUS[name]


def network_spec(kind: str | Network) -> NetworkSpec:
    try:
        return NETWORKS[Network(kind)]
    except ValueError:
        raise ValueError(f"network must be one of {[n.value for n in Network]}") from None


MAX_LINK_GBIT_PER_S = 100_000

# How a booking's network label names its fabric: the desk writes labels like `ib-400g`,
# `roce-400g` or `eth-100g`; the planner needs the kind.
_NETWORK_PREFIXES = {"ib": Network.INFINIBAND, "infiniband": Network.INFINIBAND, "roce": Network.ROCE,
                     "eth": Network.ETHERNET, "ethernet": Network.ETHERNET, "tcp": Network.ETHERNET}


# A model name alone is planned by what the booking's topology says of the node's links: NVLink
# (`nvlink` or `sxm` among its words, `pcie` not) is the NVLink board; otherwise the model's most
# constrained variant in the catalogue (the least memory, the slowest links and FLOPS), so that a
# plan which fits it fits every machine the name may mean.
_MODEL_NAMES = {"h100": ("H100-SXM", "H100-PCIe"), "a100": ("A100-80GB", "A100-40GB-PCIe"), "h200": ("H200", "H200"),
                "l40s": ("L40S", "L40S")}


def _says_nvlink(topology: str) -> bool:
    words = set(re.split(r"[^a-z0-9]+", topology.lower()))
    return bool(words & {"nvlink", "sxm"}) and "pcie" not in words


def booked_gpu(label: str, topology: str = "") -> GpuSpec:
    """The GPU a booking's `gpu_type` names: a planner name exactly (any case), or a model name
    read with the booking's `topology` (`H100` with `1x8-nvlink` is `H100-SXM`; with `2x4-pcie`
    or a topology that says neither, `H100-PCIe`); anything else is not a GPU the planner can price."""
    name = label.lower()
    if name in _MODEL_NAMES:
        linked, constrained = _MODEL_NAMES[name]
        return GPUS[linked if _says_nvlink(topology) else constrained]
    by_lower = {gpu.lower(): spec for gpu, spec in GPUS.items()}
    if name not in by_lower:
        raise ValueError(f"the booked gpu_type is none of {sorted(GPUS)} (or a model name: {sorted(n.upper() for n in _MODEL_NAMES)})")
    return by_lower[name]


def booked_network(label: str) -> NetworkSpec:
    """The fabric a booking's network label names, `<kind>` or `<kind>-<speed>g` (`ib-400g`,
    `roce-100g`, `eth-25g`). A speed scales the fabric's bandwidth from the link speed its figure is
    for, in the same arrangement (`ib-100g`: a 100 Gb/s NIC per GPU, a quarter of NDR's), so a slower
    fabric is never priced as a faster one; a speed that cannot be read is not plannable."""
    parts = label.lower().replace("_", "-").split("-", 1)
    if parts[0] not in _NETWORK_PREFIXES:
        raise ValueError(f"the booked network is none of {sorted(_NETWORK_PREFIXES)} (optionally -<speed>g)")
    spec = NETWORKS[_NETWORK_PREFIXES[parts[0]]]
    speed = _link_speed(parts[1]) if len(parts) == 2 else spec.link_gbit_per_s
    if speed == spec.link_gbit_per_s:
        return spec
    return replace(spec, bandwidth=spec.bandwidth * speed / spec.link_gbit_per_s, link_gbit_per_s=speed,
                   source=f"{spec.source}, scaled to the booked {speed} Gb/s links")


def _link_speed(text: str) -> int:
    """Gb/s from `400g` or `400` (ASCII digits only, 1 to 100,000: beyond any link sold)."""
    digits = text[:-1] if text.endswith("g") else text
    if not (digits.isascii() and digits.isdigit() and len(digits) <= 6 and 1 <= int(digits) <= MAX_LINK_GBIT_PER_S):
        raise ValueError(f"the booked network's speed is not <1-{MAX_LINK_GBIT_PER_S}>g")
    return int(digits)
