"""The audit's checks, one module per concern (sysctl, nouveau, shm, gpu, …), run in name order.

A concern module declares what it reads and what it checks, and nothing else needs to know it:

    def commands(expected) -> dict[str, str]     # shell commands to run on the host, from its expectations
    def read(expected, outputs) -> dict[str, Any]  # their parsed output: attributes of `facts`

    @each(lambda expected: expected["sysctl"]["settings"].items(), ids=lambda setting: setting[0])
    def at_boot(case, facts, audit):
        \"\"\"`sysctl at boot: KEY` — what it compares.

        Modes: spec, profile.
        \"\"\"
        audit.expect(f"sysctl at boot: {case.item[0]}", expected, actual)

Both functions are optional (a concern may check what other concerns read, or what discovery found).
A command's name is the host's, shared by every concern that declares the same command.
The registry: provisioner/audit/registry.py; the engine that reads and runs: provisioner/audit/engine.py.
"""
