#!/usr/bin/env bash
# Installs Debian's chromium for the browser tests, unless a usable one is already there.
# Playwright drives it through executable_path; we never download a browser build of our own.
set -euo pipefail
for c in "${CHATSTREAM_CHROMIUM:-}" /usr/bin/chromium /usr/bin/chromium-browser; do
  if [ -n "$c" ] && [ -x "$c" ] && "$c" --version >/dev/null 2>&1; then exit 0; fi
done
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "Installing Debian's chromium for the browser tests..."
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium fonts-dejavu-core >/dev/null
elif command -v sudo >/dev/null && command -v apt-get >/dev/null; then
  sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium fonts-dejavu-core
else
  echo "chromium not found and cannot install it here; browser tests will be skipped." >&2
fi
