"""Importing Heed changes nothing in transformers or vLLM; the explicit registration calls do.

A fresh interpreter (this file run as a module) fingerprints what the frameworks hold -- every attribute of
every class their loaded modules define, every module's own attributes, transformers' attention and mask
registries and auto mappings, vLLM's model registry and attention-backend overrides, the import hooks --
then imports every module of the four packages and fingerprints again. Any difference fails the test: an
import-time patch (a wrapped ``PreTrainedModel`` method, a registered attention function or config, a
patched vLLM class) would run in every process, Selective Attention or not, DA plugin or not.

Then it calls the registration functions and fingerprints a third time, and the test requires that the
fingerprint sees them: ``register_selective_attention`` must change transformers (else the fingerprint
is blind and the first check proves nothing), and the vLLM DA plugin's ``register``, which vLLM calls
through its entry point, must change vLLM when vLLM imports.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("data", "rollouts", "rewards", "rl")
FRAMEWORKS = ("transformers", "vllm")
# The vLLM modules whose classes the DA plugin patches, and its registries: loaded before the fingerprint,
# so a patch applied to them at import shows as a changed attribute.
VLLM_MODULES = (
    "vllm.model_executor.models.registry",
    "vllm.v1.attention.backends.registry",
    "vllm.v1.engine.input_processor",
    "vllm.v1.worker.gpu_model_runner",
    "vllm.v1.worker.utils",
    "vllm.v1.worker.worker_base",
)


def _modules() -> list[str]:
    names = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def _framework_modules():
    for name, module in list(sys.modules.items()):
        if module is not None and name.split(".")[0] in FRAMEWORKS:
            yield name, module


def fingerprint() -> dict[str, dict[str, int]]:
    """What the frameworks hold, as ``{part: {key: id(value)}}``; ids are compared within one process."""
    classes, modules = {}, {}
    for name, module in _framework_modules():
        attributes = dict(vars(module))
        modules.update({f"{name}.{key}": id(value) for key, value in attributes.items()})
        for value in attributes.values():
            if isinstance(value, type) and value.__module__ == name:
                for key, member in vars(value).items():
                    classes[f"{name}.{value.__qualname__}.{key}"] = id(member)
    registries = {}
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface
    from transformers.models.auto import configuration_auto, modeling_auto

    for label, mapping in (("attention", AttentionInterface._global_mapping),
                           ("mask", AttentionMaskInterface._global_mapping)):  # fmt: skip
        registries.update({f"{label}.{key}": id(value) for key, value in mapping.items()})
    lazy = modeling_auto._LazyAutoMapping
    autos = {"CONFIG_MAPPING": configuration_auto.CONFIG_MAPPING}
    autos |= {key: value for key, value in vars(modeling_auto).items() if isinstance(value, lazy)}
    for label, mapping in autos.items():
        registries.update({f"auto.{label}.{key}": id(value) for key, value in mapping._extra_content.items()})
    if "vllm" in sys.modules:
        from vllm.model_executor.models.registry import ModelRegistry
        from vllm.v1.attention.backends import registry as backends

        registries.update({f"vllm.models.{key}": id(value) for key, value in ModelRegistry.models.items()})
        for label in ("_ATTN_OVERRIDES", "_MAMBA_ATTN_OVERRIDES"):
            overrides = getattr(backends, label, {})
            registries.update({f"vllm.{label}.{key}": id(value) for key, value in overrides.items()})
    hooks = {f"sys.meta_path.{i}": id(finder) for i, finder in enumerate(sys.meta_path)}
    return {"classes": classes, "modules": modules, "registries": registries, "hooks": hooks}


def changes(before: dict, after: dict) -> list[str]:
    """What ``after`` changed of ``before``. A module attribute that is new is no change (lazy modules set
    their attributes on first access, and newly imported modules are new); a new class attribute, registry
    entry or import hook is."""
    found = []
    for part, old in before.items():
        new = after[part]
        found += [f"{part}: {key} changed" for key in old if key in new and new[key] != old[key]]
        found += [f"{part}: {key} removed" for key in old if key not in new]
        if part != "modules":
            classes = {key.rsplit(".", 1)[0] for key in old} if part == "classes" else None
            for key in new.keys() - old.keys():
                if classes is None or key.rsplit(".", 1)[0] in classes:
                    found.append(f"{part}: {key} added")
    return sorted(found)


def probe() -> dict:
    """Fingerprint, import everything, fingerprint, register, fingerprint (run in a fresh interpreter)."""
    warnings.simplefilter("ignore")
    import transformers  # noqa: F401
    from transformers import PreTrainedModel  # noqa: F401  (the classes a patch would touch, loaded)
    from transformers.masking_utils import AttentionMaskInterface  # noqa: F401

    try:
        for name in VLLM_MODULES:
            importlib.import_module(name)
    except ImportError:
        pass
    before = fingerprint()
    failed = {}
    for name in _modules():
        try:
            importlib.import_module(name)
        except Exception as err:  # collect them all
            failed[name] = f"{type(err).__name__}: {err}"
    imported = fingerprint()

    from rollouts.selective.attention import register_selective_attention

    register_selective_attention()
    selective = fingerprint()
    register_selective_attention()
    again = fingerprint()
    result = {
        "failed": failed,
        "import": changes(before, imported),
        "register_selective_attention": changes(imported, selective),
        "registered_twice": changes(selective, again),
        "vllm": "vllm" in sys.modules,
    }
    if result["vllm"]:
        from rollouts.engines import vllm_plugin

        vllm_plugin.register()
        result["register_vllm_plugin"] = changes(again, fingerprint())
    return result


def _run_probe() -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "tests.test_import_side_effects"],
        capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-6000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_importing_changes_nothing_until_registration():
    result = _run_probe()
    assert not result["failed"], result["failed"]
    assert not result["import"], "importing Heed's modules changed the frameworks:\n" + "\n".join(
        result["import"]
    )
    registered = result["register_selective_attention"]
    assert "classes: transformers.modeling_utils.PreTrainedModel.get_correct_attn_implementation changed" in (
        registered
    )
    assert "registries: attention.heed_selective added" in registered
    assert "registries: mask.heed_standard added" in registered
    assert not result["registered_twice"]  # idempotent
    if result["vllm"]:
        assert result["register_vllm_plugin"], "the vLLM fingerprint does not see the DA plugin's patches"


if __name__ == "__main__":
    print(json.dumps(probe()))
