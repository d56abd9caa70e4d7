"""The container deployment stays in step with the code: every service the launcher runs is
in deploy/compose.yaml, run the way the launcher runs it, with a command that imports; the
image holds every package and its command is the project's `warden` script."""

from __future__ import annotations

import importlib
import importlib.util
import re
import tomllib
from pathlib import Path
from typing import Any

import yaml

from warden import launcher

ROOT = Path(__file__).resolve().parents[2]


def compose() -> dict[str, Any]:
    data = yaml.safe_load((ROOT / "deploy" / "compose.yaml").read_text())
    assert isinstance(data, dict)
    return data


def test_compose_runs_every_service_the_launcher_runs_and_the_api() -> None:
    services = compose()["services"]
    for name in (*launcher.SERVICES, "api", "postgres", "kafka", "redis"):
        assert name in services, f"deploy/compose.yaml has no {name}"


def test_compose_runs_each_process_as_the_launcher_does() -> None:
    services = compose()["services"]
    for name in launcher.PROCESSES:
        command = services[name]["command"]
        # `faststream ...` is FastStream's script for `python -m faststream ...`.
        as_module = command[1:] if command[0] == "python" else ["-m", *command]
        assert as_module == launcher.service_command(name)[1:], name


def test_every_compose_command_names_a_module_that_imports() -> None:
    for name, spec in compose()["services"].items():
        command = spec.get("command") or []
        targets = [part.split(":")[0] for part in command if re.fullmatch(r"[\w.]+:\w+", part)]
        if command[:2] == ["python", "-m"]:
            targets.append(command[2])
        for module in targets:
            assert importlib.util.find_spec(module) is not None, f"{name}: {module}"


def test_the_image_copies_every_package_the_project_installs() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = [p.rstrip("*") for p in project["tool"]["setuptools"]["packages"]["find"]["include"]]
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    for package in packages:
        assert re.search(rf"^COPY {package} \./{package}$", dockerfile, re.M), package


def test_the_image_runs_the_warden_script_of_the_project() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    command = re.search(r'^CMD \["([\w-]+)"', dockerfile, re.M)
    assert command is not None
    assert command[1] == "warden"
    module, _, function = scripts["warden"].partition(":")
    assert callable(getattr(importlib.import_module(module), function))
