"""``heed export``: turn a run directory's policy into a model folder anyone can load and serve.

A run directory holds several policies (``rl/dashboard/run_dir.py`` has the files a run writes)::

    RUN_DIR/config.yaml                      run.block_size, run.thinking, selective.budgets (optional;
                                             a checkpoint's config.json selective_budgets come first)
    RUN_DIR/sft/                             after the SFT warm start
    RUN_DIR/budget_search/                   the same policy with the KV budgets searched for it
    RUN_DIR/checkpoints/checkpoint-N/        Trainer checkpoints; complete once heed_complete.json exists
    RUN_DIR/final/                           when training ended (selective.search_after_grpo: with the
                                             budgets searched for it, and its search.json)

Which one is exported: ``checkpoints/checkpoint-N`` when a step is asked for (it must be complete), the
folder of a phase when one is (``sft``: the warm start, to compare with the GRPO policy), else
``final/``, else the newest complete checkpoint, else ``budget_search/``, else ``sft/``. Incomplete
checkpoints (a run killed while saving) are never picked.

What the export holds — a plain Hugging Face model folder, loadable with
``AutoModelForCausalLM.from_pretrained(out)`` / ``AutoTokenizer.from_pretrained(out)`` without remote code:

- the weights as safetensors, copied byte for byte with ``config.json`` and ``generation_config.json``
  (never a pickle: optimizer, scheduler and RNG states stay behind);
- the tokenizer, whose default chat template inserts the DA protocol instructions
  (:func:`rollouts.protocol.system_instructions`) as the system message when a conversation has none,
  and leaves an explicit system message alone. The source template is kept as the named template
  ``"plain"`` (``additional_chat_templates/plain.jinja``; ``apply_chat_template(..., chat_template="plain")``);
- ``heed.json``: what an engine needs to lay out DA prompts for this model (block size, thinking mode,
  layout style, whether the prompts carry the protocol instructions, the index entry size (0: no
  index), protocol version, Selective Attention budgets when trained) and where it came from.
  ``rl/policy_settings.py`` reads it back; its layout keys are ``LayoutSettings.to_record``'s.

The export is written to a temporary folder beside ``out`` and renamed into place when complete, so a
crash leaves no half export; a non-empty ``out`` is replaced only with ``overwrite``.

A Selective Attention checkpoint (``selective_attention: true`` in ``config.json``) loads with standard
attention unless :func:`rollouts.selective.attention.register_selective_attention` has run in the process
first: that is a Heed install, not remote code.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import uuid
from importlib import metadata
from pathlib import Path

from rl.policy_settings import HEED_JSON, SettingsError, run_settings
from rollouts.protocol import PROTOCOL_VERSION, system_instructions
from rollouts.selective.constants import CONFIG_KEY

logger = logging.getLogger(__name__)

COMPLETE_MARKER = "heed_complete.json"  # written last into a checkpoint: its presence means complete
PLAIN_TEMPLATE = "plain"  # the name the untouched source chat template is saved under
_MODEL_FILES = ("config.json", "generation_config.json")
_CHECKPOINT = re.compile(r"checkpoint-(\d+)")
_DA_TEMPLATE_MARK = "{#- heed: DA protocol instructions"


class ExportError(ValueError):
    """A run directory or output folder that cannot be exported; the message says what to change."""


def complete_steps(run_dir: str | Path) -> list[int]:
    """Steps of the complete checkpoints under ``run_dir/checkpoints``, ascending."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    steps = []
    for path in root.iterdir():
        match = _CHECKPOINT.fullmatch(path.name)
        if match and path.is_dir() and (path / COMPLETE_MARKER).is_file():
            steps.append(int(match.group(1)))
    return sorted(steps)


PHASE_FOLDERS = ("final", "budget_search", "sft", "copy_warmup")  # phases that leave a policy folder


def select_source(
    run_dir: str | Path, step: int | None = None, phase: str | None = None
) -> tuple[Path, int | None]:
    """The model folder to export and its training step (``None`` when the folder does not say)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ExportError(f"run directory {run_dir} does not exist")
    if phase is not None:
        if step is not None:
            raise ExportError("give a checkpoint step or a phase, not both")
        if phase not in PHASE_FOLDERS:
            raise ExportError(f"phase must be one of {', '.join(PHASE_FOLDERS)}, got {phase!r}")
        if not (run_dir / phase).is_dir():
            raise ExportError(f"{run_dir} has no {phase}/: that phase did not run (or has not finished)")
        return _require_model(run_dir / phase), _trainer_step(run_dir / phase)
    steps = complete_steps(run_dir)
    if step is not None:
        path = run_dir / "checkpoints" / f"checkpoint-{step}"
        if step not in steps:
            why = "is incomplete (no heed_complete.json)" if path.is_dir() else "does not exist"
            have = ", ".join(map(str, steps)) if steps else "none"
            raise ExportError(f"checkpoint {path} {why}; complete checkpoints: {have}")
        return _require_model(path), step
    final = run_dir / "final"
    if final.is_dir():
        return _require_model(final), _trainer_step(final)
    if steps:
        return _require_model(run_dir / "checkpoints" / f"checkpoint-{steps[-1]}"), steps[-1]
    for name in ("budget_search", "sft"):
        if (run_dir / name).is_dir():
            return _require_model(run_dir / name), _trainer_step(run_dir / name)
    raise ExportError(
        f"{run_dir} holds no policy to export: looked for final/, a complete checkpoints/checkpoint-N/ "
        f"(with {COMPLETE_MARKER}), budget_search/ and sft/"
    )


def export_checkpoint(
    run_dir: str | Path,
    out: str | Path,
    step: int | None = None,
    overwrite: bool = False,
    phase: str | None = None,
) -> Path:
    """Export the run's policy (see the module docstring for which one) to ``out``; return ``out``."""
    run_dir, out = Path(run_dir), Path(out)
    source, source_step = select_source(run_dir, step, phase)
    try:
        run = run_settings(run_dir)
    except SettingsError as err:
        raise ExportError(str(err)) from None
    # the budgets the engines evict under are the checkpoint's (heed train writes them into config.json)
    budgets = json.loads((source / "config.json").read_text()).get(CONFIG_KEY) or run["selective_budgets"]
    _check_out(out, run_dir, overwrite)

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.partial-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        _copy_weights(source, tmp)
        _save_tokenizer(source, tmp, run["thinking"], run["instructions"], run["protocol_version"])
        info = {
            **{key: value for key, value in run.items() if key != "selective_budgets"},  # the layout record
            **({"selective_budgets": budgets} if budgets else {}),
            "source": {
                "run_dir": str(run_dir.resolve()),
                "checkpoint": source.relative_to(run_dir).as_posix(),
                "step": source_step,
            },
            "heed_version": _heed_version(),
        }
        (tmp / HEED_JSON).write_text(json.dumps(info, indent=2) + "\n")
        _swap_into_place(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def da_chat_template(template: str, thinking: bool = False, version: int = PROTOCOL_VERSION) -> str:
    """``template`` behind a prefix that puts the DA instructions first when there is no system message.

    The prefix rebinds ``messages`` (a Jinja ``set`` at template level), so the source template renders
    the inserted system message exactly as it renders one written by the caller.
    """
    if template.startswith(_DA_TEMPLATE_MARK):  # already wrapped (an export of an export)
        return template
    # a valid Jinja string literal (ASCII escapes)
    instructions = json.dumps(system_instructions(thinking, version=version))
    return (
        f"{_DA_TEMPLATE_MARK} (Heed protocol v{version}): inserted as the system message "
        "when the conversation has none -#}\n"
        "{%- if not (messages and messages[0].role == 'system') -%}\n"
        f"{{%- set messages = [{{'role': 'system', 'content': {instructions}}}] + (messages | list) -%}}\n"
        "{%- endif -%}\n" + template
    )


def _require_model(path: Path) -> Path:
    weights = sorted(path.glob("*.safetensors"))
    if not (path / "config.json").is_file() or not weights:
        have = "config.json" if (path / "config.json").is_file() else "no config.json"
        raise ExportError(
            f"{path} is not a complete model folder ({have}, {len(weights)} .safetensors files); "
            "export another policy with --step N"
        )
    return path


def _trainer_step(path: Path) -> int | None:
    """``global_step`` of a ``trainer_state.json`` inside ``path``, if there is one."""
    try:
        step = json.loads((path / "trainer_state.json").read_text()).get("global_step")
    except (OSError, ValueError, AttributeError):
        return None
    return step if isinstance(step, int) else None


def _check_out(out: Path, run_dir: Path, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise ExportError(f"output {out} exists and is not a folder")
    if out.is_dir() and any(out.iterdir()):
        if not overwrite:
            raise ExportError(f"output folder {out} is not empty; pass --overwrite to replace it")
        resolved, run = out.resolve(), run_dir.resolve()
        if resolved == run or resolved in run.parents:
            raise ExportError(f"output folder {out} holds the run directory itself; export somewhere else")


def _copy_weights(source: Path, dest: Path) -> None:
    """Config, generation config, safetensors weights (and their shard index); nothing else."""
    for path in sorted(source.iterdir()):
        if path.name in _MODEL_FILES or path.name.endswith((".safetensors", ".safetensors.index.json")):
            shutil.copy2(path, dest / path.name)


def _save_tokenizer(
    source: Path, dest: Path, thinking: bool, instructions: bool = True, version: int = PROTOCOL_VERSION
) -> None:
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError) as err:
        raise ExportError(f"the tokenizer in {source} cannot be loaded ({err})") from None
    template = tokenizer.chat_template
    if not instructions:  # trained without the instructions in its prompts: serve it the same way
        tokenizer.save_pretrained(dest)
        return
    if isinstance(template, dict):  # named templates already (an export of an export): wrap the plain one
        base = template.get(PLAIN_TEMPLATE) or template.get("default")
        if base is None:
            raise ExportError(f"{source}: the tokenizer has named chat templates but no 'default' one")
        tokenizer.chat_template = {
            **template,
            "default": da_chat_template(base, thinking, version),
            PLAIN_TEMPLATE: base,
        }
    elif template:
        tokenizer.chat_template = {
            "default": da_chat_template(template, thinking, version),
            PLAIN_TEMPLATE: template,
        }
    else:
        logger.warning("%s: the tokenizer has no chat template; the export carries none", source)
    tokenizer.save_pretrained(dest)


def _swap_into_place(tmp: Path, out: Path) -> None:
    """Rename the finished export to ``out``; a previous ``out`` is removed only after that succeeded."""
    old = None
    if out.exists():
        old = out.parent / f".{out.name}.old-{uuid.uuid4().hex[:8]}"
        out.rename(old)
    try:
        tmp.rename(out)
    except BaseException:
        if old is not None:
            old.rename(out)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _heed_version() -> str:
    try:
        return metadata.version("heed-rl")
    except metadata.PackageNotFoundError:  # a bare checkout, not installed
        return "unknown"
