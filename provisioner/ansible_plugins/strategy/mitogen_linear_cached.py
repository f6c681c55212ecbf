"""Ansible strategy plugin `mitogen_linear_cached`: Mitogen's `mitogen_linear`, with its module scan
compiling each source once per run.

For every module a play uses, Mitogen's scan (ansible_mitogen/module_finder.py) compiles the module
and every module_utils file it imports, to read their imports; files that many modules share
(module_utils/basic.py and its own imports) are compiled again for each module. On a no-change apply
of one host that was about 1.7 s of the controller's CPU (benchmarks/structure_costs.py). The same
source compiles to the same code object, so the builtin `compile` that module gets is memoised.
`provision apply` runs this strategy where the user names none (provisioner/base/ansible_config.py).
"""

from __future__ import annotations

import functools

import ansible_mitogen.loaders
import ansible_mitogen.module_finder
import ansible_mitogen.strategy

# the name module_finder's functions resolve before the builtin; set before Mitogen forks its
# connection multiplexer (at the strategy's first run), which inherits it
ansible_mitogen.module_finder.compile = functools.lru_cache(maxsize=None)(compile)

Base = ansible_mitogen.loaders.strategy_loader.get("linear", class_only=True)


class StrategyModule(ansible_mitogen.strategy.StrategyMixin, Base):
    pass
