"""``heed serve`` sits beside training, not inside it: nothing under rl/serving imports the trainer, the
eval, the export or the dashboards, at module level or inside a function. What serving shares with them
(the layout settings of an export, prompt layout, KV accounting) lives below both."""

import ast
import subprocess
import sys
from pathlib import Path

from tests.rl.jobs import ROOT

SERVING = Path(ROOT) / "rl" / "serving"
ABOVE = ("rl.train", "rl.run_grpo", "rl.evaluate", "rl.dashboard", "rl.export", "rl.grpo", "rl.sft", "rl.cli")


def imported_modules(path: Path) -> set[str]:
    """Every module an import statement in ``path`` names, wherever the statement stands."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
    return names


def is_above(name: str) -> bool:
    return any(name == top or name.startswith(top + ".") for top in ABOVE)


def test_no_serving_file_imports_the_trainer_eval_export_or_dashboards():
    files = sorted(SERVING.glob("*.py"))
    assert len(files) >= 7  # the package was found
    found = {f.name: sorted(n for n in imported_modules(f) if is_above(n)) for f in files}
    assert found == {f.name: [] for f in files}


def test_the_scan_sees_an_import_inside_a_function(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(
        "def f():\n    from rl.evaluate import build_requests\n    import rl.dashboard.records\n"
    )
    assert sorted(n for n in imported_modules(probe) if is_above(n)) == [
        "rl.dashboard.records", "rl.evaluate", "rl.evaluate.build_requests"
    ]  # fmt: skip


def test_importing_rl_serving_loads_none_of_them():
    modules = [f"rl.serving.{f.stem}" for f in sorted(SERVING.glob("*.py")) if f.stem != "__init__"]
    code = (
        f"import importlib, sys\nfor m in {modules!r}: importlib.import_module(m)\n"
        f"print(sorted(n for n in sys.modules if n.startswith({ABOVE!r})))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "[]"
