"""The memory plan in `provision plan` / `apply`, and the planner against the real H200 run."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from provisioner.base.paths import EXAMPLES_DIR
from provisioner.cli.main import app
from provisioner.plan import build_plan
from provisioner.spec import load_spec, validate_spec
from provisioner.validation.memory_plan import GPU_MEMORY_MIB
from provisioner.vllm.flags import length
from provisioner.vllm.memory import InstanceDemand, cuda_total_bytes, load_model_shape, plan_gpu
from tests.unit.conftest import host, instance, spec_data, write_spec

H200_RUNS = Path(__file__).resolve().parents[1] / "fixtures" / "vllm" / "h200-runs"
RTX_3090 = {"devices": [{"index": 0, "uuid": "GPU-5e3c1a2b-7d4f-4c1e-9a8b-3f2e1d0c9b8a", "model": "NVIDIA GeForce RTX 3090"}]}


def invoke(*args):
    return CliRunner().invoke(app, [str(arg) for arg in args])


def test_the_plan_of_seed1_is_the_planners_for_its_card_and_flags():
    (plan,) = build_plan(load_spec(EXAMPLES_DIR / "seed1-3090.yml"))
    (gpu,) = plan.memory
    expected = plan_gpu(cuda_total_bytes(GPU_MEMORY_MIB["NVIDIA GeForce RTX 3090"] * 2**20),
                        [InstanceDemand("qwen7b", load_model_shape("Qwen/Qwen2.5-7B-Instruct"), 0.95, dtype="bfloat16",
                                        max_model_len=4096, max_num_seqs=128, block_size=16)], 0.95)
    assert (gpu.label, gpu.instances, gpu.problems) == ("GPU 0", ["qwen7b"], [])
    assert gpu.plan.table_rows() == expected.table_rows()
    assert gpu.plan.instances[0].kv_tokens > 4096  # holds a full-length sequence


def test_an_instance_that_does_not_fit_stops_plan_and_apply_before_any_host(tmp_path):
    data = spec_data(hosts=[host("ws3090", "192.0.2.10", gpus=RTX_3090)],
                     instances=[instance("chat", 8000, share=0.45, on="ws3090", model="Qwen/Qwen2.5-7B-Instruct",
                                         options={"max-model-len": 4096})])
    path = write_spec(tmp_path / "spec.yml", data)

    planned = invoke("plan", "--spec", path)
    assert planned.exit_code == 1
    assert "memory: ws3090 GPU 0: chat: " in planned.output and "gpu_memory_utilization" in planned.output

    applied = invoke("apply", "--spec", path)
    assert applied.exit_code == 1
    assert "nothing applied" in applied.output and "ok=" not in applied.output  # no playbook ran


def test_a_gpu_of_unknown_memory_or_a_model_of_unknown_shape_gets_a_note_not_a_guess():
    unknown_card = spec_data(hosts=[host(gpus={"devices": [{"index": 0, "uuid": RTX_3090["devices"][0]["uuid"],
                                                            "model": "NVIDIA A40"}]})])
    (plan,) = build_plan(validate_spec(unknown_card))
    assert plan.memory[0].plan is None
    assert plan.memory[0].note.startswith("memory of GPU 0 (NVIDIA A40) unknown — set its memory_mib")
    unknown_model = spec_data(hosts=[host(gpus=RTX_3090)],
                              instances=[instance("chat", 8000, model="org/never-heard-of")])
    (plan,) = build_plan(validate_spec(unknown_model))
    assert plan.memory[0].note.startswith("chat: ") and "org/never-heard-of" in plan.memory[0].note


def test_memory_mib_in_the_spec_wins_and_stays_out_of_the_roles_variables():
    card = {"devices": [{**RTX_3090["devices"][0], "model": "NVIDIA A40", "memory_mib": 46068}]}
    spec = validate_spec(spec_data(hosts=[host(gpus=card)], instances=[instance("chat", 8000, share=0.5)]))
    (plan,) = build_plan(spec)
    assert plan.memory[0].plan.total_bytes == cuda_total_bytes(46068 * 2**20)
    from provisioner.fleet.inventory import host_vars
    assert "memory_mib" not in host_vars(spec.hosts[0], spec.instances)["nvidia_gpu_devices"][0]


def test_lengths_read_as_vllm_reads_them():
    assert [length(v) for v in (4096, "32k", "32K", "auto", None)] == [4096, 32000, 32768, None, None]


def test_the_planner_predicted_the_real_h200_within_a_block_or_four():
    """tests/fixtures/vllm/h200-runs: predictions made before the run (predictions.json), vLLM 0.25.0's
    own log lines of the run (results.json: 'GPU KV cache size', 'Available KV cache memory')."""
    predicted = json.loads((H200_RUNS / "predictions.json").read_text())
    measured = json.loads((H200_RUNS / "results.json").read_text())
    compared = 0
    for run in ("one", "three"):
        assert predicted[run]["problems"] == []
        for name, logged in measured[run].items():
            guess = predicted[run]["instances"][name]
            assert logged["ready_rc"] == 0, logged["ready_output"]
            assert abs(guess["kv_tokens"] - int(logged["kv_tokens"])) <= 4 * 16, name  # 4 blocks of 16 tokens
            assert abs(guess["kv_gib"] - float(logged["kv_gib"])) < 0.01, name
            compared += 1
    assert compared == 4
