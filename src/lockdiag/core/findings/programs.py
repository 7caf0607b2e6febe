"""Advice in a well-known program's terms, from how the snapshot shows it holding its lock
(:mod:`lockdiag.core.holding`): where its work runs, whether ending the lock's session stops
that work or only ends its exclusion, and a lock its routine left behind. ``check``'s next
step and ``terminate``'s preview say the same words (:func:`software_step`).

Each step is safe in the situation it names: a lock whose work goes on elsewhere is never to
be ended (its program's other connection is named, and ending that one is the clean stop); a
lock left behind by a routine that runs in the server may be ended, since no call runs in its
idle session; a migration whose lasting connection is gone is ended only once no process owns
the lock's connection.
"""

from __future__ import annotations

from lockdiag.core.holding import Holding
from lockdiag.core.model import Session, Snapshot
from lockdiag.core.ownership import Ownership, locate
from lockdiag.durations import format_duration


def software_step(found: Holding, snapshot: Snapshot) -> str:
    """A next step in the program's terms: never a timeout to set, nor a session to end as a
    routine step, where that would abort a deploy or a job in the middle of its work or let a
    second instance run beside it."""
    if found.software.in_server:
        return _in_server_step(found, snapshot)
    if found.sibling is not None:
        return _sibling_step(found, found.sibling, snapshot)
    if found.sibling_gone:
        return _gone_step(found)
    return _catalogue_step(found)


def program_owner(found: Holding) -> Ownership | None:
    """What the program's shape says of whether its work is over: a lock left behind (its
    call is over), or its work seen going on elsewhere; None where it says nothing more than
    the session's own state (see core.ownership)."""
    spec, sibling = found.software.sibling, found.sibling
    if spec is not None and sibling is not None:
        return Ownership(
            "unknown",
            f"{found.known.software}'s {spec.work} runs on pid {sibling.pid}",
            going_on=True,
        )
    if not found.left_behind:
        return None
    routine = found.call.call if found.call is not None else None
    if routine is not None:  # its last query is the call: corroborated
        return Ownership(
            "proven",
            f"{found.known.software}'s {routine} ran in this session, which is idle now, and "
            "releases the lock only when it succeeds: the call failed and left it behind",
        )
    return Ownership(
        "declared",
        f"{found.known.software} takes this lock for one call of a routine that runs in the "
        "server, and no call runs in this idle session: it is held outside "
        f"{found.known.software}'s design",
    )


def _catalogue_step(found: Holding) -> str:
    """The catalogue's own words: a migration or a deploy is running or died; a library's
    documented hold; else what to check (its own, or its process)."""
    known, behaviour, pid = found.known, found.software, found.pid
    # a holder at work itself is not the connection the catalogue's ending speaks of
    said = behaviour.ending and not found.works_here
    ending = f"ending its session {behaviour.ending}" if said else ""
    if behaviour.runs:  # "an Acme Deploy" (not "a Acme Deploy deploy"), "a Sqitch deploy"
        run = known.software
        if not run.lower().endswith(behaviour.kind):
            run += f" {behaviour.kind}"
        ending = ending or (
            f"ending its session mid-{behaviour.kind} can leave {known.software}'s record of "
            "applied changes out of step with the schema"
        )
        return (
            f"{_article(run)} {run} is running, or died holding its lock "
            f"({behaviour.normal}): check that {behaviour.kind} (its process, its log) before "
            f"acting; {ending}"
        )
    if behaviour.kind == "library" and not behaviour.check:  # a library with a documented hold
        step = (
            f"{known.software} {known.meaning}: {behaviour.normal}; look for the code path that "
            "takes it and never lets go"
        )
        return f"{step}; {ending}" if ending else step
    default = f"check the {known.software} process that owns pid {pid} before acting"
    step = f"{known.software} {known.meaning} is {behaviour.normal}: {behaviour.check or default}"
    return f"{step}; {ending}" if ending else step


def _article(word: str) -> str:
    """The article before ``word``, by its first letter: a name read letter by letter or
    with a "you" sound is rare among software names, and "an hour" is no software."""
    you = word.lower().startswith(("uni", "use", "one"))
    vowel = word[:1].lower() in tuple("aeiou") and not you
    return "an" if vowel else "a"


def _sibling_step(found: Holding, sibling: Session, snapshot: Snapshot) -> str:
    """The work runs on another connection of the program: let it finish; ending the lock's
    session does not stop it and lets a second instance in; ending the sibling does stop it."""
    spec, software = found.software.sibling, found.known.software
    assert spec is not None
    pid, evidence = found.pid, sibling_evidence(found, sibling, snapshot)
    return (
        f"{software}'s {spec.work} runs on pid {sibling.pid} ({evidence}), "
        f"not on pid {pid}, which only holds the lock: let the {spec.work} finish. Ending pid "
        f"{pid} {found.software.ending}. To stop the {spec.work}, end pid {sibling.pid} "
        f"instead: {spec.stop}"
    )


def sibling_evidence(found: Holding, sibling: Session, snapshot: Snapshot) -> str:
    """Why that session is the program's other connection, as seen: its name, its client, when
    it connected against the holder, what it does now."""
    spec, holder = found.software.sibling, found.entry.session
    assert spec is not None and holder is not None
    app = sibling.application_name
    if app and app == holder.application_name:
        named = f"the same application_name {app!r}"
    else:
        named = f"application_name {app!r}" if app else "no application_name"
    client = f"the same client {sibling.client_addr}" if sibling.client_addr else "the local socket"
    reference = f"pid {holder.pid}"
    if spec.since == "xact_start":
        reference += "'s transaction began"
    when = f"connected {format_duration(abs(found.gap))} {'before' if found.gap < 0 else 'after'}"
    state = sibling.state or "state hidden"
    if sibling.state_change is not None:
        since = (snapshot.server.now - sibling.state_change).total_seconds()
        state += f" for {format_duration(since)}"
    more = f"; {found.fits - 1} more session(s) fit too" if found.fits > 1 else ""
    return f"{named}, {client}, {when} {reference}; {state}{more}"


def _gone_step(found: Holding) -> str:
    """A lasting sibling looked for and not found: the run's process most likely died and the
    lock's connection outlived it. Ending it is the way out, once no process owns it."""
    spec, known, session = found.software.sibling, found.known, found.entry.session
    assert spec is not None and session is not None
    app = session.application_name
    of = f"{app!r} " if app else ""
    client = f"from {session.client_addr}" if session.client_addr else "on the local socket"
    return (
        f"no other session {of}{client} that connected with it is left, and "
        f"{known.software} keeps its {spec.work}'s connection for the whole run: the "
        f"{spec.work} is not running, and its process most likely died with this connection "
        "outliving it (a host or a network lost: the server has not noticed). Check that no "
        f"process owns it: {locate(found.entry)}; if none does, ending it is the way out: "
        f"lockdiag terminate {found.pid}"
    )


def _in_server_step(found: Holding, snapshot: Snapshot) -> str:
    """A program whose routines run in the server, in the session that calls them: a lock
    left behind on an idle session, a call that returned inside a transaction still open, or
    a call at work."""
    known, pid, session = found.known, found.pid, found.entry.session
    calls = found.calls
    every = " or ".join(c.call for c in calls) or f"{known.software}'s {known.meaning}"
    idle_calls = (
        f"every call of {every}, from any session, returns at once with a NOTICE and does nothing"
    )
    if found.left_behind:
        triple = found.entry.decoded.triple if found.entry.decoded is not None else None
        unlock = (
            f", or from its own client {triple.sql('pg_advisory_unlock')} once per failed "
            "call (locks stack)"
            if triple
            else ""
        )
        if found.call is not None:
            return (
                f"{known.software}'s {found.call.call}, this idle session's last query, "
                "failed (an error, a cancel, a statement_timeout) and left its lock behind: it "
                f"releases it only when the call succeeds. Until it goes, {idle_calls}. End the "
                f"session: lockdiag terminate {pid} (it runs nothing now; the preview lists "
                f"every lock it releases){unlock}"
            )
        return (
            f"{known.software} takes it with {every}, which release it only when the call "
            "succeeds; this session is idle, so no call runs in it, and its last query is "
            "not that call: a call failed before the session ran something else, or other "
            f"code took the key (to hold {known.software} off on purpose). Until it goes, "
            f"{idle_calls}. Ask who owns the session first: {locate(found.entry)}; "
            f"once nobody holds it on purpose: lockdiag terminate {pid}"
        )
    routine = found.call.call if found.call is not None else f"call of {every}"
    if found.in_transaction:
        assert session is not None
        return (
            f"{known.software}'s {routine} has returned, and the transaction it ran in is "
            f"still open ({session.state}): a lock taken for that transaction goes when it ends, "
            f"and until then {idle_calls}. Ask its client to commit: {locate(found.entry)}; "
            "ending the session rolls back what the call did"
        )
    return (
        f"{known.software}'s {routine} runs in this session now: a second call returns at "
        "once, so nobody waits for it; ending the session stops that call (what it committed "
        "stays, its current transaction rolls back)"
    )
