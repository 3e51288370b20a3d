#!/usr/bin/env bash
# Installs Debian's gettext (msgfmt, xgettext, msgmerge), unless it is already there: `make
# messages` needs it, and so does tests/test_translations.py, which CI must run.
set -euo pipefail
if command -v msgfmt >/dev/null && command -v xgettext >/dev/null; then exit 0; fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "Installing Debian's gettext for the translations..."
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gettext >/dev/null
elif command -v sudo >/dev/null && command -v apt-get >/dev/null; then
  sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gettext
else
  echo "GNU gettext not found and cannot install it here; the translation checks will be skipped." >&2
fi
