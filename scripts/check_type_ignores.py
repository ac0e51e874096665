"""Every `# type: ignore` names its error code(s) and a reason: `# type: ignore[code]  # why`.

Usage: .venv/bin/python scripts/check_type_ignores.py [ROOT ...] (default: the project's
packages, tests, bench, dashboards, scripts). Exits 1 naming each offending line; only
comments are read, so strings that mention type: ignore do not count.
"""

from __future__ import annotations

import io
import re
import sys
import tokenize
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_ROOTS = ("coordinator", "psyche_common", "coordinator_tcp", "psyche_solana",
                 "client_image", "run_manager", "local_testnet", "tests", "bench",
                 "dashboards", "scripts")
SKIPPED = {".venv", "build", ".git", "__pycache__"}
IGNORE = re.compile(r"#\s*type:\s*ignore\b(?P<rest>.*)")
WITH_REASON = re.compile(r"\[[\w-]+(?:\s*,\s*[\w-]+)*\]\s+#\s*\S")
MESSAGE = "type: ignore needs an error code and a reason"


def python_files(root: Path) -> Iterator[Path]:
    paths = [root] if root.is_file() else sorted(root.rglob("*.py"))
    for path in paths:
        if not SKIPPED.intersection(path.relative_to(root).parts):
            yield path


def ignores(path: Path) -> Iterator[tuple[int, bool]]:
    """(line, has a code and a reason) of each type: ignore comment in `path`."""
    source = io.StringIO(path.read_text(encoding="utf-8"))
    for token in tokenize.generate_tokens(source.readline):
        match = IGNORE.search(token.string) if token.type == tokenize.COMMENT else None
        if match:
            yield token.start[0], WITH_REASON.match(match["rest"]) is not None


def main(argv: list[str]) -> int:
    roots = [Path(arg) for arg in argv] or [REPO / name for name in DEFAULT_ROOTS]
    checked, bad = 0, 0
    for root in (r for r in roots if r.exists()):
        for path in python_files(root):
            shown = path.relative_to(REPO) if path.is_relative_to(REPO) else path
            for line, ok in ignores(path):
                checked += 1
                if not ok:
                    bad += 1
                    print(f"{shown}:{line}: {MESSAGE}")
    if bad:
        return 1
    print(f"type-ignore reasons: OK ({checked} type: ignore comments checked)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
