"""lockdiag as the tests run it: in this process through click's runner, or as a process of its
own (``python -m lockdiag``) where a hang, a signal or the real terminal matters."""

from __future__ import annotations

import signal


def ctrl_c_reaches_child() -> None:
    """preexec_fn for a child that gets Ctrl-C: a suite started in the background (cmd &)
    inherits SIGINT ignored, and Python then never raises KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
