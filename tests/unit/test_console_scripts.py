"""The console scripts `topoweb` (user CLI) and `topoweb-agent` (node agent) that `make venv`
installs from pyproject.toml's [project.scripts]."""

import importlib
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
SCRIPTS = PYPROJECT["project"]["scripts"]


def test_scripts_point_at_the_cli_and_the_agent():
    assert SCRIPTS == {"topoweb": "apps.cli.__main__:main", "topoweb-agent": "apps.agent.__main__:main"}
    for target in SCRIPTS.values():
        module, _, name = target.partition(":")
        assert callable(getattr(importlib.import_module(module), name))


def test_package_discovery_ships_the_code_packages_only():
    setuptools = pytest.importorskip("setuptools")
    include = PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]
    found = set(setuptools.find_packages(where=str(REPO), include=include))
    assert {"apps", "apps.agent", "apps.cli", "apps.placement", "topoweb"} <= found
    assert not any(p.split(".")[0] in {"tests", "bench", "docs", "examples"} for p in found)


@pytest.mark.parametrize(("script", "usage"), [("topoweb", "usage: topoweb"), ("topoweb-agent", "--server")])
def test_installed_script_runs_help(script, usage):
    path = Path(sys.executable).parent / script
    if not path.exists():
        pytest.skip(f"{script} is not installed in this environment (make venv installs it)")
    done = subprocess.run([str(path), "--help"], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert usage in done.stdout
    assert f"usage: {script}" in done.stdout
