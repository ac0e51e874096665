"""docs/architecture.md's round: the client's files a round passes through, at most twelve
(issue 33), each one that exists, and every module path the document names exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ARCHITECTURE = ROOT / "docs" / "architecture.md"


def round_files() -> list[str]:
    text = ARCHITECTURE.read_text()
    section = text.split("## One round, tick to weight update", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| \d+ \| `([^`]+)` \|", section, flags=re.MULTILINE)


def test_the_round_passes_at_most_twelve_client_files_that_exist() -> None:
    files = round_files()
    assert 8 <= len(files) <= 12, files
    assert len(set(files)) == len(files), files
    missing = [f for f in files if not (ROOT / "client_image" / f).is_file()]
    assert not missing, f"docs/architecture.md names client files that do not exist: {missing}"


def test_every_module_path_named_exists() -> None:
    named = set(re.findall(r"`((?:coordinator|coordinator_tcp|psyche_common|client_image|"
                           r"psyche_solana|run_manager|local_testnet)/[\w/]+\.py)`",
                           ARCHITECTURE.read_text()))
    assert named, "the document names no module path"
    missing = sorted(p for p in named if not (ROOT / p).is_file())
    assert not missing, f"docs/architecture.md names files that do not exist: {missing}"
