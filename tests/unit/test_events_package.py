"""The `clusterwarden-events` package (packages/clusterwarden-events): the repository's
`schemas` package alone, with pydantic as its one dependency, installable by other teams."""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "packages" / "clusterwarden-events"
GOLDEN = ROOT / "tests" / "contracts" / "golden"
ALLOWED_IMPORTS = frozenset(sys.stdlib_module_names) | {"__future__", "pydantic",
                                                         "pydantic_core", "schemas"}

# Run inside the fresh environment: every golden message parses with the installed models,
# a newer minor's unknown field is ignored, and nothing but the package and pydantic (with
# what pydantic needs) is installed.
CONSUMER = """
import json, sys
from importlib import metadata
from pathlib import Path

import schemas
from schemas.catalog import TOPIC_MODELS
from schemas.events.v1 import EVENT_MODELS
from schemas.topics import Topic

golden = Path(sys.argv[1])
for path in sorted(golden.glob("*.json")):
    EVENT_MODELS[path.stem].model_validate_json(path.read_text())
alert = json.loads((golden / "alert.json").read_text())
alert |= {"schema_minor": TOPIC_MODELS[Topic.OPS_ALERTS].SCHEMA_MINOR + 1, "runbook": "r-1"}
assert TOPIC_MODELS[Topic.OPS_ALERTS].model_validate_json(json.dumps(alert)).kind
print(json.dumps({"module": schemas.__file__,
                  "requires": metadata.requires("clusterwarden-events"),
                  "installed": sorted(d.metadata["Name"].lower().replace("_", "-")
                                      for d in metadata.distributions())}))
"""


def schemas_modules() -> list[Path]:
    return sorted((ROOT / "schemas").rglob("*.py"))


def test_schemas_imports_nothing_but_pydantic_and_the_standard_library() -> None:
    outside = set()
    for path in schemas_modules():
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module] if isinstance(node, ast.ImportFrom) and node.module
                     and node.level == 0 else [])
            outside |= {f"{path.relative_to(ROOT)}: {name}" for name in names
                        if name.partition(".")[0] not in ALLOWED_IMPORTS}
    assert outside == set()


def test_the_package_ships_every_package_of_schemas() -> None:
    config = tomllib.loads((PACKAGE / "pyproject.toml").read_text())
    assert config["project"]["name"] == "clusterwarden-events"
    assert [d.partition(">")[0].partition("=")[0] for d in config["project"]["dependencies"]
            ] == ["pydantic"]
    packages = {".".join(init.parent.relative_to(ROOT).parts)
                for init in (ROOT / "schemas").rglob("__init__.py")}
    assert set(config["tool"]["setuptools"]["packages"]) == packages


def run(*command: str | Path, cwd: Path | None = None) -> str:
    done = subprocess.run([str(part) for part in command], cwd=cwd, capture_output=True,
                          text=True, timeout=420, check=False)
    assert done.returncode == 0, f"{command}: {done.stdout[-2_000:]}{done.stderr[-4_000:]}"
    return done.stdout


@pytest.mark.timeout(900)
def test_the_wheel_installs_alone_and_reads_every_golden_message(tmp_path: Path) -> None:
    # Built from a copy laid out as the repository is, so nothing is left in the work tree.
    source = tmp_path / "tree"
    shutil.copytree(PACKAGE, source / "packages" / PACKAGE.name)
    shutil.copytree(ROOT / "schemas", source / "schemas",
                    ignore=shutil.ignore_patterns("__pycache__"))
    dist = tmp_path / "dist"
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", dist,
        source / "packages" / PACKAGE.name)
    wheel = next(dist.glob("clusterwarden_events-*.whl"))

    env = tmp_path / "env"
    run(sys.executable, "-m", "venv", "--without-pip", env)
    python = env / "bin" / "python"
    # The pydantic this repository runs, with what it requires and nothing else.
    run(sys.executable, "-m", "pip", "--python", python, "install", "-q",
        "--only-binary=:all:", wheel, f"pydantic=={metadata.version('pydantic')}")
    report = json.loads(run(python, "-I", "-c", CONSUMER, GOLDEN, cwd=tmp_path))

    assert Path(report["module"]).is_relative_to(env)
    assert report["requires"] == ["pydantic<3,>=2.13"]
    pydantic_needs = {"pydantic", "pydantic-core", "annotated-types", "typing-extensions",
                      "typing-inspection"}
    assert set(report["installed"]) == pydantic_needs | {"clusterwarden-events"}
