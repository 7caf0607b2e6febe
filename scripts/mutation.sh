#!/usr/bin/env bash
# Mutation testing of lockdiag's rules with mutmut 3 (configured in pyproject.toml [tool.mutmut]):
# every small change to core/ and views/ that the server-free tests fail to notice survives.
#
#   pip install -e '.[test,mutation]'
#   scripts/mutation.sh rules                        # the rule functions (the score in the docs)
#   scripts/mutation.sh                              # every mutant of core/ and views/ (long)
#   scripts/mutation.sh 'lockdiag.core.findings.*'   # only these mutants (globs of their names)
#
# Reading the result: the last lines count the mutants killed (a test failed: good), survived
# (no test noticed: a missing test, or an equivalent mutant), timeout and suspicious. Score =
# killed / (killed + survived). `mutmut results` lists the survivors, `mutmut show NAME` shows
# one as a diff. Not part of every CI run; its working copy, mutants/, can be deleted after.
set -euo pipefail
cd "$(dirname "$0")/.."

# The rule functions: what decides a severity, a flag, a finding, a filter, an order or a fold.
# Not the functions that only word evidence, advice or labels. Mutmut's names: module.x_function
# or module.xǁClassǁmethod, then __mutmut_N (a nested function is part of its outer one; a
# property is not mutated).
RULES=(
    # thresholds, the policy the analysis reads, the census behind the metrics
    'lockdiag.core.findings.model.xǁThresholdǁseverity__mutmut_*'
    'lockdiag.core.findings.model.xǁCheckPolicyǁanalysis_policy__mutmut_*'
    'lockdiag.core.findings.model.x_census__mutmut_*'
    # filters, flags and what a session's times prove
    'lockdiag.core.analysis.xǁFiltersǁaccept__mutmut_*'
    'lockdiag.core.analysis.x__flags__mutmut_*'
    'lockdiag.core.analysis.x__lifetime__mutmut_*'
    'lockdiag.core.analysis.x_older_than_transaction__mutmut_*'
    'lockdiag.core.analysis.x__idle_since__mutmut_*'
    'lockdiag.core.sort_key.x_rest__mutmut_*'
    'lockdiag.core.model.xǁSessionǁidle_throughout__mutmut_*'
    'lockdiag.core.model.xǁSessionǁcertainly_outside_transaction__mutmut_*'
    # the detectors of check, how they group and count, and the order of causes
    'lockdiag.core.findings.report.x_check__mutmut_*'
    'lockdiag.core.findings.report.x_by_cause__mutmut_*'
    'lockdiag.core.findings.words.x_by_backend__mutmut_*'
    'lockdiag.core.findings.words.x_locks_in__mutmut_*'
    'lockdiag.core.findings.holders.x_outlived_clients__mutmut_*'
    'lockdiag.core.findings.holders.x_session_locks__mutmut_*'
    'lockdiag.core.findings.holders.x_stuck_owners__mutmut_*'
    'lockdiag.core.findings.holders.x__advisory_holders__mutmut_*'
    'lockdiag.core.findings.waits.x_long_waits__mutmut_*'
    'lockdiag.core.findings.waits.x_crowded_roots__mutmut_*'
    'lockdiag.core.findings.waits.x_lock_queues__mutmut_*'
    'lockdiag.core.findings.names.x_unregistered_keys__mutmut_*'
    'lockdiag.core.findings.names.x__keys__mutmut_*'
    'lockdiag.core.findings.names.x_namespace_rules__mutmut_*'
    'lockdiag.core.findings.stalled.x_stalled_repacks__mutmut_*'
    'lockdiag.core.findings.stalled.x__waited_for__mutmut_*'
    # what the evidence says of the owner, and the exclusion rule
    'lockdiag.core.ownership.x_ownership__mutmut_*'
    'lockdiag.core.ownership.x_may_release__mutmut_*'
    # the wait-for graph and its ranking
    'lockdiag.core.graph.x_blockers__mutmut_*'
    'lockdiag.core.graph.x__leaders__mutmut_*'
    'lockdiag.core.graph.x__children__mutmut_*'
    'lockdiag.core.graph.xǁBlockersǁranked__mutmut_*'
    'lockdiag.core.graph.x_tree_pids__mutmut_*'
    'lockdiag.core.graph.x_behind__mutmut_*'
    'lockdiag.core.graph.x_lock_queues__mutmut_*'
    'lockdiag.core.graph.x_oldest_wait__mutmut_*'
    # what each root holds up, the first root of each session, the loops (graph's Forest
    # expands the trees in a cached_property: not mutated)
    'lockdiag.core.chains.x_components__mutmut_*'
    'lockdiag.core.chains.xǁReachǁ__init____mutmut_*'
    'lockdiag.core.chains.xǁReachǁbelow__mutmut_*'
    'lockdiag.core.chains.xǁReachǁcount__mutmut_*'
    'lockdiag.core.chains.xǁReachǁreaches__mutmut_*'
    'lockdiag.core.chains.xǁReachǁmask__mutmut_*'
    'lockdiag.core.chains.x__larger__mutmut_*'
    'lockdiag.core.chains.x_first_reached__mutmut_*'
    'lockdiag.core.chains.x_loops__mutmut_*'
    'lockdiag.core.chains.x__path__mutmut_*'
    'lockdiag.core.chains.x__walk__mutmut_*'
    # the incident's ranking
    'lockdiag.core.incident.x__headline__mutmut_*'
    'lockdiag.core.incident.x__rank__mutmut_*'
    'lockdiag.core.incident.x__ends_by_itself__mutmut_*'
    # the order of list's rows and the folds of list and sample
    'lockdiag.views.listing.x_by_urgency__mutmut_*'
    'lockdiag.views.listing.x__folds__mutmut_*'
    'lockdiag.views.listing.x__extent__mutmut_*'
    'lockdiag.views.sample.x_fold__mutmut_*'
)
if [[ "${1:-}" == rules ]]; then
    shift
    set -- "${RULES[@]}" "$@"
fi
# low priority and two workers: the machine is shared
exec nice -n 10 mutmut run --max-children "${MUTMUT_CHILDREN:-2}" "$@"
