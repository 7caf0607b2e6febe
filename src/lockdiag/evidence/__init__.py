"""The one way from a target to a diagnosis: where evidence comes from, and how it is read.

Every command that reads locks, `watch`, `sample` and the exporter go through it, in the order
data moves:

- :mod:`.target`: a :class:`Target`, one server and everything that completes its snapshots
  (--timeout, the registry, the poolers): the one Target type of lockdiag.
- :mod:`.reading`: a :class:`Reading` (a snapshot and its one diagnosis, or the error that kept
  it, whole) and :func:`diagnose`, as an :class:`Analysis` asks: the only place a Diagnosis is
  built.
- :mod:`.overlap`: the modules an answer needs once its snapshot is read (the analysis, the
  views its command names in the :class:`Analysis`), imported on a thread while the server works.
- :mod:`.reader`: a :class:`Reader`, probe -> snapshot -> diagnosis -> Reading, on the target's
  diagnostic session (:func:`~.reader.open_session`: the only place one is opened);
  :func:`read_all` for one-off reads, a fleet concurrently.
- :mod:`.source`: the :class:`Source` a command's common options name, built once (the DSNs,
  --targets, the settings file's named targets, --timeout, the poolers, or --from FILE), which
  makes the targets and reads them one-off.
- :mod:`.paced`: reads over time (`watch`, `sample`, the exporter's samplers): one loop, one
  cost accounting, one failure reset.

Above ``pg`` (the server conversations) and ``core`` (the analysis), below the commands
(``cli``) and the exporter. It may import ``lockdiag.core``, ``lockdiag.pg`` (the driver only
where a server is read: a snapshot file is read without it), the worker-facing modules
(``errors``, ``durations``, ``keys``, ``registry``) and itself; never ``views``, ``render``,
``cli``, ``exporter``, ``logs`` or ``settings``.
"""

from __future__ import annotations

from lockdiag.evidence.reader import Reader, read_all, take_snapshot
from lockdiag.evidence.reading import WHOLE, Analysis, Looking, Reading, diagnose
from lockdiag.evidence.source import Source
from lockdiag.evidence.target import Target, label

__all__ = [
    "WHOLE",
    "Analysis",
    "Looking",
    "Reader",
    "Reading",
    "Source",
    "Target",
    "diagnose",
    "label",
    "read_all",
    "take_snapshot",
]
