#!/usr/bin/env bash
# Refresh the images' locked dependency sets: bash requirements/lock.sh
# Each set is resolved in a fresh venv of the Python the images use (3.11, Linux) and frozen:
#   exporter.txt  from exporter.in: what `truegpu exporter` imports (no numpy/pandas/scikit-learn)
#   analyzer.txt  from pyproject.toml's dependencies: everything `truegpu serve` needs
#   build.txt     setuptools, to build the truegpu wheel without fetching an unpinned one
# The Dockerfiles install them with --no-deps, so nothing unlisted gets in. Commit the result;
# tests/deploy/test_images.py checks that exporter.txt installs and stays small.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3.11}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

lock() {  # lock NAME PIP-INSTALL-ARGS...
    local name=$1; shift
    "$PYTHON" -m venv "$tmp/$name"
    "$tmp/$name/bin/pip" install -q --upgrade pip
    "$tmp/$name/bin/pip" install -q "$@"
    {
        echo "# Locked by requirements/lock.sh ($("$tmp/$name/bin/python" -V), $(uname -sm)); do not edit by hand."
        "$tmp/$name/bin/pip" freeze --exclude truegpu --exclude pip --all | grep -v '^setuptools==' || true
    } > "requirements/$name.txt"
    echo "requirements/$name.txt: $(grep -vc '^#' "requirements/$name.txt") packages"
}

lock exporter -r requirements/exporter.in
lock analyzer .
"$PYTHON" -m venv "$tmp/build"
{
    echo "# Locked by requirements/lock.sh; do not edit by hand. Builds the truegpu wheel in the images."
    "$tmp/build/bin/pip" install -q --upgrade "setuptools>=68" >/dev/null
    "$tmp/build/bin/pip" freeze --all | grep '^setuptools=='
} > requirements/build.txt
echo "requirements/build.txt: $(tail -1 requirements/build.txt)"
