"""What a Heed model folder says about how to prompt it: its ``heed.json`` or, for a checkpoint inside a
run directory, the run's ``config.yaml``.

``heed export`` writes ``heed.json`` from the run's settings; ``heed eval``, ``heed serve`` and ``heed
budgets`` read it back through :func:`layout_settings`, so a served request is laid out as the eval of
the same example was. The layout keys are :class:`~rollouts.protocol.LayoutSettings`' record
(``to_record`` / ``from_record``: the one serialiser), in ``heed.json`` and in the run config's ``run:``
section alike. This module sits below export, eval and serving and imports none of them.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from rollouts.protocol import LayoutError, LayoutSettings

HEED_JSON = "heed.json"
_LAYOUT_REQUIRED = ("block_size", "thinking")  # a run or an export that lacks them says nothing to trust


class SettingsError(ValueError):
    """A ``heed.json`` or run config that cannot be read, or a flag that contradicts it."""


def read_heed_json(model_dir: str | Path) -> dict | None:
    """The export's ``heed.json``; ``None`` for a model folder without one (not exported by Heed)."""
    path = Path(model_dir) / HEED_JSON
    if not path.is_file():
        return None
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        raise SettingsError(f"{path} is not valid JSON ({err})") from None
    if not isinstance(info, dict):
        raise SettingsError(f"{path} must hold a JSON object, not {type(info).__name__}")
    return info


def run_settings(run_dir: str | Path) -> dict:
    """What the run's ``config.yaml`` says its export's ``heed.json`` holds: the layout record
    (:meth:`LayoutSettings.to_record`) and ``selective_budgets`` (``None`` when the run has none)."""
    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        raise SettingsError(f"{path} does not exist: the export needs the run's block size and thinking mode")
    try:
        config = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise SettingsError(f"{path}: invalid YAML ({err})") from None
    run = config.get("run") if isinstance(config, dict) else None
    try:
        layout = LayoutSettings.from_record(
            run if isinstance(run, dict) else {}, source=str(path), prefix="run.", required=_LAYOUT_REQUIRED
        )
    except LayoutError as err:
        raise SettingsError(str(err)) from None
    selective = config.get("selective")
    budgets = selective.get("budgets") if isinstance(selective, dict) else None
    if budgets is not None and not (
        isinstance(budgets, list)
        and all(isinstance(b, int | float) and not isinstance(b, bool) for b in budgets)
    ):
        raise SettingsError(f"{path}: selective.budgets must be a list of numbers, got {budgets!r}")
    return {**layout.to_record(), "selective_budgets": budgets}


def checkpoint_settings(model_dir: str | Path) -> dict | None:
    """How prompts for a Heed model folder are laid out: its ``heed.json`` (an export) or, for a checkpoint
    inside a run directory (``RUN_DIR/sft``, ``RUN_DIR/final``, ``RUN_DIR/checkpoints/checkpoint-N``: the
    folder next to, or one below, the run's ``config.yaml`` and ``state.json``), the run's settings, which
    are what its export would write; ``None`` for any other model folder. ``settings_from`` says which."""
    info = read_heed_json(model_dir)
    if info is not None:
        return {**info, "settings_from": str(Path(model_dir) / HEED_JSON)}
    path = Path(model_dir).resolve()
    for run_dir in (path.parent, path.parent.parent):
        if (run_dir / "config.yaml").is_file() and (run_dir / "state.json").is_file():
            return {**run_settings(run_dir), "settings_from": str(run_dir / "config.yaml")}
    return None


def layout_settings(
    checkpoint: str | Path, info: dict | None, *, block_size: int | None = None, thinking: bool | None = None
) -> LayoutSettings:
    """How prompts for ``checkpoint`` are laid out, from ``info`` (its ``heed.json`` or its run's settings,
    :func:`checkpoint_settings`) or, without them, the given values and the defaults. A flag that
    contradicts ``info`` is an error: the policy was trained with what ``info`` says.

    >>> layout_settings("m", {"protocol_version": 4, "block_size": 64, "thinking": False}).block_size
    64
    >>> layout_settings("m", None, block_size=16).block_size
    16
    """
    if info is None:
        given = {"block_size": block_size, "thinking": thinking}
        record = {key: value for key, value in given.items() if value is not None}
        required, source = (), str(checkpoint)
    else:
        source = info.get("settings_from", f"{checkpoint}/{HEED_JSON}")
        for name, given in (("block_size", block_size), ("thinking", thinking)):
            if given is not None and given != info.get(name):
                raise SettingsError(f"{source} says {name}={info.get(name)!r}; drop the flag")
        record, required = info, (*_LAYOUT_REQUIRED, "protocol_version")
    try:
        return LayoutSettings.from_record(record, source=source, required=required)
    except LayoutError as err:
        raise SettingsError(str(err)) from None
