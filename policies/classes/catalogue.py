"""NVIDIA GPU models that gpuadm knows by name, beyond the ones a policy lists.

HAMi and Volcano match `nvidia.com/use-gputype` as a case-insensitive substring of the type a
node registers its GPUs under, so a class whose use-list is `NVIDIA A10` would also land on
an `NVIDIA A100-PCIE-40GB` that no class of the policy names. gpuadm excludes, through
`nvidia.com/nouse-gputype`, every GPU name it knows that the use-list would also match: the
policy's models and the names below (`policies.classes.models.gputype_annotations`).

Each entry is a product name as the driver reports it (`nvidia-smi --query-gpu=name`, NVML's
`nvmlDeviceGetName`), for data-centre and workstation GPUs, which are what Kubernetes GPU
nodes hold. A GPU missing here is not excluded by a use-list that happens to match it:
adding its name is the fix, and docs/backends.md says how to find one.

The sources, per family:

- NVIDIA's driver README, "Supported NVIDIA GPU Products" (the table of product names and
  PCI IDs that NVML reports by; the open kernel modules carry the same table in their
  README.md, NVIDIA/open-gpu-kernel-modules, release 560.31.02): Turing and later.
- Names seen from the driver on real machines (nvidia-smi, NVML, CUDA's device name) in
  public issue threads, benchmark reports and cloud providers' GPU lists: older Tesla GPUs,
  which that README no longer lists, and the Blackwell GPUs newer than release 560.
"""

from __future__ import annotations

# Pascal and Volta (pre-Turing Tesla). Not in the open modules' table (Turing and later);
# the names are the driver's as printed by nvidia-smi and CUDA in public job logs and
# reports, and HAMi's own registration examples (Project-HAMi/HAMi docs/develop/protocol.md:
# `NVIDIA-Tesla V100-PCIE-32GB`; pkg/ tests: `NVIDIA-Tesla P4`).
_PASCAL_VOLTA = (
    "Tesla P4",
    "Tesla P40",
    "Tesla P100-PCIE-12GB",
    "Tesla P100-PCIE-16GB",
    "Tesla P100-SXM2-16GB",
    "Tesla V100-SXM2-16GB",
    "Tesla V100-SXM2-32GB",
    "Tesla V100-PCIE-16GB",
    "Tesla V100-PCIE-32GB",
    "Tesla V100-FHHL-16GB",
    "Tesla V100S-PCIE-32GB",
)

# Turing: driver README table (1EB8 Tesla T4, 1EB4 NVIDIA T4G, Quadro RTX 1E30/1E36/1E78,
# 1EB0/1EB5 and 1EB1).
_TURING = (
    "Tesla T4",
    "NVIDIA T4G",
    "Quadro RTX 4000",
    "Quadro RTX 5000",
    "Quadro RTX 6000",
    "Quadro RTX 8000",
)

# Ampere data centre: driver README table (20B0-20FD, 2235-2238, 25B6).
_AMPERE = (
    "NVIDIA A100-SXM4-40GB",
    "NVIDIA A100-SXM4-80GB",
    "NVIDIA A100-SXM-64GB",
    "NVIDIA A100-PCIE-40GB",
    "NVIDIA A100 80GB PCIe",
    "NVIDIA A800-SXM4-40GB",
    "NVIDIA A800-SXM4-80GB",
    "NVIDIA A800 80GB PCIe",
    "NVIDIA A800 80GB PCIe LC",
    "NVIDIA A800 40GB Active",
    "NVIDIA A30",
    "NVIDIA A40",
    "NVIDIA A10",
    "NVIDIA A10G",
    "NVIDIA A10M",
    "NVIDIA A16",
    "NVIDIA A2",
)

# Ampere workstation (RTX A series): driver README table (2230-2233, 24B0, 2531, 2571).
_AMPERE_RTX = (
    "NVIDIA RTX A2000",
    "NVIDIA RTX A2000 12GB",
    "NVIDIA RTX A4000",
    "NVIDIA RTX A4500",
    "NVIDIA RTX A5000",
    "NVIDIA RTX A5500",
    "NVIDIA RTX A6000",
)

# Hopper: driver README table (2321-233A, 2342). `NVIDIA H100` (2339) is a name of its own,
# a substring of every other H100's; `NVIDIA H20` is one of `NVIDIA H200`'s (HAMi-core#137).
_HOPPER = (
    "NVIDIA H100",
    "NVIDIA H100 80GB HBM3",
    "NVIDIA H100 PCIe",
    "NVIDIA H100 NVL",
    "NVIDIA H800",
    "NVIDIA H800 PCIe",
    "NVIDIA H800 NVL",
    "NVIDIA H20",
    "NVIDIA H200",
    "NVIDIA GH200 120GB",
    "NVIDIA GH200 480GB",
)

# Hopper newer than the 560 table: the H200 NVL as nvidia-smi prints it in public benchmark
# reports (8 x `NVIDIA H200 NVL`, 143771 MiB each); the GH200 with 144 GB of HBM3e as
# NVIDIA/mig-parted#139 names it (device 0x2348).
_HOPPER_LATER = ("NVIDIA H200 NVL", "NVIDIA GH200 144G HBM3e")

# Ada Lovelace data centre and workstation: driver README table (26B1-26BA, 27B0-27B8,
# 28B0).
_ADA = (
    "NVIDIA L2",
    "NVIDIA L4",
    "NVIDIA L20",
    "NVIDIA L40",
    "NVIDIA L40S",
    "NVIDIA RTX 2000 Ada Generation",
    "NVIDIA RTX 4000 SFF Ada Generation",
    "NVIDIA RTX 4000 Ada Generation",
    "NVIDIA RTX 4500 Ada Generation",
    "NVIDIA RTX 5000 Ada Generation",
    "NVIDIA RTX 5880 Ada Generation",
    "NVIDIA RTX 6000 Ada Generation",
)

# Blackwell, newer than the 560 table: the names nvidia-smi prints on cloud machines, as
# providers list them by GPU id (Runpod's GPU types reference: `NVIDIA B200`,
# `NVIDIA B300 SXM6 AC`) and as public run logs show them (`NVIDIA GB200`,
# `NVIDIA RTX PRO 6000 Blackwell Server Edition` / `Workstation Edition`).
_BLACKWELL = (
    "NVIDIA B200",
    "NVIDIA B300 SXM6 AC",
    "NVIDIA GB200",
    "NVIDIA RTX PRO 6000 Blackwell Server Edition",
    "NVIDIA RTX PRO 6000 Blackwell Workstation Edition",
)

GPU_NAMES: tuple[str, ...] = (
    *_PASCAL_VOLTA,
    *_TURING,
    *_AMPERE,
    *_AMPERE_RTX,
    *_HOPPER,
    *_HOPPER_LATER,
    *_ADA,
    *_BLACKWELL,
)
"""Every GPU name of the catalogue, in the driver's spelling, each once."""
