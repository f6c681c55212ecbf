"""The spec's `driver:` section and `vllm.cuda`: their messages word for word, how defaults and groups
give them to hosts, and the inventory variables the roles nvidia_driver and vllm_install read."""

from __future__ import annotations

import pytest

from provisioner.fleet.inventory import build_inventory
from provisioner.gpu.architectures import needs_open_modules, older_than_turing
from provisioner.spec import validate_spec
from tests.unit.conftest import UUID0, UUID1, host, instance, problems_of, spec_data

DRIVER_VARIABLES = ("nvidia_driver_manage", "nvidia_driver_source", "nvidia_driver_branch", "nvidia_driver_version",
                    "nvidia_driver_modules", "nvidia_driver_hold", "nvidia_driver_reboot", "nvidia_driver_expect_gpus",
                    "nvidia_driver_minimum_branch", "vllm_install_minimum_driver")


def gpus(*models: str) -> dict:
    return {"devices": [{"index": index, "uuid": [UUID0, UUID1][index], "model": model}
                        for index, model in enumerate(models)]}


def host_vars(data: dict, name: str = "ws4070") -> dict:
    return build_inventory(validate_spec(data, check_files=False))[f"host_vars/{name}.yml"]


def driver_vars(data: dict, name: str = "ws4070") -> dict:
    variables = host_vars(data, name)
    return {key: variables[key] for key in DRIVER_VARIABLES}


# --------------------------------------------------------------------------- the section's fields


@pytest.mark.parametrize("driver, message", [
    ({"branch": 580}, "hosts[0].driver.branch: expected a string, got 580 (int) — put it in quotes"),
    ({"branch": "r580"}, "hosts[0].driver.branch: 'r580' is not a driver branch — write the number before the first "
                         'dot of a driver version, quoted (e.g. "580")'),
    ({"version": "580"}, "hosts[0].driver.version: '580' is not a driver version — write it as nvidia-smi prints it, "
                         'quoted (e.g. "580.95.05")'),
    ({"version": 580.95}, "hosts[0].driver.version: expected a string, got 580.95 (float) — put it in quotes"),
    ({"source": "debian"}, "hosts[0].driver.source: must be 'nvidia' or 'distribution', got 'debian'"),
    ({"modules": "closed"}, "hosts[0].driver.modules: must be 'auto', 'open' or 'proprietary', got 'closed'"),
    ({"hold": "yes"}, "hosts[0].driver.hold: expected true or false, got 'yes'"),
    ({"brnach": "580"}, "hosts[0].driver.brnach: unknown key 'brnach' — did you mean 'branch'? allowed keys: manage, "
                        "source, branch, version, modules, reboot, hold"),
    ({"branch": "580", "version": "575.51.03"},
     'hosts[0].driver.version: 575.51.03 is not of branch 580 — give a version of that branch (580.x), or set '
     'branch: "575"'),
])
def test_a_bad_driver_field_is_named_with_the_fix(driver, message):
    assert problems_of(spec_data(hosts=[host(driver=driver)])) == [message]


def test_a_version_outside_the_default_branch_is_fine_when_the_driver_is_managed_elsewhere():
    spec = validate_spec(spec_data(hosts=[host(driver={"manage": False, "version": "550.163.01"})]))
    assert spec.hosts[0].driver.version == "550.163.01"


@pytest.mark.parametrize("modules, models, message", [
    ("proprietary", ["NVIDIA B200"],
     "hosts[0].driver.modules: GPU 0 (NVIDIA B200) is a Blackwell-generation GPU, which only the open kernel modules "
     "run — use modules: open, or auto"),
    ("proprietary", ["NVIDIA GeForce RTX 5090"],
     "hosts[0].driver.modules: GPU 0 (NVIDIA GeForce RTX 5090) is a Blackwell-generation GPU, which only the open "
     "kernel modules run — use modules: open, or auto"),
    ("open", ["Tesla V100-SXM2-32GB"],
     "hosts[0].driver.modules: GPU 0 (Tesla V100-SXM2-32GB) is older than Turing, which only the proprietary kernel "
     "modules run — use modules: proprietary, or auto"),
    ("auto", ["Tesla P40", "NVIDIA B200"],
     "hosts[0].driver.modules: GPU 0 (Tesla P40) runs only on the proprietary kernel modules and GPU 1 (NVIDIA B200) "
     "only on the open ones — no driver runs both: give them to different hosts"),
])
def test_kernel_modules_that_cannot_run_a_gpu_are_refused(modules, models, message):
    data = spec_data(hosts=[host(gpus=gpus(*models), driver={"modules": modules})], instances=[])
    assert problems_of(data) == [message]


def test_the_modules_are_not_checked_where_the_driver_is_not_managed():
    data = spec_data(hosts=[host(gpus=gpus("NVIDIA B200"), driver={"manage": False, "modules": "proprietary"})],
                     instances=[])
    assert validate_spec(data).hosts[0].driver.modules == "proprietary"


@pytest.mark.parametrize("model, old, blackwell", [
    ("NVIDIA GeForce GTX 1080 Ti", True, False), ("NVIDIA GeForce GTX 1660 SUPER", False, False),
    ("Tesla V100-SXM2-32GB", True, False), ("Tesla P100-PCIE-16GB", True, False), ("Quadro P4000", True, False),
    ("NVIDIA TITAN Xp", True, False), ("NVIDIA TITAN RTX", False, False), ("Tesla T4", False, False),
    ("NVIDIA GeForce RTX 3090", False, False), ("NVIDIA H200", False, False), ("NVIDIA A100-SXM4-80GB", False, False),
    ("NVIDIA B200", False, True), ("NVIDIA GB200", False, True), ("NVIDIA GeForce RTX 5070 Ti", False, True),
    ("NVIDIA RTX PRO 6000 Blackwell Server Edition", False, True), ("NVIDIA GH200 480GB", False, True),
    (None, False, False),
])
def test_gpu_generations_by_product_name(model, old, blackwell):
    assert (older_than_turing(model), needs_open_modules(model)) == (old, blackwell)


# --------------------------------------------------------------------------- vllm.cuda


@pytest.mark.parametrize("vllm, message", [
    ({"cuda": "12.8"}, "hosts[0].vllm.cuda: vLLM 0.25.0 has no CUDA 12.8 build — use one of 13.0 (the default), 12.9, "
                       "or null for the default"),
    ({"cuda": 12.9}, "hosts[0].vllm.cuda: expected a string, got 12.9 (float) — put it in quotes"),
    ({"cuda": "cu129"}, "hosts[0].vllm.cuda: 'cu129' is not a CUDA version — write major.minor, quoted (e.g. \"12.9\")"),
    ({"cuda": "12.9"}, "hosts[0].vllm.cuda: vLLM 0.25.0's CUDA 12.9 build is not the wheel PyPI serves (that one is "
                       "CUDA 13.0) — set vllm.wheelhouse to a folder with its wheels, or vllm.index_url to an index "
                       "that serves it (published at https://wheels.vllm.ai/0.25.0/cu129)"),
])
def test_a_cuda_build_the_catalog_lacks_or_pip_cannot_find_is_refused(vllm, message):
    assert problems_of(spec_data(hosts=[host(vllm=vllm)])) == [message]


def test_a_cuda_build_with_an_index_is_taken_and_the_default_build_may_be_named():
    spec = validate_spec(spec_data(hosts=[host(vllm={"version": "0.33.0", "cuda": "12.9",
                                                     "index_url": "https://mirror.example/simple"})]))
    assert spec.hosts[0].vllm.cuda == "12.9"
    assert validate_spec(spec_data(hosts=[host(vllm={"cuda": "13.0"})])).hosts[0].vllm.cuda == "13.0"


# --------------------------------------------------------------------------- defaults and groups


def fleet(**top) -> dict:
    """Three hosts without GPUs listed: a and b in rack_a, c in none."""
    hosts = [host(name, f"192.0.2.{index + 1}", gpus={}, **({"groups": ["rack_a"]} if name != "c" else {}))
             for index, name in enumerate("abc")]
    return {**spec_data(hosts=hosts, instances=[]), **top}


def test_defaults_give_every_host_a_managed_driver_and_a_group_or_the_host_changes_it():
    data = fleet(defaults={"driver": {"source": "nvidia", "branch": "580"}},
                 groups=[{"name": "rack_a", "driver": {"manage": False}}])
    data["hosts"][1]["driver"] = {"version": "580.95.05"}
    data["hosts"][2]["driver"] = {"branch": "590", "reboot": True}
    a, b, c = validate_spec(data).hosts
    assert (a.driver.manage, a.driver.version) == (False, None)  # the group: managed elsewhere, read at apply
    assert (b.driver.manage, b.driver.version) == (False, "580.95.05")  # and declared
    assert (c.driver.manage, c.driver.branch, c.driver.reboot, c.driver.hold) == (True, "590", True, True)


def test_a_host_keeps_no_driver_section_with_driver_null():
    data = fleet(defaults={"driver": {"branch": "580"}})
    data["hosts"][2]["driver"] = None
    a, _, c = validate_spec(data).hosts
    assert a.driver is not None and c.driver is None


def test_a_bad_driver_value_is_one_problem_where_it_is_written():
    data = fleet(defaults={"driver": {"branch": 580}}, groups=[{"name": "rack_a", "driver": {"source": "apt"}}])
    assert problems_of(data) == [
        "defaults.driver.branch: expected a string, got 580 (int) — put it in quotes",
        "groups[0].driver.source: must be 'nvidia' or 'distribution', got 'apt'",
    ]


def test_a_version_and_branch_written_in_a_group_are_checked_there_once():
    data = fleet(groups=[{"name": "rack_a", "driver": {"branch": "580", "version": "590.44.01"}}])
    assert problems_of(data) == [
        'groups[0].driver.version: 590.44.01 is not of branch 580 — give a version of that branch (580.x), or set '
        'branch: "590"']


def test_modules_a_group_sets_are_checked_against_each_hosts_gpus():
    data = fleet(groups=[{"name": "rack_a", "driver": {"modules": "open"}}])
    data["hosts"][1]["gpus"] = gpus("Tesla V100-SXM2-32GB")
    assert problems_of(data) == [
        "hosts[1].driver.modules: GPU 0 (Tesla V100-SXM2-32GB) is older than Turing, which only the proprietary "
        "kernel modules run — use modules: proprietary, or auto (the host takes it from groups[0].driver.modules)"]


def test_cuda_in_the_defaults_without_a_wheelhouse_is_one_problem_there():
    data = fleet(defaults={"vllm": {"cuda": "12.9"}})
    assert problems_of(data) == [
        "defaults.vllm.cuda: vLLM 0.25.0's CUDA 12.9 build is not the wheel PyPI serves (that one is CUDA 13.0) — set "
        "vllm.wheelhouse to a folder with its wheels, or vllm.index_url to an index that serves it (published at "
        "https://wheels.vllm.ai/0.25.0/cu129)"]


# --------------------------------------------------------------------------- the inventory


def test_a_host_without_a_driver_section_is_not_managed_and_says_what_its_vllm_needs():
    assert driver_vars(spec_data()) == {
        "nvidia_driver_manage": False, "nvidia_driver_source": "nvidia", "nvidia_driver_branch": "580",
        "nvidia_driver_version": None, "nvidia_driver_modules": "open", "nvidia_driver_hold": True,
        "nvidia_driver_reboot": False, "nvidia_driver_expect_gpus": True, "nvidia_driver_minimum_branch": "580",
        "vllm_install_minimum_driver": "580"}


def test_a_managed_driver_section_as_written():
    data = spec_data(hosts=[host(driver={"source": "distribution", "branch": "535", "version": "535.309.01",
                                         "modules": "proprietary", "hold": False, "reboot": True},
                                 vllm={"cuda": "12.9", "index_url": "https://mirror.example/simple"})])
    assert driver_vars(data) == {
        "nvidia_driver_manage": True, "nvidia_driver_source": "distribution", "nvidia_driver_branch": "535",
        "nvidia_driver_version": "535.309.01", "nvidia_driver_modules": "proprietary", "nvidia_driver_hold": False,
        "nvidia_driver_reboot": True, "nvidia_driver_expect_gpus": True, "nvidia_driver_minimum_branch": "525",
        "vllm_install_minimum_driver": "525"}


def test_a_driver_managed_elsewhere_and_auto_modules_resolved_from_the_gpus():
    data = spec_data(hosts=[host(gpus=gpus("Tesla V100-SXM2-32GB"), driver={"manage": False, "version": "550.163.01"})],
                     instances=[])
    assert driver_vars(data) == {
        "nvidia_driver_manage": False, "nvidia_driver_source": "nvidia", "nvidia_driver_branch": "580",
        "nvidia_driver_version": "550.163.01", "nvidia_driver_modules": "proprietary", "nvidia_driver_hold": True,
        "nvidia_driver_reboot": False, "nvidia_driver_expect_gpus": True, "nvidia_driver_minimum_branch": None,
        "vllm_install_minimum_driver": None}


def test_no_gpus_listed_expects_none():
    data = spec_data(hosts=[host(gpus={"expected_count": 0}, driver={})], instances=[])
    variables = driver_vars(data)
    assert (variables["nvidia_driver_manage"], variables["nvidia_driver_expect_gpus"]) == (True, False)


def test_containers_need_their_images_build_and_vllm_install_only_the_venvs():
    data = spec_data(hosts=[host(gpus=gpus("NVIDIA H200", "NVIDIA H200"),
                                 vllm={"cuda": "12.9", "wheelhouse": None, "index_url": "https://mirror.example/simple"})],
                     instances=[instance("venv", 8000, gpus=[0]),
                                instance("pod", 8001, gpus=[1], container={"engine": "podman"})])
    variables = driver_vars(data)
    assert (variables["nvidia_driver_minimum_branch"], variables["vllm_install_minimum_driver"]) == ("580", "525")


def test_a_container_tag_naming_no_known_version_sets_no_minimum():
    data = spec_data(instances=[instance("pod", 8001, container={"engine": "podman", "tag": "nightly"})])
    variables = driver_vars(data)
    assert (variables["nvidia_driver_minimum_branch"], variables["vllm_install_minimum_driver"]) == (None, None)
