-- terminate and terminate --cancel, any supported version. One statement: the backend is
-- signalled only if it is still the session the preview showed (the same backend_start: a pid
-- can be reused by a new session) and still holds, or waits for, every lock the person decided
-- on; otherwise nothing is sent and the row says what changed. A cancel is sent only while a
-- query runs (a cancel of an idle session returns true and releases nothing). It never waits
-- for the backend to exit (the caller watches for that: a stopped backend would hold this
-- statement until statement_timeout and hide that the signal was sent). pg_locks is read once
-- (a materialized CTE of this pid's rows).
WITH target AS (
    SELECT a.backend_start, a.state
    FROM pg_catalog.pg_stat_activity AS a WHERE a.pid = %(pid)s
), now_held AS MATERIALIZED (
    SELECT l.locktype, l.database, l.relation, l.page, l.tuple, l.virtualxid,
           l.transactionid::text AS transactionid, l.classid, l.objid, l.objsubid, l.mode,
           l.granted
    FROM pg_catalog.pg_locks AS l
    WHERE l.pid = %(pid)s
), wanted AS (
    SELECT * FROM pg_catalog.jsonb_to_recordset(%(locks)s::jsonb) AS w(
        locktype text, database oid, relation oid, page integer, tuple smallint,
        virtualxid text, transactionid text, classid oid, objid oid, objsubid smallint,
        mode text, granted boolean)
), verdict AS (
    SELECT EXISTS (SELECT 1 FROM target) AS alive,
           (SELECT t.backend_start FROM target AS t) AS backend_start,
           (SELECT t.state FROM target AS t) AS state,
           (SELECT count(*) FROM wanted AS w
            WHERE NOT EXISTS (
                SELECT 1 FROM now_held AS h
                WHERE h.locktype = w.locktype
                  AND h.database IS NOT DISTINCT FROM w.database
                  AND h.relation IS NOT DISTINCT FROM w.relation
                  AND h.page IS NOT DISTINCT FROM w.page
                  AND h.tuple IS NOT DISTINCT FROM w.tuple
                  AND h.virtualxid IS NOT DISTINCT FROM w.virtualxid
                  AND h.transactionid IS NOT DISTINCT FROM w.transactionid
                  AND h.classid IS NOT DISTINCT FROM w.classid
                  AND h.objid IS NOT DISTINCT FROM w.objid
                  AND h.objsubid IS NOT DISTINCT FROM w.objsubid
                  AND h.mode = w.mode
                  AND h.granted = w.granted)) AS missing
)
SELECT v.alive, v.backend_start, v.missing, v.state,
       CASE WHEN v.alive
             AND v.backend_start IS NOT DISTINCT FROM %(backend_start)s::timestamptz
             AND v.missing = 0
             AND (NOT %(cancel)s OR v.state IS NULL
                  OR v.state NOT IN ('idle', 'idle in transaction',
                                     'idle in transaction (aborted)'))
            THEN CASE WHEN %(cancel)s THEN pg_catalog.pg_cancel_backend(%(pid)s)
                      ELSE pg_catalog.pg_terminate_backend(%(pid)s) END
       END AS signalled
FROM verdict AS v
