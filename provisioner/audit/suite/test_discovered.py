"""Profile mode only: the vLLM units and containers discovery found on a server we did not build.

What discovery read (units by name; containers with image, ports, /dev/shm size, command line and
the environment the rules ask about) is reported; the profile's rules apply to the containers.
Spec mode has no discovery: these checks do not run there.
"""

from provisioner.audit.checks import REPORTED, UNSET, each

discovery = each(lambda expected: [expected] if "containers" in expected else [], ids=lambda _: "discovery")
containers = each(lambda expected: expected.get("containers", {}).get("found", []), ids=lambda found: found["name"])


def per_container_rule(key: str):
    return each(
        lambda expected: [
            (container, name, rule)
            for container in expected.get("containers", {}).get("found", [])
            for name, rule in container["rules"][key].items()
        ],
        ids=lambda entry: f"{entry[0]['name']}-{entry[1]}",
    )


@discovery
def test_units_found(case, audit):
    names = [unit["name"] for unit in case.item["units"]]
    audit.expect("vLLM units", REPORTED, names or "none found")


@discovery
def test_gpus_found(case, audit):
    found = case.item["gpus_found"]
    audit.expect("GPUs", REPORTED, [f"GPU {index}" for index in found["indexes"]] or f"none found ({found['problem']})")


@discovery
def test_containers_found(case, audit):
    found, tools = case.item["containers"]["found"], case.item["containers"]["tools"]
    if not tools:
        actual = "none found (no docker or podman)"
    else:
        actual = [f"{container['name']} ({container['tool']})" for container in found] or f"none found ({', '.join(tools)})"
    audit.expect("vLLM containers", REPORTED, actual)


@containers
def test_container_image(case, audit):
    audit.expect(f"container {case.item['name']}: image", REPORTED, case.item["image"])


@containers
def test_container_ports(case, audit):
    audit.expect(f"container {case.item['name']}: ports", REPORTED, case.item["ports"] or "none published")


@containers
def test_container_shm(case, audit):
    shm = case.target["shm"]
    check = f"container {case.item['name']}: /dev/shm size"
    if shm["size"] is None:
        audit.not_applicable(check, "(any)", "the profile sets no shm_size_min")
    actual = case.item["shm_bytes"]
    audit.expect(check, f"at least {shm['bytes']} bytes ({shm['size']})", f"{actual} bytes",
                 passed=actual is not None and actual >= shm["bytes"])


@per_container_rule("environment")
def test_container_environment(case, audit):
    container, name, rule = case.item
    audit.expect(f"container {container['name']}: Environment {name}", rule, container["environment"].get(name, UNSET))


@containers
def test_container_command_line(case, audit):
    audit.expect(f"container {case.item['name']}: command line", case.item["rules"]["command_line"],
                 case.item["command_line"])
