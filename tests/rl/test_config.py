"""The run-config schema: every shipped YAML validates, bad keys and values are named by dotted path,
overrides parse as YAML, configs round-trip, and secrets never reach a saved file."""

from pathlib import Path

import pytest
import torch
import yaml
from hypothesis import given
from hypothesis import strategies as st

from rl.config import (
    ConfigError,
    GRPOSection,
    apply_overrides,
    default_config_path,
    load_run_config,
    parse_run_config,
    save_run_config,
)
from rl.sft import SFTConfig

REPO = Path(__file__).resolve().parents[2]
RUN_CONFIGS = sorted((REPO / "configs").glob("*.yaml"))  # not configs/data (data builds), not deepspeed
TINY = REPO / "configs" / "tiny.yaml"


@pytest.fixture(scope="module")
def tiny_raw() -> dict:
    return yaml.safe_load(TINY.read_text())


def test_the_shipped_run_configs_are_all_here():
    # guards the glob: a renamed folder would make the schema test below pass vacuously
    names = {p.name for p in RUN_CONFIGS}
    assert {"tiny.yaml", "tiny-thinking.yaml", "qwen3-8b-da-multinode.yaml"} <= names


@pytest.mark.parametrize("path", RUN_CONFIGS, ids=lambda p: p.name)
def test_every_shipped_config_validates(path, tmp_path, monkeypatch):
    # from another working directory: data.path folders need not exist, deepspeed files resolve via the repo
    monkeypatch.chdir(tmp_path)
    config = load_run_config(path)
    assert config.to_dict(redact=False) == parse_run_config(yaml.safe_load(path.read_text())).to_dict(
        redact=False
    )
    if config.grpo.deepspeed is not None:
        assert Path(config.grpo.deepspeed_path).is_file()
    completions = config.grpo.prompts_per_step * config.grpo.num_generations
    assert completions % config.grpo.gradient_accumulation_steps == 0


def test_embedded_default_is_tiny_yaml():
    assert default_config_path() == TINY
    assert load_run_config(None) == load_run_config("configs/tiny.yaml")


def test_tiny_default_needs_nothing_from_a_hub_and_runs_on_cpu():
    config = load_run_config(None)
    assert config.model.path is None and config.tokenizer.path is None  # built locally
    assert config.data.path is None and config.data.data_config().tokenizer == "local"  # built inline
    assert config.model.dtype == "float32" and config.model.attn_implementation == "sdpa"  # CPU paths
    assert config.grpo.deepspeed is None and config.rollout.num_actors == 1
    assert config.sft.enabled and config.grpo.enabled and config.export.enabled
    assert config.eval.modes == ["da", "da-nm", "vanilla"]


@pytest.mark.parametrize(
    "raw_key, suggestion",
    [
        ("grpo.num_generation", "num_generations"),
        ("rollout.engine_kwarg", "engine_kwargs"),
        ("model.tiny.hiden_size", "hidden_size"),
        ("rewards.efficency_weight", "efficiency_weight"),
        ("evals", "eval"),
    ],
)
def test_unknown_key_names_dotted_path_and_near_miss(raw_key, suggestion):
    with pytest.raises(ConfigError) as err:
        load_run_config(None, [f"{raw_key}=1"])
    assert f"unknown key '{raw_key}'" in str(err.value)
    assert f"did you mean '{suggestion}'?" in str(err.value)


@pytest.mark.parametrize(
    "override, key",
    [
        ("grpo.num_generations=1", "grpo.num_generations"),
        ("grpo.temperature=0", "grpo.temperature"),
        ("run.block_size=24", "run.block_size"),
        ("grpo.loss_type=nope", "grpo.loss_type"),
        ("data.build.chunk_tokens=0", "data.build.chunk_tokens"),
        ("grpo.deepspeed=configs/deepspeed/zero9.json", "grpo.deepspeed"),
        ("grpo.gradient_accumulation_steps=3", "grpo.gradient_accumulation_steps"),
        ("grpo.top_p=1.5", "grpo.top_p"),
        ("sft.copy_warmup_segment=3", "sft.copy_warmup_segment"),
        ("sft.copy_warmup_target=1.5", "sft.copy_warmup_target"),
        ("sft.copy_warmup_steps=-1", "sft.copy_warmup_steps"),
        ("sft.copy_check_max_nll=0", "sft.copy_check_max_nll"),
        ("sft.copy_check_examples=-1", "sft.copy_check_examples"),
        ("sft.copy_mix_until_loss=0", "sft.copy_mix_until_loss"),
        ("grpo.max_steps=ten", "grpo.max_steps"),
        ("grpo.lr_scheduler_type=constant", "grpo.warmup_steps"),  # it would ignore the 5 warm-up steps
        ("model.attn_implementation=eager", "model.attn_implementation"),
        ("curriculum.task_mix.niah_singel=1", "curriculum.task_mix.niah_singel"),
        ("curriculum.task_mix.niah_multivalue=1", "curriculum.task_mix.niah_multivalue"),  # not built
        ("curriculum.task_mix={niah_single: 0}", "curriculum.task_mix"),
        ("eval.modes=[da, sideways]", "eval.modes[1]"),
        ("eval.samples=4", "eval.samples"),  # greedy samples are one completion repeated
        ("eval.temperature=-1", "eval.temperature"),
        ("eval.sampled_samples=-2", "eval.sampled_samples"),
        ("eval.modes_after_sft=[index]", "eval.modes_after_sft[0]"),  # not an eval mode of the run
        ("eval.modes_after_sft=[]", "eval.modes_after_sft"),
        ("rollout.engine_kwargs.block_size=16", "rollout.engine_kwargs.block_size"),
        ("rewards.mfu=2", "rewards.mfu"),
        ("model.tiny.head_dim=16", "model.tiny"),
        ("logging.wandb_mode=loud", "logging.wandb_mode"),
        ("rollout.weight_sync=nccl", "rollout.weight_sync"),
        ("rollout.weight_sync_timeout_s=0", "rollout.weight_sync_timeout_s"),
        ("rollout.placement=RANDOM", "rollout.placement"),
        ("rollout.resources_per_actor={GPU: 1}", "rollout.resources_per_actor.GPU"),
        ("rollout.resources_per_actor={heed_rollout: -1}", "rollout.resources_per_actor.heed_rollout"),
        ("rollout.resources_per_actor={heed_rollout: many}", "rollout.resources_per_actor.heed_rollout"),
        ("rollout.num_cpus_per_actor=0", "rollout.num_cpus_per_actor"),  # an empty placement bundle
        ("rollout.placement_timeout_s=0", "rollout.placement_timeout_s"),
        ("rollout.replace_timeout_s=-1", "rollout.replace_timeout_s"),
        (
            "rollout.engine_kwargs.distributed_executor_backend=ray",
            "rollout.engine_kwargs.distributed_executor_backend",
        ),
    ],
)
def test_bad_values_name_the_dotted_key(override, key):
    with pytest.raises(ValueError, match=key.replace(".", r"\.").replace("[", r"\[")):
        load_run_config(None, [override])


def test_split_digits_is_for_the_local_tokenizer_only():
    for value in (True, False):
        assert load_run_config(None, [f"tokenizer.split_digits={value}"]).tokenizer.split_digits is value
    own = ["tokenizer.path=some/dir", "data.build.tokenizer=some/dir"]  # a tokenizer of one's own
    with pytest.raises(ValueError, match=r"tokenizer\.split_digits: applies to the local BPE only"):
        load_run_config(None, [*own, "tokenizer.split_digits=true"])
    assert load_run_config(None, [*own, "tokenizer.split_digits=false"]).tokenizer.path == "some/dir"


def test_protocol_tokens_go_into_the_local_bpe_or_a_tokenizer_of_ones_own():
    assert load_run_config(None).tokenizer.protocol_tokens  # configs/tiny.yaml
    # a pretrained tokenizer gains them (rl/added_tokens.py), the default's setting kept
    own = load_run_config(None, ["tokenizer.path=some/dir", "data.build.tokenizer=some/dir"]).tokenizer
    assert own.path == "some/dir" and own.protocol_tokens


def test_weight_sync_choices_are_the_pools():
    from rollouts.pool import WEIGHT_SYNC_MODES as POOL_MODES
    from rollouts.pool.settings import WEIGHT_SYNC_MODES

    assert WEIGHT_SYNC_MODES == POOL_MODES
    with pytest.raises(ConfigError, match=r"rollout\.weight_sync: must be one of object_store, broadcast"):
        load_run_config(None, ["rollout.weight_sync=nccl"])
    with pytest.raises(ConfigError, match=r"rollout\.engine_kwargs\.worker_extension_cls"):
        load_run_config(
            None, ["rollout.weight_sync=broadcast", "rollout.engine_kwargs.worker_extension_cls=x.Y"]
        )
    assert load_run_config(None).rollout.weight_sync == "object_store"  # CPU default
    gpu = load_run_config(REPO / "configs" / "qwen3-8b-da.yaml")
    assert gpu.rollout.weight_sync == "broadcast"


def test_rollout_placement_choices_are_the_pools():
    from ray.util.placement_group import VALID_PLACEMENT_GROUP_STRATEGIES

    from rollouts.placement import PLACEMENTS
    from rollouts.pool import PoolConfig

    assert set(PLACEMENTS) == VALID_PLACEMENT_GROUP_STRATEGIES  # what Ray itself accepts
    for strategy in PLACEMENTS:  # the run config and the pool take every one of them, by the same name
        assert load_run_config(None, [f"rollout.placement={strategy}"]).rollout.placement == strategy
        assert (
            load_run_config(None, [f"cluster.trainer_placement={strategy}"]).cluster.trainer_placement
            == strategy
        )
    with pytest.raises(ConfigError, match="placement"):
        load_run_config(None, ["rollout.placement=SCATTER"])
    rollout = load_run_config(None, ["rollout.resources_per_actor={heed_rollout: 1}"]).rollout
    assert rollout.placement == "PACK" and rollout.resources_per_actor == {"heed_rollout": 1.0}
    # a CPU-less bundle is fine when a custom resource fills it; the pool takes the same shape
    cpu_less = load_run_config(None, ["rollout.num_cpus_per_actor=0", "rollout.resources_per_actor={r: 1}"])
    assert PoolConfig("m", num_cpus_per_actor=0, resources_per_actor={"r": 1}).bundle == {"r": 1.0}
    assert cpu_less.rollout.num_cpus_per_actor == 0
    multinode = load_run_config(REPO / "configs" / "qwen3-8b-da-multinode.yaml").rollout
    assert multinode.resources_per_actor == {"heed_rollout": 1.0} and multinode.placement == "PACK"


def test_data_needs_exactly_one_source(tiny_raw):
    both = tiny_raw | {"data": tiny_raw["data"] | {"path": "runs/data/tiny"}}
    with pytest.raises(ValueError, match=r"data: give exactly one of data\.path or data\.build"):
        parse_run_config(both)
    with pytest.raises(ValueError, match="neither"):
        parse_run_config(tiny_raw | {"data": {"eval_examples": 4}})
    with pytest.raises(ValueError, match="data: missing"):
        parse_run_config({k: v for k, v in tiny_raw.items() if k != "data"})


def test_context_schedule_steps_must_increase():
    stages = "[{until_step: 20, max_context_tokens: 400}, {until_step: 10, max_context_tokens: 700}]"
    with pytest.raises(ValueError, match=r"curriculum\.context_schedule\[1\]\.until_step"):
        load_run_config(None, [f"curriculum.context_schedule={stages}"])
    stages = "[{until_step: null, max_context_tokens: 400}, {until_step: 10, max_context_tokens: 700}]"
    with pytest.raises(ValueError, match=r"context_schedule\[0\]\.until_step: only the last"):
        load_run_config(None, [f"curriculum.context_schedule={stages}"])


@pytest.mark.parametrize("override", ["grpo.max_steps", "grpo.max_steps:5", "=5", "grpo..max_steps=5"])
def test_malformed_override_is_named(override):
    with pytest.raises(ConfigError, match=f"override '{override}'"):
        load_run_config(None, [override])


def test_overrides_set_values_with_yaml_types():
    config = load_run_config(
        None,
        [
            "grpo.max_steps=5",
            "grpo.learning_rate=1e-6",  # PyYAML reads this as a string; float fields accept it
            "rollout.engine_kwargs.max_model_len=4096",
            "curriculum.task_mix.niah_single=2",
            "run.thinking=true",
            "grpo.deepspeed=configs/deepspeed/zero2.json",
        ],
    )
    assert config.grpo.max_steps == 5 and type(config.grpo.max_steps) is int
    assert config.grpo.learning_rate == 1e-6
    assert config.rollout.engine_kwargs == {"dtype": "float32", "enforce_eager": True, "max_model_len": 4096}
    assert config.curriculum.task_mix == {"niah_single": 2.0}
    assert config.run.thinking is True
    assert config.grpo.deepspeed_path == str(REPO / "configs" / "deepspeed" / "zero2.json")


def test_data_path_override_replaces_the_inline_build():
    config = load_run_config(None, ["data.path=runs/data/default"])
    assert (config.data.path, config.data.build) == ("runs/data/default", None)
    assert apply_overrides({"a": {"b": 1}}, ["a.c.d=x"]) == {"a": {"b": 1, "c": {"d": "x"}}}


def test_round_trip():
    config = load_run_config(None, ["logging.wandb_api_key=k", "curriculum.task_mix.niah_multikey=0.5"])
    assert parse_run_config(config.to_dict(redact=False)) == config
    assert parse_run_config(config.to_dict()).logging.wandb_api_key is None  # redacted
    for path in RUN_CONFIGS:
        config = load_run_config(path)
        assert parse_run_config(config.to_dict()) == config


def test_secrets_are_never_saved_or_printed(tmp_path):
    config = load_run_config(None, ["logging.wandb_api_key=secret123"])
    assert config.logging.wandb_api_key == "secret123"
    assert "secret123" not in repr(config)
    out = save_run_config(config, tmp_path / "run" / "config.yaml")
    assert "secret123" not in out.read_text()
    assert load_run_config(out) == load_run_config(None)  # everything else survives


def test_grpo_section_reaches_trls_config():
    # Guards the declared mapping: every GRPOSection field is either passed to TRL (TRL_FIELDS) or read by
    # Heed itself (HEED_FIELDS), and each passed one arrives in GRPOConfig with the value set here.
    from dataclasses import fields

    values = {
        "max_steps": 7, "learning_rate": 3e-5, "warmup_steps": 2, "lr_scheduler_type": "linear",
        "weight_decay": 0.01, "max_grad_norm": 0.5, "gradient_accumulation_steps": 2, "num_generations": 3,
        "max_completion_length": 33, "temperature": 0.7, "top_p": 0.9, "beta": 0.04, "loss_type": "grpo",
        "epsilon": 0.1, "epsilon_high": 0.28, "num_iterations": 2, "scale_rewards": "batch",
        "importance_sampling_correction": False, "importance_sampling_mode": "token_mask",
        "importance_sampling_clip_max": 2.0, "logging_steps": 3, "save_steps": 4, "save_total_limit": 2,
    }  # fmt: skip
    assert set(values) == set(GRPOSection.TRL_FIELDS)
    assert {f.name for f in fields(GRPOSection)} == set(GRPOSection.TRL_FIELDS) | set(GRPOSection.HEED_FIELDS)
    default = GRPOSection()
    assert all(getattr(default, name) != value for name, value in values.items())  # each one visibly set
    config = load_run_config(None, ["run.seed=7", "run.name=mapped", "model.gradient_checkpointing=true"])
    section = GRPOSection(prompts_per_step=6, **values)
    args = section.to_grpo_config(config.run, config.model, output_dir="runs/x/checkpoints", world=1)
    for name, value in values.items():
        assert getattr(args, GRPOSection.TRL_FIELDS[name]) == value, name
    assert args.per_device_train_batch_size == 6 * 3 // 2  # prompts x generations over accumulation steps
    assert (args.seed, args.run_name, args.gradient_checkpointing) == (7, "mapped", True)
    assert (args.output_dir, args.deepspeed, args.save_strategy) == ("runs/x/checkpoints", None, "steps")
    with pytest.raises(ConfigError, match=r"grpo\.prompts_per_step: .* do not split over 4 processes"):
        section.to_grpo_config(config.run, config.model, output_dir="x", world=4)


def test_sft_section_to_sft_config():
    config = load_run_config("configs/tiny-thinking.yaml", ["run.seed=7"])
    sft = config.sft.to_sft_config(config.run, "runs/x/sft", config.grpo.deepspeed_path)
    assert isinstance(sft, SFTConfig)
    raw = yaml.safe_load(Path("configs/tiny-thinking.yaml").read_text())["sft"]  # the file, read directly
    assert (sft.max_steps, sft.per_device_batch_size, sft.learning_rate, sft.warmup_steps) == (
        raw["max_steps"],
        raw["per_device_batch_size"],
        float(raw["learning_rate"]),
        raw["warmup_steps"],
    )
    assert (sft.layout.style, sft.layout.instructions) == (config.run.layout_style, config.run.instructions)
    assert (sft.seed, sft.layout.block_size, sft.layout.thinking, sft.output_dir, sft.deepspeed) == (
        7,
        32,
        True,
        "runs/x/sft",
        None,
    )


def test_sections_check_themselves_when_built_in_code():
    with pytest.raises(ConfigError, match=r"^grpo\.num_generations: must be >= 2, got 1$"):
        GRPOSection(num_generations=1)
    assert GRPOSection(learning_rate=1).learning_rate == 1.0


@given(
    st.fixed_dictionaries(
        {},
        optional={
            "grpo.max_steps": st.integers(1, 10**6),
            "sft.max_steps": st.integers(1, 10**6),
        },
    )
)
def test_random_step_overrides_round_trip(overrides):
    default = load_run_config(TINY)
    config = load_run_config(TINY, [f"{k}={v}" for k, v in overrides.items()])
    assert config.grpo.max_steps == overrides.get("grpo.max_steps", default.grpo.max_steps)
    assert config.sft.max_steps == overrides.get("sft.max_steps", default.sft.max_steps)
    assert parse_run_config(yaml.safe_load(yaml.safe_dump(config.to_dict()))) == config


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["selective.budgets=[64, 64, 64, 64]"], r"selective\.budgets: budgets evict by Selective Attention"),
        (
            ["selective.enabled=true", "selective.budgets=[64, 64]"],
            r"selective\.budgets: has 2 budgets but the model has 4 layers",
        ),
        (
            ["selective.enabled=true", "selective.budgets=[64, 1, 64, 64]"],
            r"selective\.budgets\[1\]: must be >= 2",
        ),
        (["selective.enabled=true", "selective.memory_tau=0"], r"selective\.memory_tau"),
        (
            ["selective.enabled=true", "rollout.engine_kwargs.enable_prefix_caching=true"],
            r"rollout\.engine_kwargs\.enable_prefix_caching: a cached prompt has no query rows",
        ),
        (
            ["selective.enabled=true", "rollout.engine_kwargs.tensor_parallel_size=2"],
            r"rollout\.engine_kwargs\.tensor_parallel_size: head 0's Selective Attention mask",
        ),
        (
            ["selective.enabled=true", "rollout.engine=reference", "rollout.weight_sync=broadcast"],
            r"rollout\.weight_sync: the reference engine",
        ),
        (
            ["selective.enabled=true", "model.attn_implementation=flex_attention"],
            r"model\.attn_implementation",
        ),
        (["rollout.engine=sglang"], r"rollout\.engine: must be one of"),
        (["selective.search_budgets=true"], r"selective\.search_budgets: searches Selective Attention"),
        (["selective.search_min_step=64"], r"selective\.search_min_step: must be between 1 and search_step"),
        (["selective.grpo_budget_scale=1.5"], r"selective\.grpo_budget_scale: must be in \(0, 1\]"),
        (
            ["selective.enabled=true", "selective.grpo_budget_scale=0.5"],
            r"selective\.grpo_budget_scale: scales the run's budgets, and it has none",
        ),
        (
            ["selective.enabled=true", "selective.budgets=[64, 64, 64, 64]", "selective.search_budgets=true"],
            r"selective\.search_budgets: give budgets or search for them, not both",
        ),
        (
            ["selective.enabled=true", "selective.search_budgets=true", "selective.search_split=test"],
            r"selective\.search_split: is the eval split",
        ),
        (
            [
                "selective.enabled=true",
                "selective.search_budgets=true",
                "data.build.splits={train: 8, test: 2}",
            ],
            r"selective\.search_split: data\.build\.splits holds no 'validation' examples",
        ),
        (
            ["selective.enabled=true", "selective.search_split=dev"],
            r"selective\.search_split: must be one of",
        ),
        (["selective.enabled=true", "selective.search_step=0"], r"selective\.search_step: must be >= 1"),
        (["selective.search_after_grpo=true"], r"selective\.search_after_grpo: searches Selective Attention"),
        (
            ["selective.enabled=true", "selective.search_after_grpo=true", "grpo.enabled=false"],
            r"selective\.search_after_grpo: searches the budgets of the policy GRPO trained: set grpo\.enabled",
        ),
        (
            [
                "selective.enabled=true",
                "selective.search_after_grpo=true",
                "data.build.splits={train: 8, test: 2}",
            ],
            r"selective\.search_split: data\.build\.splits holds no 'validation' examples",
        ),
        (["selective.enabled=true", "selective.search_tolerance=-0.1"], r"selective\.search_tolerance"),
        (["selective.enabled=true", "selective.search_judge=bleu"], r"selective\.search_judge"),
        (
            ["selective.enabled=true", "selective.search_judge=accuracy", "selective.search_tolerance=5"],
            r"selective\.search_tolerance: the accuracy judge's tolerance is in accuracy points",
        ),
        (
            ["selective.enabled=true", "selective.kernel=flash"],
            r"selective\.kernel: must be one of dense, triton",
        ),
        (
            [
                "selective.enabled=true",
                "sft.max_steps=300",
                "selective.selection_from_step=250",
                "selective.selection_ramp_steps=100",
            ],
            r"selective\.selection_from_step: the selection fades in during SFT, so it must be whole by "
            r"sft\.max_steps \(300\): selection_from_step \+ selection_ramp_steps is 350",
        ),
        (["selective.enabled=true", "selective.selection_ramp_steps=-1"], r"selective\.selection_ramp_steps"),
        (
            ["selective.enabled=true", "selective.freeze_selection_in_sft=true", "sft.weight_decay=0.01"],
            r"selective\.freeze_selection_in_sft: .*weight decay \(0\.01\) .*set sft\.weight_decay to 0",
        ),
        (
            ["selective.freeze_selection_in_sft=true"],
            r"selective\.freeze_selection_in_sft: freezes Selective Attention's selection: set selective\.enabled",
        ),
        (
            ["selective.enabled=true", "selective.eviction_gradient=soft"],
            r"selective\.eviction_gradient: must be one of none, straight_through",
        ),
    ],
)
def test_selective_attention_settings_are_checked(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_run_config(None, overrides)


def test_the_fused_kernel_is_refused_without_cuda(monkeypatch, selective_attention):
    import rollouts.selective.attention as sa
    from rl.train import TrainRecipe

    config = load_run_config(REPO / "configs" / "tiny-selective.yaml", ["selective.kernel=triton"])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match=r"selective\.kernel: triton runs on CUDA only"):
        TrainRecipe(config)._select_kernel()
    assert sa.registered_kernel() == "dense"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    TrainRecipe(config)._select_kernel()
    assert sa.registered_kernel() == "triton"


def test_selective_config_runs_its_rollouts_on_vllm():
    from rollouts.pool import ENGINES
    from rollouts.pool.settings import ENGINE_CHOICES as ROLLOUT_ENGINES

    assert set(ROLLOUT_ENGINES) == {"auto", *ENGINES}
    selective = load_run_config(REPO / "configs" / "tiny-selective.yaml")
    assert selective.selective.enabled and selective.rollout_engine == "vllm"
    # it searches its budgets after SFT, to the token, trains GRPO under 0.7x them, then searches the GRPO
    # policy's own by the same judge
    searching = selective.selective
    assert searching.budgets is None and searching.search_budgets and searching.search_min_step == 1
    assert 0 < searching.grpo_budget_scale < 1 and searching.search_after_grpo
    assert searching.search_split == "validation" != selective.data.eval_split
    fixed = load_run_config(
        REPO / "configs" / "tiny-selective.yaml",
        ["selective.budgets=[8, 6, 4, 2]", "selective.search_budgets=false"],
    )
    assert len(fixed.selective.budgets) == fixed.model.tiny.num_hidden_layers
    assert load_run_config(None).rollout_engine == "vllm"


def test_the_index_config_lays_every_prompt_out_with_its_index():
    config = load_run_config("configs/tiny-index.yaml", [])
    raw = yaml.safe_load(Path("configs/tiny-index.yaml").read_text())  # the file, read directly
    layout = config.run.prompt_layout()
    assert layout.index_entry_tokens == raw["run"]["index_entry_tokens"] > 0
    assert config.sft.to_sft_config(config.run, "runs/x/sft", None).layout == layout
    assert config.data.data_config().trace_navigation == raw["data"]["build"]["trace_navigation"] == "index"
    with pytest.raises(ConfigError, match=r"run\.index_entry_tokens"):
        load_run_config("configs/tiny-index.yaml", ["run.index_entry_tokens=0"])
    with pytest.raises(ConfigError, match=r"run\.index_entry_tokens"):
        load_run_config("configs/tiny.yaml", ["run.index_entry_tokens=-1"])


def test_the_protocol_version_travels_from_the_run_section_into_every_layout_and_the_data():
    """configs/tiny.yaml (the embedded default) asks for v4 (closing tags rest in local) and mixes its trace
    strategies; `sft.bf16` turns on SFT's bf16 autocast: each reaches what SFT, rollouts and evals build from
    (the layout settings, the data config, the SFT config); a config that sets none of them keeps the
    library's defaults."""
    config = load_run_config("configs/tiny.yaml", [])
    raw = yaml.safe_load(Path("configs/tiny.yaml").read_text())  # the file, read directly
    assert config.run.prompt_layout().protocol_version == raw["run"]["protocol_version"] == 4
    assert config.sft.to_sft_config(config.run, "runs/x/sft", None).layout.protocol_version == 4
    assert config.data.data_config().trace_strategies == raw["data"]["build"]["trace_strategies"]
    assert config.sft.to_sft_config(config.run, "runs/x/sft", None).group_by_length
    assert config.sft.to_sft_config(config.run, "runs/x/sft", None).bf16 is False  # float32 SFT
    bf16 = load_run_config("configs/tiny.yaml", ["sft.bf16=true"]).sft
    assert bf16.to_sft_config(config.run, "runs/x/sft", None).bf16 is True
    default = load_run_config("configs/tiny-selective.yaml")  # sets none of these keys: v3, planning traces
    assert "protocol_version" not in yaml.safe_load(Path("configs/tiny-selective.yaml").read_text())["run"]
    assert default.run.prompt_layout().protocol_version == 3
    assert default.sft.to_sft_config(default.run, "runs/x/sft", None).bf16 is False
    assert default.data.data_config().trace_strategies == {"plan": 1.0}
    assert config.data.data_config().trace_chunk_ids == raw["data"]["build"]["trace_chunk_ids"] == "header"
    assert default.data.data_config().trace_chunk_ids == "digits"
    assert (
        load_run_config("configs/tiny.yaml", ["run.protocol_version=3"]).run.prompt_layout().protocol_version
        == 3
    )
    with pytest.raises(ConfigError, match=r"run\.protocol_version"):
        load_run_config("configs/tiny.yaml", ["run.protocol_version=6"])
    with pytest.raises(ConfigError, match=r"trace_strategies"):
        load_run_config("configs/tiny.yaml", ["data.build.trace_strategies={skim: 1.0}"])
    # under v5 a focus written first chooses blind: refused there, taken under v4
    direct = "data.build.trace_strategies={plan: 0.5, direct: 0.5}"
    with pytest.raises(ConfigError, match=r"trace_strategies\.direct.*blind"):
        load_run_config("configs/tiny.yaml", [direct, "run.protocol_version=5"])
    assert load_run_config("configs/tiny.yaml", [direct, "run.protocol_version=4"]).run.protocol_version == 4
    with pytest.raises(ConfigError, match=r"trace_chunk_ids.*one of \('digits', 'header'\)"):
        load_run_config("configs/tiny.yaml", ["data.build.trace_chunk_ids=words"])
