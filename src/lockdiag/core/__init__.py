"""The pure layer: what a snapshot means, with no server and no screen.

It holds the snapshot's model and its file format, the catalogue of well-known software's keys,
the analysis (decoding, lifetimes, flags), the wait-for graph, `check`'s findings, one
diagnosis per snapshot, statistics over time and their pacing, and terminate's and pooltest's
verdicts (docs/development.md lists each module).

May import: the worker-facing modules (``lockdiag.errors``, ``durations``, ``keys``,
``registry``), ``lockdiag.plugins`` (the catalogue's plugin entries) and itself; never
``lockdiag.pg``, ``views``, ``render``, ``cli``, ``logs``, psycopg, click or rich.
"""
