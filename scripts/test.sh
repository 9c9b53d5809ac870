#!/usr/bin/env bash
# Set up (scripts/setup.sh), then lint and run the test suite. GPU tests skip where there is no GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. "${VIRTUAL_ENV:-.venv}/bin/activate"
ruff check .
python -m pytest -q "$@"
