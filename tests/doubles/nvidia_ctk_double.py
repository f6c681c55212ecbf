#!/usr/bin/python3
"""TEST DOUBLE — a stand-in for NVIDIA's `nvidia-ctk` (version @VERSION@), shipped by the lab's TEST DOUBLE
package nvidia-container-toolkit-base (tests/lab/container_toolkit.py); the test hosts have no GPU.

  cdi generate [--output=PATH] [--device-name-strategy=index|uuid ...]
      a CDI spec (JSON, which is YAML) of the GPUs `nvidia-smi -L` lists (the lab's TEST DOUBLE nvidia-smi),
      kind nvidia.com/gpu, each GPU named by each strategy; its edits set NVIDIA_VISIBLE_DEVICES (no device
      nodes: there are none). As the real one: the output and the strategies also come from the environment
      (NVIDIA_CTK_CDI_OUTPUT_FILE_PATH, NVIDIA_CTK_CDI_GENERATE_DEVICE_NAME_STRATEGIES), by default index and uuid;
      no output: the spec goes to stdout.
  [--quiet] config ...      what the package's postinst runs: nothing to configure here
  --version

Every `cdi generate` appends a line to LOG: the version, the output, the strategies and the systemd unit that
ran it (from /proc/self/cgroup: nvidia-cdi-refresh.service, vllm-provision-cdi-refresh.service, or an SSH
session's scope), which the tests read to see which refresh fired.
"""
import json
import os
import re
import subprocess
import sys
import time

VERSION = "@VERSION@"
LOG = "/var/log/nvidia-ctk-double.jsonl"


def unit():
    with open("/proc/self/cgroup") as handle:
        return handle.read().strip().rsplit("/", 1)[-1]


def generate(arguments):
    output = os.environ.get("NVIDIA_CTK_CDI_OUTPUT_FILE_PATH", "")
    strategies = [name for name in os.environ.get("NVIDIA_CTK_CDI_GENERATE_DEVICE_NAME_STRATEGIES", "").split(",") if name]
    flagged = []
    for argument in arguments:
        if argument.startswith("--output="):
            output = argument.split("=", 1)[1]
        elif argument.startswith("--device-name-strategy="):
            flagged.append(argument.split("=", 1)[1])
        else:
            sys.exit("TEST DOUBLE nvidia-ctk: unsupported argument %s" % argument)
    strategies = flagged or strategies or ["index", "uuid"]
    listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=True).stdout
    gpus = re.findall(r"^GPU (\d+): .* \(UUID: (\S+)\)$", listing, re.MULTILINE)
    devices = [{"name": index if strategy == "index" else uuid,
                "containerEdits": {"env": ["NVIDIA_VISIBLE_DEVICES=%s" % uuid]}}
               for strategy in strategies for index, uuid in gpus]
    spec = json.dumps({"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu", "devices": devices,
                       "containerEdits": {"env": ["VP_LAB_CDI_DOUBLE=%s" % VERSION]}}, indent=2) + "\n"
    if output:
        os.makedirs(os.path.dirname(output), exist_ok=True)
        with open(output, "w") as handle:
            handle.write(spec)
    else:
        sys.stdout.write(spec)
    os.makedirs(os.path.dirname(LOG), exist_ok=True)
    with open(LOG, "a") as handle:
        handle.write(json.dumps({"version": VERSION, "output": output, "strategies": strategies, "unit": unit(),
                                 "time": time.time()}) + "\n")


def main(argv):
    arguments = [argument for argument in argv if argument != "--quiet"]
    if arguments == ["--version"]:
        print("TEST DOUBLE of the NVIDIA Container Toolkit CLI version %s" % VERSION)
    elif arguments[:2] == ["cdi", "generate"]:
        generate(arguments[2:])
    elif arguments[:1] != ["config"]:
        sys.exit("TEST DOUBLE nvidia-ctk: unsupported command %s" % " ".join(argv))


if __name__ == "__main__":
    main(sys.argv[1:])
