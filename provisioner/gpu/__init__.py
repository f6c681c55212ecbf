"""The NVIDIA GPU layer: facts (NVML or nvidia-smi), P2P topology, the audit's GPU checks.

Nothing here imports the spec (pydantic): `provision facts` runs on a GPU host with
only the standard library, typer, rich and nvidia-ml-py. The code that reads and sets
GPUs is shared with the Ansible module `nvidia_gpu`: it lives in
roles/nvidia_gpu/module_utils/ (Ansible ships it to the targets) and is loaded from
there by `provisioner.base.module_utils`.
"""
