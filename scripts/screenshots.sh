#!/usr/bin/env bash
# Regenerates docs/screenshots/*.png (for the README) from the browser tests, in headless Chromium.
set -euo pipefail
cd "$(dirname "$0")/.."
CHATSTREAM_DOCS_SCREENSHOTS=1 "${PYTHON:-.venv/bin/python}" -m pytest tests/browser/test_screenshots.py -q "$@"
