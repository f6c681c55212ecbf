"""Role nvidia_driver without a host: the shared parsing and decisions (plugins/module_utils/nvidia_driver_state.py)
on outputs recorded from the lab's driver hosts (tests/fixtures/nvidia-driver/) and on constructed ones, the role's
package sets (vars/packages.yml), its files as Ansible renders them, its variables and the module's documentation."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

from provisioner.base.module_utils import load_module_utils
from provisioner.base.paths import COLLECTION, PLAYBOOKS_DIR, ROLES_DIR, collections_dir

state = load_module_utils("nvidia_driver_state")

ROLE = ROLES_DIR / "nvidia_driver"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "nvidia-driver"
KERNEL = "6.1.0-57-amd64"  # the lab's headers kernel when the fixtures were recorded
SETS = yaml.safe_load((ROLE / "vars" / "packages.yml").read_text())["_nvidia_driver_package_sets"]
D470 = "470.256.02-1~deb12u1"
D535 = "535.309.01-0+deb12u1"


def fixture(*parts: str) -> str:
    return (FIXTURES.joinpath(*parts)).read_text()


def load(path: Path):
    return yaml.safe_load(path.read_text())


# --------------------------------------------------------------------------- recorded outputs


def test_dpkg_query_of_the_470_host_has_the_set_installed_and_held():
    packages = state.parse_dpkg_query(fixture("bookworm-470", "dpkg-query.txt"))
    installed = state.installed_versions(packages)
    chosen = state.choose_set(SETS, "bookworm", "distribution", "470", "proprietary")
    assert {name: installed[name] for name in chosen["packages"]} == dict.fromkeys(chosen["packages"], D470)
    assert installed["nvidia-persistenced"] == "535.171.04-1~deb12u1"  # a companion: versioned on its own
    assert installed["linux-headers-amd64"] == "6.1.192-3" and f"linux-headers-{KERNEL}" in installed
    assert [name for name in chosen["packages"] + chosen["companions"] if packages[name]["want"] == "hold"] == \
        chosen["packages"] + chosen["companions"]
    assert state.driver_version(chosen, installed) == "470.256.02"
    assert state.header_kernels_of(installed) == [KERNEL]
    assert sorted(line.split()[0] for line in fixture("bookworm-470", "showhold.txt").split()) == \
        sorted(chosen["packages"] + chosen["companions"])


def test_dkms_status_as_dkms_3_prints_it_after_each_branch():
    assert state.parse_dkms_status(fixture("bookworm-470", "dkms-status.txt")) == [
        {"module": "nvidia-tesla-470", "version": "470.256.02", "kernel": KERNEL, "arch": "x86_64",
         "state": "installed", "note": ""}]
    assert [(entry["module"], entry["version"], entry["kernel"], entry["state"])
            for entry in state.parse_dkms_status(fixture("bookworm-535", "dkms-status.txt"))] == [
        ("nvidia-current", "535.309.01", KERNEL, "installed")]
    assert [(entry["module"], entry["version"], entry["state"])
            for entry in state.parse_dkms_status(fixture("nvidia-590", "dkms-status.txt"))] == [
        ("nvidia", "590.44.01", "installed")]


def test_modinfo_of_debians_renamed_modules_gives_the_version_and_keeps_the_name_nvidia():
    fields = dict(line.split(":", 1) for line in fixture("bookworm-535", "modinfo-nvidia-current.txt").splitlines()
                  if ":" in line and not line.startswith(" "))
    assert fields["version"].strip() == "535.309.01"
    assert fields["filename"].strip() == f"/lib/modules/{KERNEL}/updates/dkms/nvidia-current.ko"
    assert fields["vermagic"].strip().startswith(KERNEL + " ")
    # loaded, it is /sys/module/nvidia: the file is renamed, the module is not
    assert fixture("bookworm-535", "modinfo-name.txt").split() == ["nvidia", "535.309.01"]
    assert "version:        470.256.02" in fixture("bookworm-470", "modinfo-nvidia-tesla-470.txt")


def test_madison_lists_the_versions_newest_first_and_the_branch_choice_takes_the_newest():
    madison = state.parse_madison(fixture("bookworm-470", "madison.txt"))
    assert madison["nvidia-tesla-470-kernel-dkms"] == [D470]
    assert madison["nvidia-kernel-dkms"] == [D535]
    chosen = state.choose_set(SETS, "bookworm", "distribution", "535", "proprietary")
    picked, missing = state.choose_versions(chosen, madison, "535", None)
    assert (picked, missing) == (dict.fromkeys(chosen["packages"], D535), [])
    assert state.choose_versions(chosen, madison, "535", "535.261.03")[1][0] == {
        "package": "nvidia-kernel-dkms", "versions": [D535]}


def test_madison_over_two_repositories_and_the_pin_s_branch():
    madison = state.parse_madison(fixture("nvidia-590", "madison.txt"))
    assert madison["libcuda1"] == ["590.44.01-1", "580.95.05-1", "535.309.01-0+deb12u1"]  # the doubles', then Debian's
    chosen = state.choose_set(SETS, "bookworm", "nvidia", "580", "open")
    assert state.choose_versions(chosen, madison, "580", None) == (
        {"nvidia-driver-cuda": "580.95.05-1", "nvidia-kernel-open-dkms": "580.95.05-1"}, [])
    assert "version:        590.44.01" in fixture("nvidia-590", "modinfo-nvidia.txt")
    packages = state.parse_dpkg_query(fixture("nvidia-590", "dpkg-query.txt"))
    installed = state.installed_versions(packages)
    assert state.driver_version(state.choose_set(SETS, "bookworm", "nvidia", "590", "open"), installed) == "590.44.01"


def test_the_simulated_switch_from_470_to_535_installs_one_set_and_purges_the_other():
    steps = state.parse_simulation(fixture("bookworm-470", "simulate-535.txt"))
    assert [(step["package"], step["old"]) for step in steps if step["action"] != "install"] == [
        ("libnvidia-tesla-470-cfg1", D470), ("libnvidia-tesla-470-cuda1", D470), ("nvidia-tesla-470-kernel-dkms", D470),
        ("nvidia-tesla-470-smi", D470)]
    assert {step["action"] for step in steps if step["action"] != "install"} == {"purge"}
    assert state.parse_simulation("Inst libfoo [1.0-1] (2.0-1 Debian:12 [amd64])\nRemv bar [3]\nConf libfoo (2.0-1)\n") == [
        {"action": "install", "package": "libfoo", "old": "1.0-1", "new": "2.0-1"},
        {"action": "remove", "package": "bar", "old": "3", "new": None}]
    installs = {step["package"]: step for step in steps if step["action"] == "install"}
    assert installs["nvidia-kernel-dkms"]["new"] == D535 and installs["nvidia-kernel-dkms"]["old"] is None
    assert "nvidia-persistenced" not in installs  # installed already, at the version both sets use


def test_a_host_at_the_branch_is_left_alone_and_one_a_branch_away_is_not():
    packages = state.parse_dpkg_query(fixture("bookworm-535", "dpkg-query.txt"))
    installed = state.installed_versions(packages)
    chosen = state.choose_set(SETS, "bookworm", "distribution", "535", "proprietary")
    others = state.other_packages(SETS["bookworm"], "distribution", "535", "proprietary", chosen, installed)
    headers = ["linux-headers-amd64"]
    assert others == []
    assert state.at_branch_problems(chosen, installed, others, headers, {KERNEL: "535.309.01"}, "535", None) == []
    assert state.hold_changes(chosen["packages"] + chosen["companions"], packages, True) == ([], [])
    # the same host asked for 470: every package of that set is missing
    asked = state.choose_set(SETS, "bookworm", "distribution", "470", "proprietary")
    away = state.other_packages(SETS["bookworm"], "distribution", "470", "proprietary", asked, installed)
    assert away == ["libcuda1", "libnvidia-cfg1", "nvidia-kernel-dkms", "nvidia-smi"]
    problems = state.at_branch_problems(asked, installed, away, headers, {KERNEL: None}, "470", None)
    assert problems[0] == "nvidia-tesla-470-kernel-dkms is not installed"
    assert "nvidia-kernel-dkms (535.309.01-0+deb12u1) is of another driver set" in problems


# --------------------------------------------------------------------------- constructed outputs


def test_dkms_2_lines_a_module_only_added_and_a_warning_are_read():
    text = ("nvidia, 470.256.02, 5.15.0-91-generic, x86_64: installed\n"
            "nvidia/580.95.05: added\n"
            "nvidia/580.95.05, 6.8.0-45-generic, x86_64: installed (WARNING! Diff between built and installed module!)\n"
            "garbage line\n")
    assert [(entry["module"], entry["version"], entry["kernel"], entry["state"], entry["note"])
            for entry in state.parse_dkms_status(text)] == [
        ("nvidia", "470.256.02", "5.15.0-91-generic", "installed", ""),
        ("nvidia", "580.95.05", None, "added", ""),
        ("nvidia", "580.95.05", "6.8.0-45-generic", "installed", "(WARNING! Diff between built and installed module!)")]


@pytest.mark.parametrize("version, upstream, branch", [
    ("535.309.01-0+deb12u1", "535.309.01", "535"),
    ("470.256.02-5~bpo12+1", "470.256.02", "470"),
    ("1:580.95.05-1", "580.95.05", "580"),
    ("580.95.05-0ubuntu0.24.04.2", "580.95.05", "580"),
    ("590.44.01", "590.44.01", "590"),
])
def test_upstream_versions_and_branches(version, upstream, branch):
    assert state.upstream_version(version) == upstream
    assert state.in_branch(version, branch) and not state.in_branch(version, "5" + branch)
    assert state.in_branch(version, branch, upstream) and not state.in_branch(version, branch, upstream + "9")


def test_the_kernels_the_module_must_be_built_for():
    boot = ["6.1.0-55-amd64", "6.1.0-57-amd64", "6.1.0-9-amd64"]
    assert state.target_kernels(boot, "6.1.0-55-amd64", []) == ["6.1.0-57-amd64", "6.1.0-55-amd64"]
    assert state.target_kernels(boot, "6.1.0-57-amd64", []) == ["6.1.0-57-amd64"]
    assert state.target_kernels(boot, "6.18.44-other", []) == ["6.1.0-57-amd64"]  # running, not installed
    # a container: no image, the kernels whose headers are there
    assert state.target_kernels([], "6.18.44-fc", ["6.1.0-57-amd64", "6.1.0-9-amd64"]) == ["6.1.0-57-amd64",
                                                                                          "6.1.0-9-amd64"]


def test_the_headers_follow_the_kernel_image_metapackages():
    debian = {"linux-image-amd64": "6.1.192-3", "linux-image-6.1.0-57-amd64": "6.1.192-3",
              "linux-image-6.1.0-57-amd64-unsigned": "x", "linux-image-amd64-dbg": "x"}
    assert state.headers_packages(debian, [KERNEL], [KERNEL], "linux-headers-amd64") == [
        "linux-headers-amd64", f"linux-headers-{KERNEL}"]
    ubuntu = {"linux-image-generic-hwe-22.04": "x", "linux-image-6.8.0-45-generic": "x",
              "linux-image-unsigned-6.8.0-45-generic": "x"}
    assert state.headers_packages(ubuntu, ["6.8.0-45-generic"], ["6.8.0-45-generic"], "linux-headers-generic") == [
        "linux-headers-generic-hwe-22.04", "linux-headers-6.8.0-45-generic"]
    # a container: no image; the target kernels come from headers, which the fallback brings
    assert state.headers_packages({}, [KERNEL], [], "linux-headers-amd64") == ["linux-headers-amd64"]


def test_package_sets_of_the_role():
    assert state.choose_set(SETS, "bookworm", "distribution", "535", "proprietary") == {
        "packages": ["nvidia-kernel-dkms", "nvidia-smi", "libcuda1", "libnvidia-cfg1"],
        "companions": ["nvidia-persistenced"], "module": "nvidia-current"}
    assert state.choose_set(SETS, "bookworm", "nvidia", "590", "open") == {
        "packages": ["nvidia-driver-cuda", "nvidia-kernel-open-dkms"], "companions": [], "module": "nvidia"}
    assert state.choose_set(SETS, "noble", "distribution", "580", "open")["packages"] == [
        "nvidia-headless-580-server-open", "nvidia-utils-580-server"]
    with pytest.raises(state.SetProblem, match="bookworm distribution 535, open kernel modules: bookworm's open "
                                               "modules .* are stuck at 535.261.03"):
        state.choose_set(SETS, "bookworm", "distribution", "535", "open")
    with pytest.raises(state.SetProblem, match=r"^bookworm distribution has no driver branch 580 \(branches: 470, 535\)$"):
        state.choose_set(SETS, "bookworm", "distribution", "580", "proprietary")
    with pytest.raises(state.SetProblem, match=r"^no NVIDIA driver package set for bullseye \(the role knows "):
        state.choose_set(SETS, "bullseye", "nvidia", "580", "open")
    with pytest.raises(state.SetProblem, match=r"^noble: source nvidia is not offered"):
        state.choose_set(SETS, "noble", "nvidia", "580", "open")


def test_which_installed_packages_go_with_a_branch_source_or_flavour_change():
    nvidia = SETS["bookworm"]
    at_580 = {"nvidia-driver-cuda": "580.95.05-1", "nvidia-kernel-open-dkms": "580.95.05-1",
              "nvidia-smi": "580.95.05-1", "libcuda1": "580.95.05-1", "nvidia-persistenced": "535.171.04-1~deb12u1"}
    open_590 = state.choose_set(SETS, "bookworm", "nvidia", "590", "open")
    # 580 -> 590: nvidia-smi and libcuda1 are Debian's names too, but the new set upgrades them (the module
    # keeps those the transaction installs): offered for removal, never the set's own packages
    assert state.other_packages(nvidia, "nvidia", "590", "open", open_590, at_580) == ["libcuda1", "nvidia-smi"]
    assert state.other_packages(nvidia, "nvidia", "580", "open", open_590, at_580) == []
    # open -> proprietary: the other flavour's module package goes, whatever its version
    proprietary = state.choose_set(SETS, "bookworm", "nvidia", "580", "proprietary")
    assert state.other_packages(nvidia, "nvidia", "580", "proprietary", proprietary, at_580) == [
        "nvidia-kernel-open-dkms"]
    # NVIDIA's repository -> Debian's 535: NVIDIA's set goes; nvidia-smi and libcuda1 are the new set's own
    # (installed at 535, a downgrade)
    debian = state.choose_set(SETS, "bookworm", "distribution", "535", "proprietary")
    assert state.other_packages(nvidia, "distribution", "535", "proprietary", debian, at_580) == [
        "nvidia-driver-cuda", "nvidia-kernel-open-dkms"]
    # Ubuntu's families by branch
    ubuntu = state.choose_set(SETS, "noble", "distribution", "580", "open")
    assert state.other_packages(SETS["noble"], "distribution", "580", "open", ubuntu, {
        "nvidia-headless-570-server-open": "570.195.03-0ubuntu0.24.04.1", "nvidia-utils-580-server": "580.95.05-0ubuntu1",
        "nvidia-headless-580-server": "580.95.05-0ubuntu1"}) == ["nvidia-headless-570-server-open",
                                                                 "nvidia-headless-580-server"]


def test_not_at_the_branch_says_why():
    chosen = state.choose_set(SETS, "bookworm", "nvidia", "580", "open")
    installed = {"nvidia-driver-cuda": "580.95.05-1", "nvidia-kernel-open-dkms": "580.82.07-1", "linux-headers-amd64": "x"}
    headers = ["linux-headers-amd64", f"linux-headers-{KERNEL}"]
    assert state.at_branch_problems(chosen, installed, [], headers, {KERNEL: "580.82.07"}, "580", "580.95.05") == [
        "nvidia-kernel-open-dkms is 580.82.07-1, not 580.95.05", f"linux-headers-{KERNEL} is not installed"]
    installed["nvidia-kernel-open-dkms"] = installed[f"linux-headers-{KERNEL}"] = "580.95.05-1"
    assert state.at_branch_problems(chosen, installed, [], headers, {KERNEL: None}, "580", None) == [
        f"module nvidia for kernel {KERNEL} is missing, not 580.95.05"]
    assert state.at_branch_problems(chosen, installed, [], headers, {}, "580", None) == [
        "no kernel to build the module for (no kernel image, no kernel headers)"]
    assert state.at_branch_problems(chosen, installed, [], headers, {KERNEL: "580.95.05"}, "580", None) == []


def test_holds_follow_the_setting():
    packages = {"a": {"want": "hold", "status": "installed"}, "b": {"want": "install", "status": "installed"},
                "c": {"want": "install", "status": "not-installed"}}
    assert state.hold_changes(["a", "b", "c", "d"], packages, True) == (["b"], [])
    assert state.hold_changes(["a", "b", "c", "d"], packages, False) == ([], ["a"])


@pytest.mark.parametrize("case, arguments, reasons", [
    ("a container has no kernel of its own", dict(in_container=True, loaded_version="535.261.03"), []),
    ("nothing installed", dict(installed_version=None), []),
    ("at the branch, running", dict(), []),
    ("the old module still loaded", dict(loaded_version="580.82.07"),
     ["the loaded nvidia module is 580.82.07, the installed driver 580.95.05"]),
    ("no module loaded, GPUs expected", dict(loaded_version=None),
     ["no nvidia module is loaded (driver 580.95.05 installed)"]),
    ("no module loaded, no GPU", dict(loaded_version=None, expect_gpus=False), []),
    ("built for the next kernel only", dict(loaded_version=None, expect_gpus=False, running_kernel="6.1.0-55-amd64",
                                            module_versions={KERNEL: "580.95.05", "6.1.0-55-amd64": None}),
     [f"the running kernel 6.1.0-55-amd64 has no module of driver 580.95.05; kernel {KERNEL}, which boots next, has it"]),
    ("nouveau holds the GPUs", dict(loaded_version=None, nouveau_loaded=True),
     ["no nvidia module is loaded (driver 580.95.05 installed)",
      "nouveau is loaded (it holds the GPUs until a boot without it)"]),
])
def test_reboot_reasons(case, arguments, reasons):
    values = dict(in_container=False, running_kernel=KERNEL, boot_kernel=KERNEL, installed_version="580.95.05",
                  module_versions={KERNEL: "580.95.05"}, loaded_version="580.95.05", nouveau_loaded=False,
                  expect_gpus=True)
    assert state.reboot_reasons(**{**values, **arguments}) == reasons, case


# --------------------------------------------------------------------------- the role


def role_variables(**settings) -> dict:
    """The role's defaults and vars as Ansible sees them (its vars are templates), with `settings` on top."""
    variables = {**load(ROLE / "defaults" / "main.yml"), **load(ROLE / "vars" / "packages.yml")}
    for name, value in load(ROLE / "vars" / "main.yml").items():
        variables[name] = trust_as_template(value) if isinstance(value, str) else value
    variables["nvidia_driver_facts"] = {"release": "bookworm", "in_container": False}
    return {**variables, **settings}


def ansible_render(template: str, variables: dict) -> str:
    path = ROLE / "templates" / template
    templar = Templar(loader=DataLoader(), variables=variables)
    templar = templar.copy_with_new_env(searchpath=[str(path.parent)], available_variables=variables)
    return templar.template(trust_as_template(path.read_text()))


def test_the_pin_file_keeps_the_branch_or_the_version():
    pin = ansible_render("nvidia-driver.pref.j2", role_variables())
    assert pin.splitlines()[-3:] == [
        "Package: nvidia-* libnvidia-* libcuda* libnvcuvid* libnvoptix* firmware-nvidia-* cuda-drivers*",
        "Pin: version 580.*", "Pin-Priority: 1000"]
    assert all(line.startswith("Explanation: ") for line in pin.splitlines()[:-3])
    exact = ansible_render("nvidia-driver.pref.j2", role_variables(nvidia_driver_version="580.95.05"))
    assert "Pin: version 580.95.05*\n" in exact


def test_the_source_of_nvidias_repository_is_signed_by_its_key_only():
    source = ansible_render("cuda.sources.j2", role_variables())
    assert source.splitlines()[2:] == [
        "Types: deb", "URIs: https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/", "Suites: /",
        "Signed-By: /etc/apt/keyrings/vllm-provision-cuda.asc EB693B3035CD5710E231E123A4B469963BF863CC"]
    mirror = ansible_render("cuda.sources.j2", role_variables(
        nvidia_driver_cuda_repo_url="http://mirror.example/cuda/{distro}/", nvidia_driver_cuda_repo_key="keys/cuda.gpg",
        nvidia_driver_cuda_repo_key_fingerprint=None))
    assert "URIs: http://mirror.example/cuda/debian12/\n" in mirror
    assert mirror.endswith("Signed-By: /etc/apt/keyrings/vllm-provision-cuda.gpg\n")
    variables = role_variables()
    templar = Templar(loader=DataLoader(), variables=variables)
    assert templar.template(trust_as_template("{{ _nvidia_driver_key_url | trim }}")) == \
        "https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/3bf863cc.pub"


def test_every_option_is_typed_with_its_literal_default_and_the_contracts_names_are_there():
    options = load(ROLE / "meta" / "argument_specs.yml")["argument_specs"]["main"]["options"]
    defaults = load(ROLE / "defaults" / "main.yml")
    assert set(defaults) == set(options)
    assert not any("{{" in str(value) for value in defaults.values())
    for name, value in defaults.items():
        assert options[name].get("default") == value, name
    contract = {"nvidia_driver_manage": False, "nvidia_driver_source": "nvidia", "nvidia_driver_branch": "580",
                "nvidia_driver_version": None, "nvidia_driver_modules": "open", "nvidia_driver_hold": True,
                "nvidia_driver_reboot": False, "nvidia_driver_expect_gpus": True, "nvidia_driver_minimum_branch": None}
    assert {name: defaults[name] for name in contract} == contract


def test_site_runs_the_role_after_nouveau_and_before_the_gpu_settings():
    _lock, play, _gateways, _monitoring, _release = load(PLAYBOOKS_DIR / "site.yml")
    roles = [entry["role"].rsplit(".", 1)[-1] for entry in play["roles"]]
    assert roles[roles.index("nouveau") + 1] == "nvidia_driver"
    assert roles.index("nvidia_driver") < roles.index("shm") < roles.index("nvidia_gpu")


# --------------------------------------------------------------------------- the module


def ansible_env(tmp_path: Path) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("ANSIBLE_", "VIRTUAL_ENV"))}
    env.update(ANSIBLE_COLLECTIONS_PATH=str(collections_dir(tmp_path / "collections")),
               ANSIBLE_HOME=str(tmp_path / "ansible-home"), ANSIBLE_LOCALHOST_WARNING="false", NO_COLOR="1")
    return env


def test_the_module_reads_this_machine_and_changes_nothing(tmp_path):
    """Ad hoc, as Ansible runs it, on this machine (a Debian without a driver): the facts, no set problem for
    bookworm's 535, not at the branch; in check mode `present` only says what it would do."""
    tree = tmp_path / "tree"
    arguments = {"package_sets": SETS, "source": "distribution", "branch": "535", "modules": "proprietary",
                 "state": "present", "update_cache": False, "headers_fallback": {"debian": "linux-headers-{arch}"}}
    done = subprocess.run(
        [str(Path(sys.executable).parent / "ansible"), "localhost", "-c", "local", "-e",
         f"ansible_python_interpreter={sys.executable}", "-t", str(tree), "-m", f"{COLLECTION}.nvidia_driver",
         "-a", json.dumps(arguments), "--check"],
        env=ansible_env(tmp_path), capture_output=True, text=True, timeout=120)
    result = json.loads((tree / "localhost").read_text())
    facts = result["facts"]
    if facts["release"] != "bookworm":
        pytest.skip(f"this machine runs {facts['release']}, not bookworm")
    assert done.returncode == 0, result
    assert facts["set"]["module"] == "nvidia-current" and facts["set_problem"] is None
    assert facts["at_branch"] is False and "nvidia-kernel-dkms is not installed" in facts["not_at_branch"]
    assert result["changed"] and result["changed_driver"] and result["commands"] == []
    assert result["msg"].startswith("would install nvidia-kernel-dkms")


def test_the_module_documentation_renders(tmp_path):
    module = f"{COLLECTION}.nvidia_driver"
    doc = subprocess.run([str(Path(sys.executable).parent / "ansible-doc"), "--type", "module", "--json", module],
                         env=ansible_env(tmp_path), capture_output=True, text=True, timeout=120)
    assert doc.returncode == 0, doc.stderr
    entry = json.loads(doc.stdout)[module]
    assert set(entry["doc"]["options"]) == {"state", "package_sets", "source", "branch", "version", "modules", "hold",
                                            "headers", "headers_fallback", "update_cache", "expect_gpus", "cleanup",
                                            "lock_timeout"}
    assert entry["doc"]["attributes"]["check_mode"]["support"] == "full"
    assert set(entry["return"]) == {"facts", "install", "remove", "hold", "unhold", "commands", "changed_driver"}
