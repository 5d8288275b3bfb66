"""Shares of one DRA device (`sharing` on a dra class), and DRA extended resources.

A share is a claim for part of a device's capacity (KEP-5075): gpuadm sizes it in hundredths,
rounded down, asks that part of every capacity the class lists, rounded down to the
capacity's step, and charges its hundredths or the largest part asked of any. A pod that asks
the scheduler itself for devices of a GPU DeviceClass (KEP-5004) gets whole devices of its
class through gpuadm's claim instead.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest

from policies import Denial, load_policy, plan, pod_charge, policy_warnings
from policies.classes.backends.dra import DraClass
from policies.loading import ConfigError
from policies.pods.dra_templates import Held, parse_template_name
from policies.quantity import canonical_quantity, parse_quantity
from tests.builders import POLICY_YAML, pod
from tests.policies.test_dra import apply, stored_pod

SELECTOR = 'device.attributes["gpu.nvidia.com"].productName in ["NVIDIA H100 80GB HBM3"]'
SHARING_CLASSES = """
  share:
    backend: dra
    models: [NVIDIA H100 80GB HBM3]
    sharing:
      strategy: capacity
      capacity: {memory: 80Gi}
  share-ts:
    backend: dra
    models: [NVIDIA H100 80GB HBM3]
    sharing:
      strategy: time-slicing
      interval: Long
      capacity: {memory: 80Gi}
  slots:
    backend: dra
    models: [NVIDIA H100 80GB HBM3]
    sharing:
      strategy: capacity
      capacity: {memory: 80Gi, shares: 4}
  hami:
    backend: dra
    deviceClassName: hami-core-gpu.project-hami.io
    driver: hami-core-gpu.project-hami.io
    sharing:
      strategy: capacity
      capacity: {cores: 100, memory: 24Gi}
  whole:
    backend: dra
    deviceClassName: gpu.example.com
    extendedResourceName: example.com/gpu
"""
POLICY = load_policy(POLICY_YAML + SHARING_CLASSES)


def asking(class_name: str, limits: dict[str, str]) -> dict[str, Any]:
    return pod(limits, annotations={"gpuadm.io/class": class_name})


def share_spec(capacity: dict[str, str], config: list[dict[str, Any]] | None = None) -> Any:
    exactly = {
        "deviceClassName": "gpu.nvidia.com",
        "allocationMode": "ExactCount",
        "count": 1,
        "selectors": [{"cel": {"expression": SELECTOR}}],
        "capacity": {"requests": capacity},
    }
    devices: dict[str, Any] = {"requests": [{"name": "gpu", "exactly": exactly}]}
    if config is not None:
        devices["config"] = config
    return {"devices": devices}


@pytest.mark.parametrize(
    ("class_name", "limits", "requests", "charge"),
    [
        pytest.param("share", {"gpuadm.io/share": "0.5"}, {"memory": "40Gi"}, Fraction(1, 2)),
        pytest.param("share", {"gpuadm.io/share": "250m"}, {"memory": "20Gi"}, Fraction(1, 4)),
        pytest.param(
            "share", {"gpuadm.io/share-memory": "20Gi"}, {"memory": "20Gi"}, Fraction(1, 4)
        ),
        # 10Gi is 12.5 hundredths of 80Gi, so 12: 9830.4Mi, asked as 9830Mi; eight of them
        # fit one device.
        pytest.param(
            "share", {"gpuadm.io/share-memory": "10Gi"}, {"memory": "9830Mi"}, Fraction(12, 100)
        ),
        # A third is 33 hundredths: 27033.6Mi, asked as 27033Mi; three of them fit one device.
        pytest.param(
            "share", {"gpuadm.io/share": "0.3333"}, {"memory": "27033Mi"}, Fraction(33, 100)
        ),
        # Four slots a device: 30 hundredths take one slot and 30% of the memory.
        pytest.param(
            "slots",
            {"gpuadm.io/slots": "0.3"},
            {"memory": "24Gi", "shares": "1"},
            Fraction(3, 10),
        ),
        # Ten hundredths are less than a slot, and a claim takes one at least: charged a slot.
        pytest.param(
            "slots",
            {"gpuadm.io/slots": "0.1"},
            {"memory": "8Gi", "shares": "1"},
            Fraction(1, 4),
        ),
        pytest.param(
            "slots",
            {"gpuadm.io/slots": "0.5"},
            {"memory": "40Gi", "shares": "2"},
            Fraction(1, 2),
        ),
    ],
)
def test_a_share_asks_its_part_of_every_capacity_and_is_charged_at_least_that(
    class_name: str, limits: dict[str, str], requests: dict[str, str], charge: Fraction
) -> None:
    mutated, result = apply(asking(class_name, limits), POLICY)
    (template,) = result.claim_templates
    exactly = template.spec["devices"]["requests"][0]["exactly"]
    assert exactly["capacity"] == {"requests": requests}
    assert exactly["count"] == 1
    assert result.charge == charge
    assert (result.class_name, result.charge) == pod_charge(mutated, POLICY)
    # The name says the share, in hundredths; the charge is never less than the share, nor
    # than the part of any capacity the claim asks.
    parsed = parse_template_name(template.name)
    assert parsed is not None
    assert parsed.class_name == class_name
    assert charge >= Fraction(parsed.held.portion, 100)
    gpu_class = POLICY.classes[class_name]
    assert isinstance(gpu_class, DraClass)
    assert gpu_class.sharing is not None
    for name, entry in gpu_class.sharing.capacity.items():
        assert charge >= parse_quantity(requests[name]) / entry.value
    assert "config" not in template.spec["devices"]


def test_a_share_is_stored_as_a_claim_the_scheduler_allocates_from_a_shared_device() -> None:
    mutated, result = apply(asking("share", {"gpuadm.io/share": "0.5"}), POLICY)
    (template,) = result.claim_templates
    assert template.spec == share_spec({"memory": "40Gi"})
    assert template.name.startswith("gpuadm-share-p50-")
    assert template.held == Held(1, 50)
    (main,) = mutated["spec"]["containers"]
    assert main["resources"] == {"claims": [{"name": "gpuadm-c0"}]}
    assert mutated["spec"]["resourceClaims"] == [
        {"name": "gpuadm-c0", "resourceClaimTemplateName": template.name}
    ]
    assert mutated["metadata"]["annotations"]["gpuadm.io/demand"] == "share=0.5"


def test_time_slicing_writes_nvidias_gpu_config_beside_the_capacity_request() -> None:
    _, result = apply(asking("share-ts", {"gpuadm.io/share-ts": "0.5"}), POLICY)
    (template,) = result.claim_templates
    config = [
        {
            "requests": ["gpu"],
            "opaque": {
                "driver": "gpu.nvidia.com",
                "parameters": {
                    "apiVersion": "resource.nvidia.com/v1beta1",
                    "kind": "GpuConfig",
                    "sharing": {
                        "strategy": "TimeSlicing",
                        "timeSlicingConfig": {"interval": "Long"},
                    },
                },
            },
        }
    ]
    assert template.spec == share_spec({"memory": "40Gi"}, config)


def test_hami_drivers_cores_and_memory_are_asked_together() -> None:
    _, result = apply(asking("hami", {"gpuadm.io/hami": "0.3"}), POLICY)
    (template,) = result.claim_templates
    exactly = template.spec["devices"]["requests"][0]["exactly"]
    assert exactly["deviceClassName"] == "hami-core-gpu.project-hami.io"
    assert exactly["capacity"] == {"requests": {"cores": "30", "memory": "7372Mi"}}
    assert result.charge == Fraction(3, 10)


def test_whole_gpus_of_a_sharing_class_ask_all_of_every_capacity() -> None:
    # A driver's default for a capacity a claim leaves out may be less than all of it
    # (NVIDIA's with a number of shares: one share and no memory): asked in full, no share
    # can sit beside a whole device.
    _, result = apply(asking("slots", {"gpuadm.io/slots": "2"}), POLICY)
    (template,) = result.claim_templates
    assert template.held == Held(2)
    exactly = template.spec["devices"]["requests"][0]["exactly"]
    assert exactly["capacity"] == {"requests": {"memory": "80Gi", "shares": "4"}}
    assert exactly["count"] == 2
    assert "config" not in template.spec["devices"]
    assert result.charge == 2


def test_a_share_just_under_a_device_is_rounded_down_to_its_hundredths() -> None:
    _, result = apply(asking("share", {"gpuadm.io/share": "0.999"}), POLICY)
    (template,) = result.claim_templates
    assert template.held == Held(1, 99)
    assert result.charge == Fraction(99, 100)
    assert any("rounded down to 0.99 GPU" in w for w in result.warnings)


def test_all_of_a_devices_memory_is_one_device() -> None:
    _, result = apply(asking("share", {"gpuadm.io/share-memory": "80Gi"}), POLICY)
    (template,) = result.claim_templates
    assert template.held == Held(1)
    assert result.charge == 1
    assert result.warnings == ()


def test_rounding_up_says_what_the_claim_asks() -> None:
    _, result = apply(asking("slots", {"gpuadm.io/slots": "0.1"}), POLICY)
    assert result.warnings == (
        'container "main": a share of 0.1 of slots rounded up to 0.25 GPU (a claim for memory '
        "8Gi of 80Gi, shares 1 of 4); quota is charged 0.25",
    )


def test_a_stored_share_is_charged_from_its_templates_name() -> None:
    _, result = apply(asking("share", {"gpuadm.io/share": "0.25"}), POLICY)
    (template,) = result.claim_templates
    body = stored_pod(template.name, annotations={"gpuadm.io/class": "share"})
    assert pod_charge(body, POLICY) == ("share", Fraction(1, 4))
    again = plan(body, POLICY)
    assert again.claim_templates == (template,)


def test_a_share_of_a_class_that_no_longer_shares_is_made_by_no_one() -> None:
    _, result = apply(asking("share", {"gpuadm.io/share": "0.5"}), POLICY)
    (template,) = result.claim_templates
    unshared = POLICY.classes["whole"]
    assert isinstance(unshared, DraClass)
    assert unshared.claim_template("share", template.held) is None


def test_a_stored_share_of_a_class_that_shares_no_longer_is_charged_its_whole_device() -> None:
    # The claim keeps what it was given until the pod ends; quota never counts less.
    _, result = apply(asking("share", {"gpuadm.io/share": "0.5"}), POLICY)
    (template,) = result.claim_templates
    body = stored_pod(template.name, annotations={"gpuadm.io/class": "share"})
    unshared = load_policy(POLICY_YAML + "  share:\n    backend: dra\n")
    assert pod_charge(body, unshared) == ("share", Fraction(1))
    # A new pod cannot get a share there.
    with pytest.raises(Denial, match="gives whole GPUs only: it sets no `sharing`"):
        plan(body, unshared)


def test_a_stored_share_is_charged_by_todays_sizing_of_its_class() -> None:
    _, result = apply(asking("slots", {"gpuadm.io/slots": "0.1"}), POLICY)
    (template,) = result.claim_templates
    body = stored_pod(template.name, annotations={"gpuadm.io/class": "slots"})
    assert pod_charge(body, POLICY) == ("slots", Fraction(1, 4))


def test_asking_whole_gpus_by_two_names_is_denied_whatever_their_order() -> None:
    for limits in (
        {"nvidia.com/gpu": "1", "deviceclass.resource.kubernetes.io/gpu.nvidia.com": "1"},
        {"deviceclass.resource.kubernetes.io/gpu.nvidia.com": "1", "nvidia.com/gpu": "1"},
    ):
        with pytest.raises(Denial) as denied:
            plan(asking("share", limits), POLICY)
        assert denied.value.message == (
            'container "main" asks for whole GPUs of class share through '
            "deviceclass.resource.kubernetes.io/gpu.nvidia.com and through nvidia.com/gpu "
            "too; ask through one of them"
        )


def test_memory_asks_need_a_memory_capacity() -> None:
    with pytest.raises(Denial, match="lists no memory to size a share with"):
        plan(asking("nomem", {"gpuadm.io/nomem-memory": "1Gi"}), NO_MEMORY)


NO_MEMORY = load_policy(
    POLICY_YAML
    + """
  nomem:
    backend: dra
    sharing: {strategy: capacity, capacity: {shares: 4}}
"""
)


@pytest.mark.parametrize(
    ("sharing", "message"),
    [
        pytest.param(
            "{strategy: mps, capacity: {memory: 80Gi}}",
            "mps cannot share a device between pods",
            id="mps",
        ),
        pytest.param("{strategy: capacity, capacity: {}}", "lists no capacity", id="empty"),
        pytest.param("{strategy: capacity}", "capacity", id="no-capacity"),
        pytest.param(
            "{strategy: capacity, interval: Long, capacity: {memory: 80Gi}}",
            "interval is for strategy time-slicing, not capacity",
            id="interval-without-time-slicing",
        ),
        pytest.param(
            "{strategy: time-slicing, interval: Forever, capacity: {memory: 80Gi}}",
            "interval",
            id="unknown-interval",
        ),
        pytest.param(
            "{strategy: capacity, capacity: {memory: 1000000}}",
            "memory: 1000000 is less than one step of 1Mi",
            id="memory-below-step",
        ),
        pytest.param(
            "{strategy: capacity, capacity: {cores: 0.5}}",
            "must be a positive whole amount",
            id="fractional",
        ),
        pytest.param(
            "{strategy: capacity, capacity: {'9cores': 100}}",
            "is not a device capacity name",
            id="bad-name",
        ),
        pytest.param(
            "{strategy: capacity, capacity: {memory: {value: 1Gi, step: 2Gi}}}",
            "1Gi is less than one step of 2Gi",
            id="explicit-step",
        ),
        pytest.param(
            "{strategy: spread, capacity: {memory: 80Gi}}", "strategy", id="unknown-strategy"
        ),
        pytest.param(
            "{strategy: time-slicing, capacity: {memory: 80Gi}}\n"
            "    driver: hami-core-gpu.project-hami.io",
            "time-slicing writes NVIDIA's GpuConfig, which driver hami-core-gpu.project-hami.io "
            "does not read",
            id="time-slicing-off-nvidia",
        ),
        pytest.param(
            "{strategy: capacity, capacity: {memory: 80Gi}}\n    shareable: false",
            "sets sharing and shareable: false",
            id="not-shareable",
        ),
        pytest.param(
            "{strategy: capacity, capacity: {memory: 80Gi}}\n"
            "    extendedResourceName: deviceclass.resource.kubernetes.io/gpu.nvidia.com",
            "is the name every DeviceClass has without one of its own",
            id="implicit-extended-resource-name",
        ),
    ],
)
def test_a_sharing_the_drivers_cannot_give_is_refused_when_the_policy_loads(
    sharing: str, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        load_policy(POLICY_YAML + f"  broken:\n    backend: dra\n    sharing: {sharing}\n")


def test_an_explicit_step_rounds_each_request_up_to_it() -> None:
    policy = load_policy(
        POLICY_YAML
        + "  stepped:\n    backend: dra\n"
        + "    sharing: {strategy: capacity, capacity: {memory: {value: 80Gi, step: 8Gi}}}\n"
    )
    _, result = apply(asking("stepped", {"gpuadm.io/stepped": "0.35"}), policy)
    (template,) = result.claim_templates
    exactly = template.spec["devices"]["requests"][0]["exactly"]
    # 35% of 80Gi is 28Gi: three steps of 8Gi, 24Gi, so it is charged its share.
    assert exactly["capacity"] == {"requests": {"memory": "24Gi"}}
    assert result.charge == Fraction(7, 20)


# DRA extended resources (KEP-5004) ---------------------------------------------------------


@pytest.mark.parametrize(
    ("class_name", "resource"),
    [
        pytest.param("share", "deviceclass.resource.kubernetes.io/gpu.nvidia.com", id="implicit"),
        pytest.param("whole", "deviceclass.resource.kubernetes.io/gpu.example.com", id="own-class"),
        pytest.param("whole", "example.com/gpu", id="extended-resource-name"),
    ],
)
def test_a_dra_extended_resource_becomes_whole_devices_of_the_class(
    class_name: str, resource: str
) -> None:
    mutated, result = apply(asking(class_name, {resource: "2"}), POLICY)
    (template,) = result.claim_templates
    assert template.held == Held(2)
    assert result.charge == 2
    (main,) = mutated["spec"]["containers"]
    assert main["resources"] == {"claims": [{"name": "gpuadm-c0"}]}


def test_a_dra_extended_resource_in_requests_only_is_read_too() -> None:
    body = asking("share", {})
    body["spec"]["containers"][0]["resources"] = {
        "requests": {"deviceclass.resource.kubernetes.io/gpu.nvidia.com": "1"}
    }
    _, result = apply(body, POLICY)
    assert result.charge == 1


@pytest.mark.parametrize(
    ("class_name", "limits", "message"),
    [
        pytest.param(
            "share",
            {"deviceclass.resource.kubernetes.io/mig.nvidia.com": "1"},
            'container "main": deviceclass.resource.kubernetes.io/mig.nvidia.com asks the '
            "scheduler for devices of DeviceClass mig.nvidia.com, which class share does not "
            "claim from; ask for gpuadm.io/<class> instead (classes on that DeviceClass: none)",
            id="nvidia-mig-class",
        ),
        pytest.param(
            "a100",
            {"deviceclass.resource.kubernetes.io/gpu.nvidia.com": "1"},
            'container "main": deviceclass.resource.kubernetes.io/gpu.nvidia.com asks the '
            "scheduler for devices of DeviceClass gpu.nvidia.com, which class a100 does not "
            "claim from; ask for gpuadm.io/<class> instead (classes on that DeviceClass: "
            "share, share-ts, slots)",
            id="class-of-another-backend",
        ),
        pytest.param(
            "whole",
            {"deviceclass.resource.kubernetes.io/gpu.example.com": "1", "example.com/gpu": "1"},
            'container "main" asks for whole GPUs of class whole through '
            "deviceclass.resource.kubernetes.io/gpu.example.com and through example.com/gpu "
            "too; ask through one of them",
            id="two-names",
        ),
        pytest.param(
            "share",
            {"deviceclass.resource.kubernetes.io/gpu.nvidia.com": "500m"},
            'container "main": deviceclass.resource.kubernetes.io/gpu.nvidia.com: 0.5 is not a '
            "whole number of GPUs; ask for a share as gpuadm.io/share: 0.5",
            id="a-fraction",
        ),
    ],
)
def test_a_dra_extended_resource_no_class_gives_is_denied(
    class_name: str, limits: dict[str, str], message: str
) -> None:
    for reader in (plan, pod_charge):
        with pytest.raises(Denial) as denied:
            reader(asking(class_name, limits), POLICY)
        assert denied.value.message == message


def test_a_device_class_that_is_no_gpu_is_not_gpuadms() -> None:
    body = asking("share", {"deviceclass.resource.kubernetes.io/nic.example.com": "1"})
    body["metadata"]["annotations"] = {}
    result = plan(body, POLICY)
    assert result.class_name is None
    assert result.patch == []


def test_a_listed_gpu_device_class_is_a_gpu_resource() -> None:
    policy = load_policy(POLICY_YAML + "gpuDeviceClasses: [accel.example.com]\n")
    with pytest.raises(Denial, match=r"DeviceClass accel\.example\.com, which class"):
        plan(asking("a100", {"deviceclass.resource.kubernetes.io/accel.example.com": "1"}), policy)


@pytest.mark.parametrize(
    ("classes", "message"),
    [
        pytest.param(
            "  mine:\n    backend: dra\n    extendedResourceName: gpuadm.io/mine\n",
            "class mine: extendedResourceName gpuadm.io/mine is under the policy's domain",
            id="class-key",
        ),
        pytest.param(
            "  mine:\n    backend: dra\n    extendedResourceName: nvidia.com/gpumem\n",
            "class mine: extendedResourceName nvidia.com/gpumem is a resource of class a100 too",
            id="hamis-memory",
        ),
        pytest.param(
            "  mine:\n    backend: dra\n    extendedResourceName: example.com/x\n"
            "  yours:\n    backend: dra\n    deviceClassName: other.example.com\n"
            "    extendedResourceName: example.com/x\n",
            "extendedResourceName example.com/x is a resource of class",
            id="two-classes",
        ),
    ],
)
def test_a_dra_extended_resource_must_be_its_own_name(classes: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_policy(POLICY_YAML + classes)


@pytest.mark.parametrize(
    ("amount", "written"),
    [
        (40 * 2**30, "40Gi"),
        (27852 * 2**20, "27852Mi"),
        (1024, "1Ki"),
        (2000, "2k"),
        (1500, "1500"),
        (10**6, "1M"),
        (30, "30"),
        (7, "7"),
    ],
)
def test_a_capacity_request_is_written_as_the_apiserver_stores_it(
    amount: int, written: str
) -> None:
    assert canonical_quantity(Fraction(amount)) == written
    assert parse_quantity(written) == amount


@pytest.mark.parametrize(
    ("memory", "held", "asks"),
    [
        # A hair under a hundredth of 80Gi (819.2Mi) still takes one hundredth: never none.
        pytest.param("819.1Mi", Held(1, 1), "819Mi", id="never-below-one-hundredth"),
        # A hair under two hundredths is one, rounded down: 100 of them fit one device.
        pytest.param("1638.3Mi", Held(1, 1), "819Mi", id="rounded-down-to-a-hundredth"),
    ],
)
def test_a_memory_ask_is_rounded_down_to_whole_hundredths(
    memory: str, held: Held, asks: str
) -> None:
    _, result = apply(asking("share", {"gpuadm.io/share-memory": memory}), POLICY)
    (template,) = result.claim_templates
    requests = template.spec["devices"]["requests"][0]["exactly"]["capacity"]["requests"]
    assert requests["memory"] == asks
    assert template.held == held
    assert result.charge == Fraction(held.portion, 100)


@pytest.mark.parametrize(
    ("classes", "warned"),
    [
        pytest.param(
            "  one:\n    backend: dra\n    sharing: {strategy: time-slicing, interval: Long, "
            "capacity: {memory: 80Gi}}\n"
            "  two:\n    backend: dra\n    sharing: {strategy: time-slicing, interval: Short, "
            "capacity: {memory: 80Gi}}\n",
            True,
            id="two-intervals",
        ),
        pytest.param(
            "  one:\n    backend: dra\n    sharing: {strategy: time-slicing, "
            "capacity: {memory: 80Gi}}\n"
            "  two:\n    backend: dra\n    sharing: {strategy: capacity, "
            "capacity: {memory: 80Gi}}\n",
            True,
            id="config-and-none",
        ),
        pytest.param(
            "  one:\n    backend: dra\n    models: [NVIDIA A100-SXM4-80GB]\n"
            "    sharing: {strategy: time-slicing, interval: Long, capacity: {memory: 80Gi}}\n"
            "  two:\n    backend: dra\n    models: [NVIDIA H100 80GB HBM3]\n"
            "    sharing: {strategy: capacity, capacity: {memory: 80Gi}}\n",
            False,
            id="other-models",
        ),
        pytest.param(
            "  one:\n    backend: dra\n    sharing: {strategy: time-slicing, interval: Long, "
            "capacity: {memory: 80Gi}}\n"
            "  two:\n    backend: dra\n    sharing: {strategy: time-slicing, interval: Long, "
            "capacity: {memory: 40Gi}}\n",
            False,
            id="same-configuration",
        ),
    ],
)
def test_shares_that_could_meet_on_a_device_configured_otherwise_are_warned(
    classes: str, warned: bool
) -> None:
    warnings = [
        w for w in policy_warnings(load_policy(POLICY_YAML + classes)) if "one and two" in w
    ]
    assert bool(warnings) == warned
