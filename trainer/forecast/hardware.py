"""The one table of hardware figures the predicted hours use (:data:`HARDWARE`), with a source for
each, and the utilisations applied to them (:data:`MFU`, :data:`MBU`); drmas_trainer.forecast.hours is the
model that uses them. None of these figures was fitted to a measured or reported run time.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Hardware:
    """One GPU kind's published figures (one table, :data:`HARDWARE`)."""

    title: str
    memory_gib: float  # what the driver reports (nvidia-smi), GiB: --gpu-memory's default for this GPU
    hbm_bytes_s: float  # GPU memory bandwidth, bytes/s
    bf16_flops: float  # dense bf16 tensor-core peak, FLOP/s (the sparse figure is twice this)
    nvlink_bytes_s: float  # GPU-GPU, one direction, bytes/s (half the bidirectional figure)
    pcie_bytes_s: float  # host-GPU, one direction, bytes/s
    host_bytes_s: float  # host memory bandwidth of the node (all CPU sockets), bytes/s
    gpus_per_node: int  # GPUs sharing that host memory
    source: str
    mfu: float | None = None  # None: the table's MFU (a datasheet peak); 1 for a measured rate (hardware_probe)
    mbu: float | None = None  # None: the table's MBU

    @property
    def flops_used(self) -> float:
        """The FLOP/s the hours model computes at: the peak x MFU (a measured rate as it is)."""
        return self.bf16_flops * (MFU if self.mfu is None else self.mfu)

    @property
    def bytes_used(self) -> float:
        """The memory bandwidth the hours model decodes at: the peak x MBU (a measured rate as it is)."""
        return self.hbm_bytes_s * (MBU if self.mbu is None else self.mbu)


#: Every hardware figure of the hours model, with its source. None of them was fitted to anything.
HARDWARE: dict[str, Hardware] = {
    # NVIDIA H100 Tensor Core GPU datasheet (SXM5): 80 GB HBM3 at 3.35 TB/s, 989 TFLOPS bf16 dense
    # (1,979 with sparsity), NVLink 900 GB/s, PCIe Gen5 128 GB/s (both bidirectional); nvidia-smi
    # reports 81,559 MiB. Host: DGX H100, 2 x Xeon 8480C, 8 DDR5-4800 channels each (8 x 38.4 GB/s
    # per socket, Intel ark).
    "h100": Hardware("NVIDIA H100 SXM5 80 GB", 81_559 / 1024, 3.35e12, 989e12, 450e9, 64e9, 2 * 8 * 38.4e9, 8,
                     "NVIDIA H100 datasheet; DGX H100 host (2 x Xeon 8480C, DDR5-4800)"),
    # NVIDIA H200 Tensor Core GPU datasheet (SXM): 141 GB HBM3e at 4.8 TB/s, bf16 as H100 (989 dense),
    # NVLink 900 GB/s, PCIe Gen5 128 GB/s; nvidia-smi reports 143,771 MiB. Host: DGX H200, as DGX H100.
    "h200": Hardware("NVIDIA H200 SXM 141 GB", 143_771 / 1024, 4.8e12, 989e12, 450e9, 64e9, 2 * 8 * 38.4e9, 8,
                     "NVIDIA H200 datasheet; DGX H200 host (2 x Xeon 8480C, DDR5-4800)"),
    # NVIDIA A100 Tensor Core GPU datasheet (SXM4 80 GB): HBM2e at 2,039 GB/s, 312 TFLOPS bf16 dense,
    # NVLink 600 GB/s, PCIe Gen4 64 GB/s (both bidirectional); nvidia-smi reports 81,920 MiB. Host:
    # DGX A100, 2 x EPYC 7742, 8 DDR4-3200 channels each (8 x 25.6 GB/s per socket, AMD).
    "a100": Hardware("NVIDIA A100 SXM4 80 GB", 81_920 / 1024, 2.039e12, 312e12, 300e9, 32e9, 2 * 8 * 25.6e9, 8,
                     "NVIDIA A100 datasheet; DGX A100 host (2 x EPYC 7742, DDR4-3200)"),
}

#: Model FLOPs utilisation of the FLOP-bound phases (prefill, the update): Meta's Llama 3 training
#: reports 38-43 % bf16 MFU on H100s ("The Llama 3 Herd of Models", 2024, table 4); we take 0.40.
MFU = 0.40
#: Memory-bandwidth utilisation of decoding: Databricks measured about 60 % MBU for 7B-class models
#: on A100 and H100 at small batch ("LLM Inference Performance Engineering: Best Practices", 2023).
MBU = 0.60


def hardware_for(name: str | None, gpu_gib: float | None) -> tuple[str, Hardware]:
    """The hardware row named ``name``, else by the plan's --gpu-memory ``gpu_gib``: over 100 GiB an
    H200, else an H100 (an A100 only by name), else the H200 (the memory plan's default). This
    machine, measured (``--gpu here``), is drmas_trainer.forecast.hardware_probe's."""
    if name:
        return name, HARDWARE[name]
    key = "h100" if gpu_gib is not None and gpu_gib <= 100 else "h200"
    return key, HARDWARE[key]
