"""Every file the package reads at run time ships in a (non-editable) wheel.

The CPU kernels are compiled on first use from the C++ sources next to them, so a wheel without
`kernels/cpu/*.cpp` and `*.h` silently loses them; the same goes for the embedded models.
"""
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(not (ROOT / ".git").exists(), reason="not a git checkout: no list of tracked files")
def test_package_data_covers_every_tracked_non_python_file():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["speclite"]
    package = ROOT / "speclite"
    shipped = {p for pattern in patterns for p in package.glob(pattern) if p.is_file()}
    tracked = subprocess.run(["git", "ls-files", "speclite"], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout.split()
    # Markdown next to the code is for readers of the source, not read at run time.
    data = {ROOT / name for name in tracked if not name.endswith((".py", ".md"))}
    assert data, "git lists no data files: the test would check nothing"
    assert {p.relative_to(ROOT).as_posix() for p in data - shipped} == set()
