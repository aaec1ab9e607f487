import subprocess
import sys

from multihead.cli import main


def test_demo_without_model_prints_the_three_steps(capsys):
    assert main(["demo", "--no-model"]) == 0
    out = capsys.readouterr().out
    for words in ("Step 1", "Step 2", "Step 3", "(2, 8, 12, 64)", "nn.MultiheadAttention"):
        assert words in out


def test_demo_with_unknown_model_fails_cleanly(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "multihead.cli", "demo", "--model", str(tmp_path / "nope")],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "neither a known name" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_no_command_prints_help_and_fails(capsys):
    assert main([]) == 2
    assert "demo" in capsys.readouterr().out
