"""No private name crosses a module of ours: each module keeps its `_names` to itself.

Usage: .venv/bin/python scripts/check_private_imports.py [ROOT [PACKAGE ...]]
(default: this repository, its source packages, bench and scripts). Every .py file of
the packages is parsed with `ast`; a finding is

- `from X import _name` (or `from . import _name`), or `import X._module`, or
- `X._name`, where X is bound in the file to a module by `import X` / `from P import X`,

where X is another module of the project: a file or package under ROOT, found from ROOT
or from the importing file's own directories, as pytest finds tests' helper modules.
The standard library and third parties are not ours to judge, so they are never
findings; a public name aliased privately (`from X import Message as _Message`) is fine,
and dunder names (`__version__`) are not private. One line per finding, exit 1.
Reaching a private name through a string (`getattr(m, "_x")`) is not seen.

tests/ is checked too: a test that needs a module's helper uses it by its public name.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_PACKAGES = ("coordinator", "psyche_common", "coordinator_tcp", "psyche_solana",
                    "client_image", "run_manager", "local_testnet", "bench", "scripts",
                    "tests")
SKIPPED = {".venv", "build", ".git", "__pycache__"}


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


@dataclass(frozen=True)
class Finding:
    path: Path
    line: int
    module: str
    name: str

    def describe(self, root: Path) -> str:
        shown = self.path.relative_to(root) if self.path.is_relative_to(root) else self.path
        return f"{shown}:{self.line}: private name {self.name} imported from {self.module}"


class Project:
    """Which dotted names are modules of ours, seen from a given file."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def module_file(self, dotted: str, importer: Path) -> Path | None:
        """The file (module.py or package/__init__.py) `dotted` names, or None if not ours."""
        parts = dotted.split(".")
        for base in self.search_paths(importer):
            candidate = base.joinpath(*parts)
            for path in (candidate.with_suffix(".py"), candidate / "__init__.py"):
                if path.is_file():
                    return path.resolve()
            if candidate.is_dir() and any(candidate.glob("*.py")):
                return candidate.resolve()  # a namespace package
        return None

    def search_paths(self, importer: Path) -> Iterator[Path]:
        yield self.root
        directory = importer.parent
        while directory.is_relative_to(self.root) and directory != self.root:
            yield directory
            directory = directory.parent

    def module_name(self, path: Path) -> list[str]:
        """`path`'s dotted name from ROOT, as parts (a package's __init__ is the package)."""
        parts = list(path.resolve().relative_to(self.root).with_suffix("").parts)
        return parts[:-1] if parts[-1] == "__init__" else parts


def absolute_module(node: ast.ImportFrom, path: Path, project: Project) -> str:
    """The dotted module a `from ... import` names, relative imports resolved."""
    if node.level == 0:
        return node.module or ""
    package = project.module_name(path)
    if path.name != "__init__.py":
        package = package[:-1]
    package = package[: len(package) - (node.level - 1)]
    return ".".join([*package, *([node.module] if node.module else [])])


def dotted_name(node: ast.expr) -> list[str] | None:
    """`a.b.c` as ["a", "b", "c"]; None if the expression is not a plain dotted name."""
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        base = dotted_name(node.value)
        return None if base is None else [*base, node.attr]
    return None


def findings(path: Path, project: Project) -> Iterator[Finding]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    own_file = path.resolve()
    modules: dict[str, str] = {}  # local name -> dotted module of ours it is bound to

    def ours(dotted: str) -> bool:
        found = project.module_file(dotted, path)
        return found is not None and found != own_file

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parent, _, last = alias.name.rpartition(".")
                if parent and is_private(last) and ours(parent):
                    yield Finding(path, node.lineno, parent, last)
                if project.module_file(alias.name, path) is not None:
                    local = alias.asname or alias.name.split(".")[0]
                    modules[local] = alias.name if alias.asname else local
        elif isinstance(node, ast.ImportFrom):
            source = absolute_module(node, path, project)
            for alias in node.names:
                submodule = f"{source}.{alias.name}" if source else alias.name
                if project.module_file(submodule, path) is not None:
                    modules[alias.asname or alias.name] = submodule
                if is_private(alias.name) and ours(source or submodule):
                    yield Finding(path, node.lineno, source or ".", alias.name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and is_private(node.attr):
            base = dotted_name(node.value)
            if base is None or base[0] not in modules:
                continue
            module = ".".join([modules[base[0]], *base[1:]])
            if ours(module):
                yield Finding(path, node.lineno, module, node.attr)


def python_files(root: Path, packages: list[str]) -> Iterator[Path]:
    for package in packages:
        top = root / package
        paths = [top] if top.is_file() else sorted(top.rglob("*.py"))
        for path in paths:
            if not SKIPPED.intersection(path.relative_to(root).parts):
                yield path


def main(argv: list[str]) -> int:
    root = Path(argv[0]).resolve() if argv else REPO
    packages = argv[1:] or [p for p in DEFAULT_PACKAGES if (root / p).exists()]
    missing = [p for p in packages if not (root / p).exists()]
    if missing or not packages:
        print(f"no such package under {root}: {', '.join(missing) or '(none given)'}")
        return 2
    project = Project(root)
    checked, found = 0, list[Finding]()
    for path in python_files(root, packages):
        checked += 1
        found.extend(findings(path, project))
    for finding in sorted(found, key=lambda f: (str(f.path), f.line, f.name)):
        print(finding.describe(root))
    if found:
        return 1
    print(f"private imports: OK ({checked} files checked)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
