#!/usr/bin/env bash
# Mutation testing of lockdiag's rules with mutmut 3 (configured in pyproject.toml [tool.mutmut]):
# every small change to core/ and views/ that the server-free tests fail to notice survives.
#
#   pip install -e '.[test,mutation]'
#   scripts/mutation.sh                              # every mutant of core/ and views/ (long)
#   scripts/mutation.sh 'lockdiag.core.findings.*'   # only these mutants (globs of their names)
#
# Reading the result: the last lines count the mutants killed (a test failed: good), survived
# (no test noticed: a missing test, or an equivalent mutant), timeout and suspicious. Score =
# killed / (killed + survived). `mutmut results` lists the survivors, `mutmut show NAME` shows
# one as a diff. Not part of every CI run; its working copy, mutants/, can be deleted after.
set -euo pipefail
cd "$(dirname "$0")/.."
# low priority and two workers: the machine is shared
exec nice -n 10 mutmut run --max-children "${MUTMUT_CHILDREN:-2}" "$@"
