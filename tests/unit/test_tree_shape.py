"""The tree keeps its shape: no product module over 600 lines, no function over 80, and the
import directions the architecture promises (the executor knows neither the scheduler nor the
analyzer; the agent runs without the services)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("agent", "bench", "common", "schemas", "services", "warden")
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80
# Forbidden imports: a package -> the packages it must not import.
FORBIDDEN = {
    "services/executor": ("services.scheduler", "services.analyzer"),
    "agent": ("services",),
    "common": ("services", "agent", "warden"),
    "schemas": ("common", "services", "agent", "warden"),
}


def modules(*roots: str) -> Iterator[Path]:
    for root in roots:
        yield from sorted((ROOT / root).rglob("*.py"))


def imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_no_product_module_is_over_600_lines() -> None:
    sizes = {str(p.relative_to(ROOT)): p.read_text().count("\n") for p in modules(*PRODUCT)}
    assert {name: n for name, n in sizes.items() if n > MAX_MODULE_LINES} == {}


def test_no_function_is_over_80_lines() -> None:
    long: dict[str, int] = {}
    for path in modules(*PRODUCT):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long[f"{path.relative_to(ROOT)}::{node.name}"] = lines
    assert long == {}


def test_packages_import_only_in_the_directions_the_architecture_allows() -> None:
    crossings = [
        f"{path.relative_to(ROOT)} imports {name}"
        for package, banned in FORBIDDEN.items() for path in modules(package)
        for name in imported(path) if name.startswith(banned)
    ]
    assert crossings == []
