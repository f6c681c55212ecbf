# SPDX-License-Identifier: Apache-2.0
# Part of vllm-provision. Runs on the controller: the roles' preflights check values with the spec's own rules.
"""The kinds of value the spec checks, as Jinja tests for the roles' preflights (one rule each, in
plugins/module_utils/value_rules.py, which the spec and the audit use too):

    shm_size is vllm_provision.gpu_host.size
    node_exporter_gpu_interval is vllm_provision.gpu_host.duration
    node_exporter_port | int is vllm_provision.gpu_host.port
    vllm_service_instance.name is vllm_provision.gpu_host.name
    vllm_service_instance.host is vllm_provision.gpu_host.address
    nvidia_driver_version is vllm_provision.gpu_host.driver_version(nvidia_driver_branch | string)
"""

from __future__ import annotations

from ansible_collections.vllm_provision.gpu_host.plugins.module_utils import value_rules

RULES = {
    "size": value_rules.size_problem,
    "duration": value_rules.duration_problem,
    "port": value_rules.port_problem,
    "address": value_rules.address_problem,
    "name": value_rules.name_problem,
    "gpu_uuid": value_rules.gpu_uuid_problem,
    "vllm_version": value_rules.vllm_version_problem,
    "driver_branch": value_rules.driver_branch_problem,
    "driver_version": value_rules.driver_version_problem,  # (branch): and of that branch
    "toolkit_version": value_rules.toolkit_version_problem,
}


def _passes(rule):
    def test(value, *arguments) -> bool:
        return rule(value, *arguments) is None

    return test


class TestModule:
    def tests(self):
        return {name: _passes(rule) for name, rule in RULES.items()}
