"""GPU presets: memory, memory bandwidth, dense bf16 FLOP/s, the GPU-to-GPU link and the
hourly price of the GPUs a run can name.

``gpu.name`` picks a preset (``GpuConfig``); explicit ``gpu.*`` figures override it.
Each preset holds its vendor datasheet figures (``docs/presets.md`` names the
datasheets). The roofline (``cost.py``) does not use the datasheet peaks: it uses
what a GPU achieves. stepplan measured that on the lent H200 (the copy ceiling and
a large bf16 matmul, SPEC §4), so the H200 keeps those two measured figures exactly,
and every other preset is its datasheet figure times the fraction the H200 achieved
of its own datasheet figure (:data:`ACHIEVED_BW_FRACTION`,
:data:`ACHIEVED_FLOPS_FRACTION`): an estimate, until someone measures that GPU.

The link (NVLink, or PCIe for a GPU without it) times tensor parallelism's all-reduces
(``parallel.py``): its datasheet bandwidth per direction, and a latency per ring step
(datasheets give none: NCCL's own cost model's figure). The hourly price is one
provider's list price for one GPU (``docs/presets.md`` names it and its date); it only
turns a run's GPU time into dollars.
"""

from __future__ import annotations

import attrs

#: NCCL's cost model (``src/graph/tuning.cc``, ``hwLat``, ring, LL128) charges each step
#: of a ring 1.9 µs over NVLink and 2.5 µs over PCIe.
NVLINK_STEP_US = 1.9
PCIE_STEP_US = 2.5


@attrs.frozen
class Link:
    """A GPU-to-GPU link.

    Attributes:
        name: in words (``NVLink 4``).
        bw_bytes_s: its datasheet bandwidth per direction (half the bidirectional total
            datasheets state: a ring all-reduce sends and receives at once).
        step_latency_us: the latency of one step of a ring all-reduce over it.
    """

    name: str
    bw_bytes_s: float
    step_latency_us: float


NVLINK_3 = Link("NVLink 3", 300e9, NVLINK_STEP_US)  # 600 GB/s bidirectional
NVLINK_4 = Link("NVLink 4", 450e9, NVLINK_STEP_US)  # 900 GB/s bidirectional
NVLINK_5 = Link("NVLink 5", 900e9, NVLINK_STEP_US)  # 1.8 TB/s bidirectional
PCIE_GEN4 = Link("PCIe Gen4 x16", 32e9, PCIE_STEP_US)  # 64 GB/s bidirectional


@attrs.frozen
class GpuPreset:
    """One GPU's figures.

    Attributes:
        name: what ``gpu.name`` says (compared case-insensitively).
        part: the exact part the figures are for.
        memory_gb: device memory, datasheet GB (10^9 bytes).
        datasheet_bw_bytes_s: peak memory bandwidth, datasheet.
        datasheet_flops: dense (no sparsity) bf16 tensor FLOP/s, datasheet.
        link: its link to the other GPUs of its node.
        price_per_hour: US dollars per GPU-hour (``docs/presets.md``: source and date).
        measured_bw_bytes_s, measured_flops: stepplan's own measurements on this GPU,
            or ``None`` (then derived, see the module docstring).
    """

    name: str
    part: str
    memory_gb: float
    datasheet_bw_bytes_s: float
    datasheet_flops: float
    link: Link
    price_per_hour: float
    measured_bw_bytes_s: float | None = None
    measured_flops: float | None = None

    @property
    def memory_bw_bytes_s(self) -> float:
        """The bandwidth the roofline uses: measured, else derived from the datasheet."""
        if self.measured_bw_bytes_s is not None:
            return self.measured_bw_bytes_s
        return self.datasheet_bw_bytes_s * ACHIEVED_BW_FRACTION

    @property
    def peak_flops(self) -> float:
        """The FLOP/s the roofline uses: measured, else derived from the datasheet."""
        if self.measured_flops is not None:
            return self.measured_flops
        return self.datasheet_flops * ACHIEVED_FLOPS_FRACTION

    @property
    def link_bw_bytes_s(self) -> float:
        """The link's bandwidth per direction (``gpu.link_bw_bytes_s`` overrides it)."""
        return self.link.bw_bytes_s

    @property
    def link_latency_us(self) -> float:
        """The link's latency per ring step (``gpu.link_latency_us`` overrides it)."""
        return self.link.step_latency_us

    @property
    def figures(self) -> str:
        """Where the roofline figures come from, in words (for the summary)."""
        if self.measured_bw_bytes_s is not None and self.measured_flops is not None:
            return f"measured by stepplan on the {self.name}"
        return (
            f"{self.name} datasheet x the fractions achieved on the H200 "
            f"({ACHIEVED_BW_FRACTION:.4f} of bandwidth, {ACHIEVED_FLOPS_FRACTION:.4f} of FLOP/s)"
        )


#: Where the presets' hourly prices come from (``docs/presets.md`` has the table).
PRICE_SOURCE = (
    "RunPod's list price per GPU (docs.runpod.io/serverless/pricing, active worker, "
    "per second x 3600), read 2026-12-06"
)

_H200 = GpuPreset(
    "H200",
    "H200 SXM 141 GB",
    memory_gb=141.0,
    datasheet_bw_bytes_s=4.8e12,
    datasheet_flops=989.5e12,  # 1,979 TFLOPS with sparsity, half without
    link=NVLINK_4,
    price_per_hour=4.464,
    measured_bw_bytes_s=4.26e12,  # copy ceiling (SPEC §4)
    measured_flops=790e12,  # bf16 matmul
)
#: Fractions of its datasheet figures the H200 achieved in stepplan's measurements.
ACHIEVED_BW_FRACTION = 4.26e12 / 4.8e12
ACHIEVED_FLOPS_FRACTION = 790e12 / 989.5e12

#: Every preset, by name.
GPU_PRESETS: dict[str, GpuPreset] = {
    preset.name: preset
    for preset in (
        GpuPreset("H100", "H100 SXM 80 GB", 80.0, 3.35e12, 989.5e12, NVLINK_4, 3.348),
        _H200,
        GpuPreset("B200", "B200 (HGX B200, per GPU)", 180.0, 8.0e12, 2250e12, NVLINK_5, 6.84),
        GpuPreset("A100", "A100 SXM 80 GB", 80.0, 2.039e12, 312e12, NVLINK_3, 2.16),
        GpuPreset("L40S", "L40S 48 GB", 48.0, 0.864e12, 362.05e12, PCIE_GEN4, 1.332),
    )
}
#: A ``gpu.name`` with no preset: every figure must then be given.
CUSTOM = "custom"


def known_names() -> str:
    """The names ``gpu.name`` accepts, for error messages."""
    return ", ".join([*GPU_PRESETS, CUSTOM])


def find_preset(name: str) -> GpuPreset | None:
    """The preset called ``name`` (any case); ``None`` for ``custom``. An unknown name
    raises ``KeyError`` naming the known ones."""
    if name.lower() == CUSTOM:
        return None
    for key, preset in GPU_PRESETS.items():
        if key.lower() == name.lower():
            return preset
    raise KeyError(f"unknown GPU {name!r} (known: {known_names()})")


def preset_for_device(device: str) -> GpuPreset | None:
    """The preset whose name appears in a device string such as ``NVIDIA H200`` or
    ``NVIDIA A100-SXM4-80GB`` (``torch.cuda.get_device_name``); ``None`` when none does."""
    text = device.upper()
    matches = [p for key, p in GPU_PRESETS.items() if key.upper() in text]
    return max(matches, key=lambda p: len(p.name)) if matches else None


def profile_scale(device: str, memory_bw_bytes_s: float) -> float:
    """Factor on the times of a short-conv profile measured on ``device`` when the
    simulated GPU has ``memory_bw_bytes_s``: the kernels are memory-bound, so the
    bandwidth ratio; 1 when ``device`` names no preset (nothing to scale from)."""
    preset = preset_for_device(device)
    return 1.0 if preset is None else preset.memory_bw_bytes_s / memory_bw_bytes_s
