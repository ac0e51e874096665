"""The README and the guides under docs/ say only what runs: every link leads to a file, every
command a guide names is a real program, subcommand and option (checked against the
programs' own Typer apps, and `--help` of each exits 0), every config a guide names
validates, every script and benchmark it names exists, and the cheap commands of the run
creator's guide run as written.

What takes minutes is run elsewhere, once: the operator's walkthrough by
tests/e2e/test_operator_walkthrough.py, the env-key table by
tests/run_manager/test_rm_psyche_env.py, publishing to a registry by
tests/run_manager/test_rm_registry.py, the SparseLoCo local run by
tests/e2e/test_e2e_sparseloco.py, the default local run by tests/local_testnet/."""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
GUIDES = {name: ROOT / "docs" / f"{name}.md" for name in ("operators", "run-creators",
                                                           "contributors")}
DOCS = [README, ROOT / "docs" / "README.md", *GUIDES.values()]

# program -> the module holding its Typer app (pyproject.toml's console scripts name them)
PROGRAMS = {
    "psyche-coordinator": "coordinator_tcp.cli",
    "psyche-client": "client_image.cli",
    "psyche-train": "client_image.training.cli",
    "psyche-testnet": "local_testnet.cli",
    "run-manager": "run_manager.cli",
    "psyche-localnet": "psyche_solana.localnet",
}
PROGRAM_TOKEN = re.compile(r"^(?:\.venv/bin/)?(" + "|".join(map(re.escape, PROGRAMS)) + r")$")
# What ends a command inside a line of shell: the next one starts after it.
SHELL_SEPARATOR = re.compile(r"&&|\|\||;|\$\(|\)|\s\|\s(?!-)|>|(?<![-\w])&")


@dataclass(frozen=True)
class Command:
    """A command a document names: the program, then its words as written."""
    doc: str
    program: str
    words: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.doc}: {self.program} {' '.join(self.words)}"


def code_of(text: str) -> list[str]:
    """The shell a document shows: each line of its bash blocks (continuations joined) and
    each inline code span."""
    pieces: list[str] = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        pieces += block.replace("\\\n", " ").splitlines()
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    pieces += [span.replace("\n", " ") for span in re.findall(r"`([^`]+)`", prose)]
    return pieces


def commands_in(text: str, doc: str) -> list[Command]:
    found: list[Command] = []
    for code in code_of(text):
        if code.lstrip().startswith("#"):
            continue
        for part in SHELL_SEPARATOR.split(code.split(" # ")[0]):
            # [--tui | --no-tui], "choice|choice" and quoting are syntax, not words
            words = re.findall(r"[^\s\[\]|'\"]+", part)
            starts = [i for i, word in enumerate(words) if PROGRAM_TOKEN.match(word)]
            for n, start in enumerate(starts):
                end = starts[n + 1] if n + 1 < len(starts) else len(words)
                program = PROGRAM_TOKEN.sub(r"\1", words[start])
                found.append(Command(doc, program, tuple(words[start + 1:end])))
    return found


def resolve(command: Command) -> tuple[list[str], Any, list[str]]:
    """(subcommand path, the Click command it reaches, the options written after it).
    Typer carries its own Click, so its commands are looked at by attribute."""
    app = importlib.import_module(PROGRAMS[command.program]).app
    current: Any = typer.main.get_command(app)
    path: list[str] = []
    words = list(command.words)
    while words and words[0] in getattr(current, "commands", {}):
        path.append(words.pop(0))
        current = current.commands[path[-1]]
    options = [word.split("=")[0] for word in words
               if re.fullmatch(r"--?[a-z][a-z0-9-]*(=.*)?", word)]
    return path, current, options


def all_commands() -> list[Command]:
    return [c for doc in DOCS for c in commands_in(doc.read_text(),
                                                   str(doc.relative_to(ROOT)))]


def test_the_readme_keeps_its_two_commands_and_points_to_the_guides() -> None:
    readme = README.read_text()
    lines = readme.splitlines()
    # .ci/run greps the README for its test command and runs it.
    assert "./install.sh --dev --docker && scripts/run_tests.sh" in lines
    assert [line for line in lines if line.startswith("./install.sh --dev")] == [
        "./install.sh --dev --docker && scripts/run_tests.sh"]
    assert ("./install.sh && .venv/bin/psyche-testnet --num-clients 3 "
            "--config-path config/local-testnet --no-tui") in lines
    for guide in GUIDES.values():
        assert f"(docs/{guide.name})" in readme, guide.name
    assert len(lines) < 100, "the README is the front page: details go to docs/"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_leads_to_a_file(doc: Path) -> None:
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", doc.read_text())
    local = [link for link in links if "://" not in link]
    assert local, f"{doc.name} links to nothing: the check would prove nothing"
    missing = [link for link in local if not (doc.parent / link).exists()]
    assert not missing, f"{doc.name} links to missing files: {missing}"


def test_the_guides_are_indexed() -> None:
    index = (ROOT / "docs" / "README.md").read_text()
    for guide in GUIDES.values():
        assert f"]({guide.name})" in index, guide.name


def test_the_commands_are_found() -> None:
    """The parser sees what it should, or the checks below would pass on nothing."""
    named = {(c.program, *resolve(c)[0]) for c in all_commands()}
    for expected in [("run-manager",), ("run-manager", "wallet", "new"),
                     ("run-manager", "create-run"), ("psyche-client", "train"),
                     ("psyche-client", "predownload"), ("psyche-coordinator", "run"),
                     ("psyche-coordinator", "validate-config"), ("psyche-testnet",),
                     ("psyche-train",), ("psyche-localnet",)]:
        assert expected in named, expected
    sample = "`psyche-client train --run-id A [--tui | --no-tui]` and `x && run-manager -h`"
    assert [(c.program, c.words) for c in commands_in(sample, "sample")] == [
        ("psyche-client", ("train", "--run-id", "A", "--tui", "--no-tui")),
        ("run-manager", ("-h",))]


def test_every_option_a_document_names_exists() -> None:
    unknown: list[str] = []
    for command in all_commands():
        _, target, options = resolve(command)
        known = {"-h", "--help"} | {opt for param in target.params
                                    for opt in (*param.opts, *param.secondary_opts)}
        unknown += [f"{command}: {option}" for option in options if option not in known]
        rest = command.words[len(resolve(command)[0]):]
        if getattr(target, "commands", None) and rest and not rest[0].startswith("-"):
            unknown.append(f"{command}: no subcommand {rest[0]!r}")
    assert not unknown, "\n".join(unknown)


def test_every_named_subcommand_answers_help() -> None:
    paths = {(c.program, tuple(resolve(c)[0])) for c in all_commands()}
    for program, path in sorted(paths):
        app = importlib.import_module(PROGRAMS[program]).app
        result = CliRunner().invoke(app, [*path, "--help"], prog_name=program)
        assert result.exit_code == 0, (program, path, result.output)
        assert "Usage:" in result.output


def test_the_programs_are_the_console_scripts() -> None:
    scripts = re.search(r"\[project\.scripts\]\n(.*?)\n\n", (ROOT / "pyproject.toml").read_text(),
                        re.S)
    assert scripts is not None
    declared = dict(re.findall(r'^(\S+) = "([\w.]+):main"$', scripts.group(1), re.M))
    assert set(declared) == set(PROGRAMS)
    for program, module in declared.items():
        assert PROGRAMS[program].startswith(module), program
        assert (Path(sys.executable).parent / program).exists(), f"{program} is not installed"


def test_every_config_a_guide_names_validates() -> None:
    named = sorted({match for doc in DOCS
                    for match in re.findall(r"config/([\w-]+)", doc.read_text())
                    if (ROOT / "config" / match / "state.toml").exists()})
    assert {"local-testnet", "local-testnet-sparseloco", "operator-walkthrough"} <= set(named)
    app = importlib.import_module(PROGRAMS["psyche-coordinator"]).app
    for name in named:
        folder = ROOT / "config" / name
        # a data.toml the guides name is checked too (llama2-20m-dev's wants its data here)
        data = (["--data-config", str(folder / "data.toml")]
                if any(f"config/{name}/data.toml" in doc.read_text() for doc in DOCS) else [])
        result = CliRunner().invoke(app, ["validate-config", "--state",
                                          str(folder / "state.toml"), *data])
        # "OK", then what the config's optimizer does (SparseLoCo explains its settings)
        assert (result.exit_code, result.output.splitlines()[0]) == (0, "OK"), \
            (name, result.output)


TOP_FOLDERS = ("bench", "scripts", "tests", "config", "assets", "docs", "dashboards",
               "coordinator", "psyche_common", "coordinator_tcp", "psyche_solana",
               "client_image", "run_manager", "local_testnet")
PLACEHOLDER = re.compile(r"(^|/)[A-Z]+(\.\w+)?$")  # docs/FILE.md, bench/NAME


def test_every_path_a_guide_names_exists() -> None:
    pattern = re.compile(r"(?<![\w/.])((?:" + "|".join(TOP_FOLDERS) + r")/[\w./-]*\w)")
    named = [(doc, path) for doc in DOCS for path in pattern.findall(doc.read_text())]
    assert len(named) > 30, "too few paths found: the check would prove little"
    missing = [f"{doc.name}: {path}" for doc, path in named
               if not (ROOT / path).exists() and not PLACEHOLDER.search(path)]
    assert not missing, "\n".join(missing)


def test_the_scripts_a_guide_names_answer_help() -> None:
    publish = subprocess.run(["bash", str(ROOT / "scripts" / "publish_client_image.sh"),
                              "--help"], capture_output=True, text=True, timeout=30,
                             check=False, cwd=ROOT)
    assert publish.returncode == 0 and "REGISTRY" in publish.stdout, publish.stderr
    no_registry = subprocess.run(["bash", str(ROOT / "scripts" / "publish_client_image.sh")],
                                 capture_output=True, text=True, timeout=30, check=False,
                                 cwd=ROOT)
    assert no_registry.returncode == 2 and no_registry.stderr.startswith("usage:")


def test_the_run_creators_validate_config_command_runs_as_written() -> None:
    guide = GUIDES["run-creators"].read_text()
    line = next(line for line in code_of(guide) if "validate-config" in line
                and line.startswith(".venv/bin/"))
    result = subprocess.run(["bash", "-c", line], capture_output=True, text=True, timeout=120,
                            check=False, cwd=ROOT)
    assert (result.returncode, result.stdout.splitlines()[:1]) == (0, ["OK"]), result.stderr


def test_every_benchmark_is_a_module_run_from_the_root() -> None:
    """Each benchmark the guide names exists and imports what it shares with the others as
    `bench.NAME`: run as `python -m bench.NAME` from the root, a bare `import NAME` of a
    sibling would fail. (Running them is their smoke tests' work: tests/coordinator,
    tests/training/test_distro_bench_smoke.py, tests/p2p, tests/bench, ...)"""
    guide = GUIDES["contributors"].read_text()
    named = sorted(set(re.findall(r"bench/(\w+)\.py", guide)))
    assert len(named) >= 15, named
    assert (ROOT / "bench" / "__init__.py").exists()
    assert "python -m bench.NAME" in guide
    siblings = {path.stem for path in (ROOT / "bench").glob("*.py")}
    for name in named:
        tree = ast.parse((ROOT / "bench" / f"{name}.py").read_text())
        assert any(isinstance(node, ast.If) and "__main__" in ast.unparse(node.test)
                   for node in tree.body), f"bench/{name}.py runs nothing as __main__"
        for node in ast.walk(tree):
            modules = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                       else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for module in modules:
                top, _, rest = module.partition(".")
                assert top not in siblings, f"bench/{name}.py imports {module}: bench.{module}"
                if top == "bench" and rest:
                    assert (ROOT / "bench" / f"{rest}.py").exists(), (name, module)


def test_no_benchmark_edits_the_import_path() -> None:
    """Run as modules from the root, benchmarks need no sys.path edits (one used to let
    bench/coordinator.py shadow the coordinator package)."""
    editing = [f"{path.name}:{number}" for path in sorted((ROOT / "bench").glob("*.py"))
               for number, line in enumerate(path.read_text().splitlines(), 1)
               if re.match(r"\s*sys\.path\b", line)]
    assert not editing, editing
    assert not (ROOT / "bench" / "coordinator.py").exists()
