"""scripts/check_type_ignores.py: a type: ignore without an error code and a reason fails."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "check_type_ignores.py"


def check(*roots: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, roots)],
                          capture_output=True, text=True, timeout=60, check=False)


def test_only_ignores_with_a_code_and_a_reason_pass(tmp_path: Path) -> None:
    good = tmp_path / "good.py"
    good.write_text("x: int = f()  # type: ignore[no-any-return]  # f is untyped\n"
                    "s = '# type: ignore in a string is no comment'\n")
    bad = tmp_path / "bad.py"
    bad.write_text("a = 1\nb: int = f()  # type: ignore[assignment]\nc = g()  # type: ignore\n")

    passed = check(good)
    assert passed.returncode == 0, passed.stdout
    assert "OK (1 type: ignore comments checked)" in passed.stdout

    failed = check(tmp_path)
    assert failed.returncode == 1
    assert failed.stdout.splitlines() == [
        f"{bad}:2: type: ignore needs an error code and a reason",
        f"{bad}:3: type: ignore needs an error code and a reason",
    ]
