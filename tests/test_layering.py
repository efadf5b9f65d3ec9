"""The package arrows go one way (README, Layout): each package imports only the
packages below it, so the harness never imports the SGLang plugin and reports never
import the testbed. Read from the source (every import, also inside functions)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROJECT = {
    "protocol",
    "capacity",
    "engine_patches",
    "topologies",
    "workloads",
    "reports",
    "testbed",
}
ALLOWED = {
    "protocol": set(),
    "capacity": {"protocol"},
    "engine_patches": {"protocol", "capacity"},
    "topologies": set(),
    "workloads": {"protocol"},
    "reports": {"protocol", "capacity", "workloads"},
    "testbed": {"protocol", "capacity", "topologies", "workloads", "reports"},
}


def imported_packages(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names & PROJECT


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_package_imports_only_what_lies_below_it(package):
    wrong = {
        str(path.relative_to(ROOT)): sorted(imported - ALLOWED[package] - {package})
        for path in sorted((ROOT / package).rglob("*.py"))
        if (imported := imported_packages(path)) - ALLOWED[package] - {package}
    }
    assert not wrong, f"{package} imports upwards: {wrong}"
