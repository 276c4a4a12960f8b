"""The documentation: the site builds with ``mkdocs build --strict`` (its API reference generated
from the checkout's docstrings), and the README stays a short page for users whose set-up
commands are the ones that work."""
import subprocess
import sys
from pathlib import Path

from .children import CHILD_CWD

ROOT = Path(__file__).resolve().parents[1]   # the checkout: CI always runs from one
README_MAX_LINES = 250
# the two set-up commands of the README (benchmark report, tests), as they must appear
SET_UP = ('python3 -m venv .venv && . .venv/bin/activate && pip install ".[bench]" && '
          'python -m bench',
          'python3 -m venv .venv && . .venv/bin/activate && pip install ".[test]" && pytest')


def test_the_site_builds_strictly_with_its_api_reference(tmp_path):
    config = ROOT / "mkdocs.yml"
    assert config.is_file(), f"no mkdocs.yml at {ROOT}: the docs are built from the checkout"
    site = tmp_path / "site"
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f",
                             str(config), "-d", str(site)],
                            cwd=CHILD_CWD, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stderr}"
    reference = (site / "reference" / "cso" / "index.html").read_text()
    assert "Conv2d" in reference and "conv2d" in reference and "warmup" in reference
    assert "load" in (site / "reference" / "onnx" / "index.html").read_text()
    # the tuning records are included from csa/TUNING.md, not copied
    assert "Tuning records" in (site / "tuning-records" / "index.html").read_text()


def test_the_readme_is_short():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines, at most {README_MAX_LINES}: move details to docs/")


def test_the_readme_gives_the_set_up_commands():
    readme = (ROOT / "README.md").read_text()
    for command in SET_UP:
        assert command in readme, f"README.md lacks the set-up command {command!r}"
    assert 'pip install ".[test]"' in readme and "pytest" in readme
    assert "python -m bench" in readme
