"""The `heed` command line."""

import shutil
import subprocess
import sys

import pytest

from rl.cli import main
from rl.demo import run_demo


def test_protocol_demo_reports_a_real_saving():
    result = run_demo(num_chunks=6, chunk_words=80, block_size=32, seed=3)
    assert result["answer"] == "8 years" and result["violations"] == []
    # focus on 1 of 6 chunks and local steps must read strictly less than causal attention
    assert 0 < result["kv_da"] < result["kv_vanilla"]
    assert result["saving"] == pytest.approx(1 - result["kv_da"] / result["kv_vanilla"])


def test_thinking_demo_parses_cleanly():
    result = run_demo(num_chunks=3, chunk_words=40, thinking=True)
    assert result["violations"] == [] and result["answer"] == "8 years"


def test_console_script(capsys):
    heed = shutil.which("heed") or str(__import__("pathlib").Path(sys.executable).parent / "heed")
    out = subprocess.run(
        [heed, "protocol", "demo", "--chunks", "3", "--chunk-words", "40"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "saving" in out.stdout and "8 years" in out.stdout


def test_bad_arguments_exit_with_usage(capsys):
    assert main(["protocol", "demo", "--chunks", "1"]) == 2
    assert "--chunks must be at least 2" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["nonsense"])


def test_heed_budgets_names_an_unknown_judge_before_loading_anything(tmp_path, capsys):
    assert main(["budgets", str(tmp_path / "nothing"), "--data", str(tmp_path), "--judge", "bleu"]) == 2
    assert "unknown budget judge 'bleu'; choose one of loss, accuracy" in capsys.readouterr().err
