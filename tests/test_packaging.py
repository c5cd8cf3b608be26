"""The package installs like a library: a wheel of it, outside the checkout, imports and computes,
and says clearly what it needs when a checkout's folder (data/) is missing."""

from __future__ import annotations

import ast
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
q = torch.randn(1, 2, 17, 32, device="cuda" if torch.cuda.is_available() else "cpu")  # the GPU where there is one
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


def test_the_wheel_holds_what_a_user_imports_and_nothing_of_the_site(wheel):
    """The front door, the chapters' kernels, the labs and their grader, the learners' test harness and the
    tile tables; not the site's figures, the benchmark harness, the tests or anything outside the package."""
    names = [n for n in zipfile.ZipFile(wheel).namelist() if ".dist-info/" not in n]
    for wanted in ("tutorial_kernels/__init__.py", "tutorial_kernels/attention.py", "tutorial_kernels/ch08_decode.py",
                   "tutorial_kernels/labs/grader.py", "tutorial_kernels/testing.py",
                   "tutorial_kernels/integrations/hf_attention.py", "tutorial_kernels/perf/tiles_sm90.json"):
        assert wanted in names, wanted
    assert not [n for n in names if not n.startswith("tutorial_kernels/")], names
    assert not [n for n in names if n.startswith(("tutorial_kernels/figures/", "tutorial_kernels/bench/",
                                                  "tutorial_kernels/tests/")) or n.endswith("conftest.py")]


def test_nothing_in_the_wheel_imports_what_it_leaves_out(wheel):
    """Every module the wheel ships imports (at any depth of its body) only modules the wheel ships."""
    archive = zipfile.ZipFile(wheel)
    shipped = {n[:-3].replace("/", ".").removesuffix(".__init__") for n in archive.namelist() if n.endswith(".py")}
    for name in archive.namelist():
        if not name.endswith(".py"):
            continue
        for node in ast.walk(ast.parse(archive.read(name))):
            targets = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                       [node.module] + [f"{node.module}.{a.name}" for a in node.names]
                       if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else [])
            for target in targets:
                if target.startswith("tutorial_kernels.") and target.split(".")[1] in ("figures", "bench", "tests"):
                    raise AssertionError(f"{name} imports {target}, which the wheel leaves out")
        assert name[:-3].replace("/", ".").removesuffix(".__init__") in shipped


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
