"""Installing never shadows another package: the wheel holds one import namespace, `batchtui`.

Built from the checkout and installed into a fresh virtual environment (not the editable install the
tests run from), where the engine's check runs without textual.
"""

import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest
from helpers.paths import REPOSITORY

ROOT = REPOSITORY
# One worker builds the wheel once: two setuptools builds at once in the same tree collide in build/.
pytestmark = pytest.mark.xdist_group("packaging")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    return next(out.glob("batchtui-*.whl"))


@pytest.mark.slow
def test_wheel_installs_only_the_batchtui_namespace(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    assert tops == {"batchtui", next(t for t in tops if t.endswith(".dist-info"))}
    assert "batchtui/core/run/engine.py" in names and "batchtui/tui/app.py" in names
    for package in ("cli", "endpoint", "run", "reports", "terminal", "invariant", "models", "numbers"):
        assert f"batchtui/core/{package}/__init__.py" in names, package  # every package of core ships
    assert "batchtui/core/data/qwen2.5-1.5b-instruct.config.json" in names and "batchtui/tui/app.tcss" in names
    assert "batchtui/core/py.typed" in names  # the engine's annotations reach a caller's type checker
    assert "batchtui/core/invariant/compiled/ordered_attention.cpp" in names  # the mode's kernel, built on first use
    entry_points = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "batchtui = batchtui.tui.launcher:main" in entry_points


@pytest.mark.slow
def test_installed_wheel_runs_the_check_without_textual(wheel, tmp_path):
    fresh = tmp_path / "fresh"
    venv.create(fresh, with_pip=False)  # this environment's pip installs into it (--python): no pip bootstrapped
    python = fresh / "bin" / "python"
    install = ["install", "-q", "--no-deps", "--no-index", str(wheel)]
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), *install], check=True)
    # torch and transformers come from the test environment's site-packages as a plain path entry: its
    # .pth files (the editable install's finder among them) are not processed, so only the wheel's
    # `batchtui` can be imported; textual is blocked outright.
    site = Path(
        subprocess.check_output([python, "-c", "import site; print(site.getsitepackages()[0])"], text=True).strip()
    )
    (site / "test-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    script = (
        "import sys, runpy; sys.modules['textual'] = None; import batchtui.core; print(batchtui.core.__file__); "
        "sys.argv = ['batchtui.core', 'check', '--batch-size', '1', 'hi']; "
        "runpy.run_module('batchtui.core', run_name='__main__')"
    )
    done = subprocess.run([python, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    where, *table = done.stdout.splitlines()
    assert where.startswith(str(site)), where  # the installed copy, not the checkout
    assert table[-1].startswith("OK: all 1 texts allclose")
    for shadowed in ("core", "tui"):
        probe = subprocess.run([python, "-c", f"import {shadowed}"], capture_output=True, cwd=tmp_path)
        assert probe.returncode != 0  # no top-level `core` or `tui` is installed


def test_a_checkout_s_root_puts_no_top_level_package_of_ours_on_the_path():
    """One importable name: from the repository's root (where `python -c` puts the folder first on sys.path) there
    is no `core` or `tui` to import by mistake, only `batchtui` (installed, or from src/)."""
    for shadowed in ("core", "tui"):
        probe = subprocess.run([sys.executable, "-c", f"import {shadowed}"], capture_output=True, cwd=ROOT, timeout=60)
        assert probe.returncode != 0, shadowed
    found = subprocess.run(
        [sys.executable, "-c", "import batchtui.core; print(batchtui.core.__file__)"],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
    )  # fmt: skip
    assert found.stdout.strip() == str(ROOT / "src" / "batchtui" / "core" / "__init__.py")
