#!/usr/bin/env bash
# The package a newcomer installs, checked as they would use it (.ci/run runs this):
#   scripts/check_package.sh
# builds the sdist and the wheel into dist/ (python -m build), checks their metadata
# (twine check --strict), installs the wheel into a fresh virtualenv in a directory outside the
# checkout and runs `lockdiag --version`, `lockdiag demo` and `lockdiag demo --offline` from there. Needs build and twine
# (the test extra) and PostgreSQL server binaries for the demo (as root the server runs as an
# unprivileged user, as it does for the tests).
set -euo pipefail
cd "$(dirname "$0")/.."

rm -rf dist
python -m build --quiet --outdir dist .
twine check --strict dist/*
wheel=$(realpath dist/lockdiag-*-py3-none-any.whl)
version=$(python -c 'import lockdiag; print(lockdiag.__version__)')
[[ $(basename "$wheel") == "lockdiag-$version-py3-none-any.whl" ]] || {
    echo "check_package: built $(basename "$wheel"), but lockdiag.__version__ is $version" >&2
    exit 1
}

outside=$(mktemp -d)
trap 'rm -rf "$outside"' EXIT
python3 -m venv "$outside/venv"
"$outside/venv/bin/pip" install --quiet "$wheel"
cd "$outside"  # nothing of the checkout on the way: no src/, no editable install
shown=$(./venv/bin/lockdiag --version)
[[ $shown == "lockdiag, version $version" ]] || {
    echo "check_package: the installed wheel says '$shown', expected version $version" >&2
    exit 1
}
./venv/bin/lockdiag demo >demo.out
grep -q '^\$ lockdiag ' demo.out || {
    echo "check_package: the installed wheel's demo showed no diagnosis:" >&2
    cat demo.out >&2
    exit 1
}
./venv/bin/lockdiag demo --offline >offline.out
grep -q 'tenant_summary 73 (4102, 73, 2) is held by pid 4163' offline.out || {
    echo "check_package: the installed wheel's offline demo did not read its bundled incident:" >&2
    cat offline.out >&2
    exit 1
}
echo "check_package: $(basename "$wheel") and the sdist built and checked; installed outside the checkout, --version, the demo and the offline demo run"
