"""What the hardware reports of the GPU models gpuadm knows: the memory NVML counts, and the
MIG profiles each offers, with the memory of each and how many fit one GPU.

A class's `memory` sizes its shares, and the stacks fit shares against what NVML reports
(HAMi registers it; GPU Feature Discovery labels it `nvidia.com/gpu.memory`), not against the
marketing figure: an H200 sold as 141 GB reports 143771 MiB, and two halves of 141Gi (72192
MiB each) do not fit it. A MIG profile's name is not its memory either: an H200's `1g.18gb`
holds 16 GiB. Only figures read from a real GPU are here, each with where it was seen:

- total memory (`nvidia-smi --query-gpu=name,memory.total`): public nvidia-smi output with
  the driver that printed it, named per model below;
- MIG profiles: names and how many instances fit, from NVIDIA's MIG user guide ("Supported
  MIG Profiles"); the memory of each as `nvidia-smi mig -lgip` prints it, where a public
  output shows it. The figures move a little with the driver (an H200's `1g.35gb` is 32.25
  GiB under older drivers, 32.50 under 580): each is the largest seen, so that memory
  declared above it is above what any driver gives.

A model or a profile without a figure is one no real output was found for: nothing is said
of it, rather than a guess.
"""

from __future__ import annotations

from dataclasses import dataclass

GiB_IN_MIB = 1024


@dataclass(frozen=True, slots=True)
class MigProfile:
    """A MIG GPU instance profile: its name, the MiB it holds (None: no output seen), and
    how many instances of it fit one GPU."""

    name: str
    memory_mib: int | None
    instances: int


@dataclass(frozen=True, slots=True)
class Hardware:
    """A GPU model as the driver reports it: MiB of memory (None: no output seen), and the
    MIG profiles it offers (none: not MIG-capable, or not known)."""

    memory_mib: int | None
    mig: tuple[MigProfile, ...] = ()

    def profile(self, name: str) -> MigProfile | None:
        """Return the MIG profile of this name, or None if the model offers none of it."""
        return next((p for p in self.mig if p.name == name), None)


def _gib(value: float) -> int:
    return round(value * GiB_IN_MIB)


# An H200, measured (driver 580.159.04): `nvidia-smi mig -lgip`.
_H200_MIG = (
    MigProfile("1g.18gb", _gib(16.00), 7),
    MigProfile("1g.18gb+me", _gib(16.00), 1),
    MigProfile("1g.35gb", _gib(32.50), 4),
    MigProfile("2g.35gb", _gib(32.50), 3),
    MigProfile("3g.71gb", _gib(69.75), 2),
    MigProfile("4g.71gb", _gib(69.75), 1),
    MigProfile("7g.141gb", _gib(140.00), 1),
)
# A100 80GB: the `-lgip` output and a MIG device of 9728 MiB in kata-containers'
# docs/use-cases/GPU-passthrough-and-Kata.md.
_A100_80GB_MIG = (
    MigProfile("1g.10gb", _gib(9.50), 7),
    MigProfile("1g.10gb+me", _gib(9.50), 1),
    MigProfile("1g.20gb", None, 4),
    MigProfile("2g.20gb", _gib(19.50), 3),
    MigProfile("3g.40gb", None, 2),
    MigProfile("4g.40gb", None, 1),
    MigProfile("7g.80gb", None, 1),
)
# A100 40GB: the `-lgip` output in harvester/pcidevices pkg/util/gpuhelper/mig_test.go; an
# A100-SXM4-40GB under driver 450.80.02 (seansiddens/mps-test README.md) printed a little less
# for the larger profiles (9.62, 19.50, 39.25).
_A100_40GB_MIG = (
    MigProfile("1g.5gb", _gib(4.75), 7),
    MigProfile("1g.5gb+me", _gib(4.75), 1),
    MigProfile("1g.10gb", _gib(9.75), 4),
    MigProfile("2g.10gb", _gib(9.75), 3),
    MigProfile("3g.20gb", _gib(19.625), 2),
    MigProfile("4g.20gb", _gib(19.625), 1),
    MigProfile("7g.40gb", _gib(39.50), 1),
)
# H100 80GB HBM3 (SXM5): the `-lgip` output in stackhpc/ansible-slurm-appliance docs/mig.md.
_H100_80GB_MIG = (
    MigProfile("1g.10gb", _gib(9.75), 7),
    MigProfile("1g.10gb+me", _gib(9.75), 1),
    MigProfile("1g.20gb", _gib(19.625), 4),
    MigProfile("2g.20gb", _gib(19.625), 3),
    MigProfile("3g.40gb", _gib(39.50), 2),
    MigProfile("4g.40gb", _gib(39.50), 1),
    MigProfile("7g.80gb", _gib(79.25), 1),
)
# H100 PCIe: the same profiles as the SXM part (MIG user guide); their memory not seen.
_H100_PCIE_MIG = tuple(MigProfile(p.name, None, p.instances) for p in _H100_80GB_MIG)
# H100 NVL: the `-lgip` output in NVIDIA/gpu-operator#900 and NVIDIA/mig-parted#101.
_H100_NVL_MIG = (
    MigProfile("1g.12gb", _gib(10.75), 7),
    MigProfile("1g.12gb+me", _gib(10.75), 1),
    MigProfile("1g.24gb", _gib(21.625), 4),
    MigProfile("2g.24gb", _gib(21.625), 3),
    MigProfile("3g.47gb", _gib(46.375), 2),
    MigProfile("4g.47gb", None, 1),
    MigProfile("7g.94gb", None, 1),
)
# B200: NVIDIA/mig-parted#166 and #187 and NVIDIA/gpu-operator#1242 and #1351 (the 1g.23gb
# profile is 22.00 GiB in the first, 20.50 in the later ones).
_B200_MIG = (
    MigProfile("1g.23gb", _gib(22.00), 7),
    MigProfile("1g.23gb+me", _gib(22.00), 1),
    MigProfile("1g.45gb", _gib(44.25), 4),
    MigProfile("2g.45gb", _gib(44.25), 3),
    MigProfile("3g.90gb", None, 2),
    MigProfile("4g.90gb", None, 1),
    MigProfile("7g.180gb", None, 1),
)
# A30: the `-lgip` output in Summer-Lo/Docker_configuration 000-MIG/README.md (2g.12gb+me not
# shown there).
_A30_MIG = (
    MigProfile("1g.6gb", _gib(5.81), 4),
    MigProfile("1g.6gb+me", _gib(5.81), 1),
    MigProfile("2g.12gb", _gib(11.69), 2),
    MigProfile("2g.12gb+me", None, 1),
    MigProfile("4g.24gb", _gib(23.50), 1),
)
# GH200 with 96 GB of HBM3 (the `NVIDIA GH200 480GB`): the `-lgip` output in
# kf-cuanschutz/NVIDIA_Grace_Hopper_benchmarking_logs_ Daily_installs_loggings/
# Lessons_learned_from_the_slurm_MIG_installation.md.
_GH200_96GB_MIG = (
    MigProfile("1g.12gb", _gib(11.00), 7),
    MigProfile("1g.12gb+me", _gib(11.00), 1),
    MigProfile("1g.24gb", _gib(23.00), 4),
    MigProfile("2g.24gb", _gib(23.00), 3),
    MigProfile("3g.48gb", _gib(46.50), 2),
    MigProfile("4g.48gb", _gib(46.50), 1),
    MigProfile("7g.96gb", _gib(93.00), 1),
)
# H20: NVIDIA's MIG manager configures it as the GH200 and the H100 96GB, with the same profile
# names (NVIDIA/mig-parted deployments/systemd/config-default.yaml, device 0x2329 in its
# `all-balanced` entry); the memory of its profiles not seen.
_H20_MIG = tuple(MigProfile(p.name, None, p.instances) for p in _GH200_96GB_MIG)
# GH200 144G HBM3e: the `-lgip` output in NVIDIA/mig-parted#139 (the larger profiles' memory
# not shown there).
_GH200_144GB_MIG = (
    MigProfile("1g.18gb", _gib(17.50), 7),
    MigProfile("1g.18gb+me", _gib(17.50), 1),
    MigProfile("1g.36gb", _gib(35.25), 4),
    MigProfile("2g.36gb", _gib(35.25), 3),
    MigProfile("3g.72gb", None, 2),
    MigProfile("4g.72gb", None, 1),
    MigProfile("7g.144gb", None, 1),
)

HARDWARE: dict[str, Hardware] = {
    # 4paradigm/k8s-vgpu-scheduler#7 (driver 440.64.00).
    "Tesla V100-SXM2-16GB": Hardware(16160),
    # Wan-Video/Wan2.1#5 (driver 525.105.17; 32480 under 418.116.00, godweiyang/GrabGPU#5).
    "Tesla V100-SXM2-32GB": Hardware(32768),
    # modal-labs/modal-client#2797 (nvidia-smi totals of its GPU types).
    "Tesla T4": Hardware(15360),
    "NVIDIA L4": Hardware(23034),
    "NVIDIA L40S": Hardware(46068),
    # mayooot/detect-gpu#3 (NVML total 24146608128 bytes, driver 535.129.03).
    "NVIDIA A10": Hardware(23028),
    # NVIDIA/DCGM#232 (driver 535.247.01).
    "NVIDIA A10G": Hardware(23028),
    "NVIDIA A30": Hardware(None, _A30_MIG),
    # bottlerocket-os/bottlerocket-core-kit#834 (driver 580.126.09).
    "NVIDIA A100-SXM4-40GB": Hardware(40960, _A100_40GB_MIG),
    "NVIDIA A100-PCIE-40GB": Hardware(None, _A100_40GB_MIG),
    # NVIDIA/mig-parted#31 (driver 545.23.08).
    "NVIDIA A100-SXM4-80GB": Hardware(81920, _A100_80GB_MIG),
    # NVIDIA/deepops#1215 (driver 510.85.02).
    "NVIDIA A100 80GB PCIe": Hardware(81920, _A100_80GB_MIG),
    # wilicc/gpu-burn#114 (driver 550.90.07) and NVIDIA/nccl#1264 (550.54.15).
    "NVIDIA H100 80GB HBM3": Hardware(81559, _H100_80GB_MIG),
    "NVIDIA H100 PCIe": Hardware(None, _H100_PCIE_MIG),
    # NVIDIA/gpu-admin-tools#4 (driver 535.183.01).
    "NVIDIA H100 NVL": Hardware(95830, _H100_NVL_MIG),
    # Measured on a real H200 (driver 580.159.04): `NVIDIA H200, 143771 MiB`.
    "NVIDIA H200": Hardware(143771, _H200_MIG),
    # Public benchmark reports (8 x `NVIDIA H200 NVL`, 143771 MiB each); the profiles are the
    # H200's, their memory not seen.
    "NVIDIA H200 NVL": Hardware(
        143771, tuple(MigProfile(p.name, None, p.instances) for p in _H200_MIG)
    ),
    # Public nvidia-smi output (driver 535.154.05): `NVIDIA GH200 480GB ... 97871MiB`.
    "NVIDIA GH200 480GB": Hardware(97871, _GH200_96GB_MIG),
    "NVIDIA GH200 144G HBM3e": Hardware(None, _GH200_144GB_MIG),
    "NVIDIA H20": Hardware(None, _H20_MIG),
    # NVIDIA/TensorRT-LLM#10278 (driver 580.95.05).
    "NVIDIA B200": Hardware(183359, _B200_MIG),
}
"""What the hardware reports, by the name the driver gives the model (`GPU_NAMES`)."""
