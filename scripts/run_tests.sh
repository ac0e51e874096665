#!/usr/bin/env bash
# Lint, type-check and test the whole project (after ./install.sh --dev --docker).
set -euo pipefail
cd "$(dirname "$0")/.."
echo "+ ruff check ."; .venv/bin/ruff check .
echo "+ lint-imports"; .venv/bin/lint-imports --no-cache
echo "+ type-ignore reasons"; .venv/bin/python scripts/check_type_ignores.py
echo "+ private imports"; .venv/bin/python scripts/check_private_imports.py
echo "+ mypy"; .venv/bin/mypy
echo "+ pytest"; .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
