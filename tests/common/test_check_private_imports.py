"""scripts/check_private_imports.py: a private name imported from another module of ours
fails; the standard library's, a third party's, and a public name aliased privately pass."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "check_private_imports.py"


def check(*args: Path | str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)],
                          capture_output=True, text=True, timeout=120, check=False)


def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_a_clean_tree_passes(tmp_path: Path) -> None:
    write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/owner.py": "def _helper() -> int:\n    return 1\n\n"
                        "def helper() -> int:\n    return _helper()\n\nclass Message: ...\n",
        "pkg/user.py": "import json\nimport pkg.owner\nfrom os import _exit\n"
                       "from pkg.owner import Message as _Message, helper\n"
                       "from pkg import owner\n\n"
                       "x = json._default_decoder, owner.helper(), pkg.owner.__name__\n",
    })
    passed = check(tmp_path, "pkg")
    assert passed.returncode == 0, passed.stdout
    assert passed.stdout.strip() == "private imports: OK (3 files checked)"


def test_each_private_name_from_another_module_is_named(tmp_path: Path) -> None:
    write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/owner.py": "_LIMIT = 3\n\nclass _Peer: ...\n",
        "pkg/_hidden.py": "",
        "pkg/sub/__init__.py": "",
        "pkg/sub/user.py": "from pkg.owner import _Peer\nfrom .. import owner\n"
                           "from ..owner import _LIMIT as LIMIT\n\n"
                           "x = owner._LIMIT\n",
        "other/user.py": "import pkg.owner as o\nimport pkg.owner\nimport pkg._hidden\n\n"
                         "y = o._Peer, pkg.owner._LIMIT\n",
    })
    failed = check(tmp_path, "pkg", "other")
    assert failed.returncode == 1
    assert failed.stdout.splitlines() == [
        "other/user.py:3: private name _hidden imported from pkg",
        "other/user.py:5: private name _LIMIT imported from pkg.owner",
        "other/user.py:5: private name _Peer imported from pkg.owner",
        "pkg/sub/user.py:1: private name _Peer imported from pkg.owner",
        "pkg/sub/user.py:3: private name _LIMIT imported from pkg.owner",
        "pkg/sub/user.py:5: private name _LIMIT imported from pkg.owner",
    ]


def test_a_package_that_is_not_there_is_an_error(tmp_path: Path) -> None:
    failed = check(tmp_path, "nowhere")
    assert failed.returncode == 2
    assert failed.stdout.strip() == f"no such package under {tmp_path}: nowhere"


def test_the_project_is_clean() -> None:
    result = check()
    assert result.returncode == 0, result.stdout
    assert result.stdout.startswith("private imports: OK")
