"""The package installs like a library: a wheel of it, outside the checkout, imports and computes,
and says clearly what it needs when a checkout's folder (data/) is missing."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

USE_OUTSIDE = r"""
import os, sys
sys.path.insert(0, sys.argv[1])  # the unpacked wheel, ahead of the checkout's editable install
import torch
import tutorial_kernels
from tutorial_kernels import ch05_flash_v2, paths
assert tutorial_kernels.__file__.startswith(sys.argv[1]), tutorial_kernels.__file__
q = torch.randn(1, 2, 17, 32)
out = ch05_flash_v2.flash_attn_v2(q, q, q, True)
err = (out.double() - tutorial_kernels.reference_attention(q, q, q, True)).norm() / out.double().norm()
assert err < 1e-5, err
assert paths.repository_root() is None
try:
    paths.data_dir()
except FileNotFoundError as e:
    print("missing:", e)
os.environ["TUTORIAL_KERNELS_DATA"] = sys.argv[2]
print("data:", paths.data_dir())
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    # built from a copy of what the wheel is made of: setuptools leaves a build/ folder in the source
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "tutorial_kernels", source / "tutorial_kernels",
                    ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out),
                    str(source)], check=True, capture_output=True, text=True)
    (built,) = out.glob("*.whl")
    return built


def test_the_wheel_holds_the_package_and_nothing_of_the_site(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert "tutorial_kernels/__init__.py" in names and "tutorial_kernels/bench/__main__.py" in names
    assert "tutorial_kernels/perf/tiles_sm90.json" in names  # the tile table the tuned kernels look up
    assert not [n for n in names if n.startswith(("docs/", "data/", "notebooks/", "tools/", "experiments/"))]


def test_installed_outside_the_checkout_it_imports_and_computes(wheel, tmp_path):
    target = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(target)
    elsewhere = tmp_path / "work"
    elsewhere.mkdir()
    run = subprocess.run([sys.executable, "-c", USE_OUTSIDE, str(target), str(ROOT / "data")], cwd=elsewhere,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "missing: the measurements folder" in run.stdout and "set TUTORIAL_KERNELS_DATA" in run.stdout
    assert f"data: {ROOT / 'data'}" in run.stdout
