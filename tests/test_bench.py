"""The main job runs end to end (one small layer, one repeat) and prints its table."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_bench_prints_a_checked_table():
    result = subprocess.run([sys.executable, "-m", "bench", "--layers", "n1c512h7w7", "--repeat", "1",
                             "--engines", "cso,im2col"],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "FMA peak" in out and "u-kernel" in out
    rows = [line for line in out.splitlines() if line.startswith("n1c512h7w7k512r3s3p1u1")]
    assert len(rows) == 1 and rows[0].split()[-2].endswith("x")
    assert "cso faster than im2col on" in out


def test_schedule_mode_reports_a_hit_rate():
    result = subprocess.run([sys.executable, "-m", "bench", "--layers", "n1c512h7w7", "--repeat", "1",
                             "--schedules"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "CSA picked the faster schedule on" in result.stdout


def test_bench_rejects_unknown_layer():
    result = subprocess.run([sys.executable, "-m", "bench", "--layers", "nope"], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode != 0 and "no convolution name contains" in result.stderr
