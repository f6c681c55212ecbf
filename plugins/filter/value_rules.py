# SPDX-License-Identifier: Apache-2.0
# Part of vllm-provision. Runs on the controller: the roles' templates write host:port with the spec's own rule.
"""What the value rules turn a value into, as Jinja filters for the roles' templates (one rule each, in
plugins/module_utils/value_rules.py, which the spec, the plan and the audit use too):

    {{ server.address | vllm_provision.gpu_host.host_port(server.port) }}    2001:db8::11 → [2001:db8::11]:8000
    {{ bind | vllm_provision.gpu_host.bracketed }}                           :: → [::]

`provision plan` renders the same templates with plain Jinja2, where provisioner/validation/roles.py registers the same
functions under the same names (value_rules.FILTERS).
"""

from __future__ import annotations

from ansible_collections.vllm_provision.gpu_host.plugins.module_utils import value_rules


class FilterModule:
    def filters(self):
        return dict(value_rules.FILTERS)
