"""How HAMi and Volcano match a pod's GPU-type annotations against a GPU, as executable rules.

Written from the stacks' own code, and on purpose apart from `policies.classes.models`, so that
tests can check what gpuadm writes against what the stacks would do with it:

- HAMi's device plugin registers a GPU under the driver's name, with `NVIDIA-` put in front
  when the name does not start with `NVIDIA` (Project-HAMi/HAMi:
  pkg/device-plugin/nvidiadevice/nvinternal/plugin/register.go). Its scheduler keeps a GPU when
  some entry of `nvidia.com/use-gputype` is a case-insensitive substring of that type and no
  entry of `nvidia.com/nouse-gputype` is (pkg/device/nvidia/device.go, `checkGPUtype`). Since
  v2.10.0 the test lives in pkg/device/devices.go, `CheckType`: each entry is trimmed of
  spaces, an empty entry matches nothing, and a value that is empty or blank is no
  constraint. Up to v2.9 an entry was used as split, so an empty one matched every type.
- Volcano's vGPU device plugin registers every GPU as `NVIDIA-` + the driver's name
  (Project-HAMi/volcano-vgpu-device-plugin: pkg/plugin/register.go). Its scheduler matches by
  the same substring test, entries as split, but when `use-gputype` is set it decides alone
  and `nouse-gputype` is not read (volcano-sh/volcano:
  pkg/scheduler/api/devices/nvidia/vgpu/utils.go, `checkGPUtype`, unchanged to August 2026).

Lists are split on `,` as Go's `strings.Split` does: an empty value is one empty entry.
"""

from __future__ import annotations

from collections.abc import Mapping

USE_GPUTYPE = "nvidia.com/use-gputype"
NOUSE_GPUTYPE = "nvidia.com/nouse-gputype"


def hami_device_type(driver_name: str) -> str:
    """Return the type HAMi registers a GPU of this driver name under."""
    if driver_name.startswith("NVIDIA"):
        return driver_name
    return "NVIDIA-" + driver_name


def volcano_device_type(driver_name: str) -> str:
    """Return the type Volcano's vGPU device plugin registers a GPU of this driver name under."""
    return "NVIDIA-" + driver_name


def _any_within(entries: str, device_type: str) -> bool:
    card = device_type.upper()
    return any(entry.upper() in card for entry in entries.split(","))


def _any_trimmed_within(entries: str, device_type: str) -> bool:
    card = device_type.upper()
    trimmed = (entry.strip() for entry in entries.split(","))
    return any(entry and entry.upper() in card for entry in trimmed)


def hami_selects(annotations: Mapping[str, str], device_type: str) -> bool:
    """Tell whether HAMi (v2.10.0 on) may give a pod with these annotations a GPU of this type."""
    use = annotations.get(USE_GPUTYPE, "")
    if use.strip() and not _any_trimmed_within(use, device_type):
        return False
    nouse = annotations.get(NOUSE_GPUTYPE, "")
    return not (nouse.strip() and _any_trimmed_within(nouse, device_type))


def hami_selects_before_2_10(annotations: Mapping[str, str], device_type: str) -> bool:
    """Tell whether HAMi up to v2.9 may give a pod with these annotations a GPU of this type."""
    if USE_GPUTYPE in annotations and not _any_within(annotations[USE_GPUTYPE], device_type):
        return False
    return not (
        NOUSE_GPUTYPE in annotations and _any_within(annotations[NOUSE_GPUTYPE], device_type)
    )


def volcano_selects(annotations: Mapping[str, str], device_type: str) -> bool:
    """Tell whether Volcano may give a pod with these annotations a GPU of this type."""
    if USE_GPUTYPE in annotations:
        return _any_within(annotations[USE_GPUTYPE], device_type)
    if NOUSE_GPUTYPE in annotations:
        return not _any_within(annotations[NOUSE_GPUTYPE], device_type)
    return True
