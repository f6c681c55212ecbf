"""The planner's warning for tensor parallelism across GPUs without P2P (seed 3's PHB case)."""

from __future__ import annotations

from pathlib import Path

from provisioner.base.paths import EXAMPLES_DIR
from provisioner.gpu.facts import read_facts
from provisioner.gpu.topology import tensor_parallel_p2p_warnings
from provisioner.spec import load_spec, validate_spec
from tests.unit.conftest import UUID0, UUID1, host, instance, spec_data

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "gpu"


def two_gpu_spec(model: str, tensor_parallel: int = 2, pipeline_parallel: int = 1, **instance_fields):
    devices = [{"index": 0, "uuid": UUID0, "model": model}, {"index": 1, "uuid": UUID1, "model": model}]
    spec = validate_spec(spec_data(
        hosts=[host(gpus={"devices": devices})],
        instances=[instance("big", 8000, share=0.9, gpus=[0, UUID1],
                            options={"tensor-parallel-size": tensor_parallel,
                                     "pipeline-parallel-size": pipeline_parallel}, **instance_fields)],
    ), check_files=False)
    return spec.hosts[0], spec.instances


def test_tensor_parallel_over_geforce_cards_warns_without_facts():
    (warning,) = tensor_parallel_p2p_warnings(*two_gpu_spec("NVIDIA GeForce RTX 4090"))
    assert warning == (
        "big: tensor-parallel-size 2 spans GPUs 0, 1 without P2P (GPUs 0 and 1: GeForce cards: NVIDIA's driver "
        "offers no P2P over PCIe, only over an NVLink bridge) — NCCL then copies through host memory, or hangs where "
        'the driver claims P2P it cannot do; run one instance per GPU, or set env NCCL_P2P_DISABLE: "1" on this instance'
    )


def test_with_the_hosts_facts_the_p2p_status_decides():
    pair = two_gpu_spec("NVIDIA GeForce RTX 4090")
    seed3 = read_facts(recording=FIXTURES / "rtx4090x2" / "nvml.json")
    (warning,) = tensor_parallel_p2p_warnings(*pair, facts=seed3)
    assert "(GPUs 0 and 1: PCIe path PHB, P2P read gpu not supported, P2P write gpu not supported)" in warning

    h200 = read_facts(recording=FIXTURES / "h200x2" / "nvml.json")  # PHB ancestor, but NVLink: P2P ok
    assert tensor_parallel_p2p_warnings(*two_gpu_spec("NVIDIA H200"), facts=h200) == []
    assert tensor_parallel_p2p_warnings(*pair, facts=h200) == []  # the facts win over the models


def test_no_warning_where_there_is_nothing_to_warn_about():
    assert tensor_parallel_p2p_warnings(*two_gpu_spec("NVIDIA H200")) == []  # unknown without facts: no guess
    assert tensor_parallel_p2p_warnings(*two_gpu_spec("NVIDIA GeForce RTX 4090", tensor_parallel=1, pipeline_parallel=2)) == []
    assert tensor_parallel_p2p_warnings(
        *two_gpu_spec("NVIDIA GeForce RTX 4090", env={"NCCL_P2P_DISABLE": "1"})) == []


def test_seed_3_runs_one_instance_per_card_so_no_warning():
    spec = load_spec(EXAMPLES_DIR / "seed3-2x4090.yml")
    seed3 = read_facts(recording=FIXTURES / "rtx4090x2" / "nvml.json")
    assert tensor_parallel_p2p_warnings(spec.hosts[0], spec.instances, facts=seed3) == []
