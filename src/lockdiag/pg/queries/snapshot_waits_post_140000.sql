-- The locks of the waits, for PostgreSQL 14 and later (pg_locks.waitstart appeared in 14):
-- all that `blockers` needs. It takes the place of the lock rows of snapshot_post_140000.sql,
-- whose session and server rows follow it unchanged (capture.py).
-- pg_locks is still read once: a MATERIALIZED CTE is one copy of the lock table, however
-- often it is referenced, so the backends chosen and their rows come from the same instant.
-- Every lock of a backend that waits or that a waiter's pg_blocking_pids() names (it holds a
-- conflicting lock or is queued ahead), and every lock of a prepared transaction (no pid): a
-- backend's locks come whole, so its analysis, findings and counts are the full read's; the
-- backends nobody waits on are not sent at all.
WITH l AS MATERIALIZED (
    SELECT l.*, CASE WHEN NOT l.granted THEN pg_catalog.pg_blocking_pids(l.pid) END AS blocked_by
    FROM pg_catalog.pg_locks AS l
    WHERE l.pid IS DISTINCT FROM pg_catalog.pg_backend_pid()
), involved AS (
    SELECT w.pid FROM l AS w WHERE NOT w.granted
    UNION
    SELECT b FROM l AS w, pg_catalog.unnest(w.blocked_by) AS b WHERE NOT w.granted
)
SELECT 'lock' AS kind, l.locktype, l.database, l.relation, l.page, l.tuple, l.virtualxid,
       l.transactionid::text AS transactionid, l.classid, l.objid, l.objsubid,
       l.virtualtransaction, l.pid, l.mode, l.granted, l.waitstart, l.blocked_by,
       -- a relation's name is only known to pg_class of its own database (or shared)
       CASE WHEN l.relation IS NOT NULL
             AND l.database IN (0, (SELECT d.oid FROM pg_catalog.pg_database AS d
                                    WHERE d.datname = pg_catalog.current_database()))
            THEN l.relation::pg_catalog.regclass::text END AS relation_name,
       NULL::json AS detail
FROM l
WHERE l.pid IS NULL OR l.pid IN (SELECT involved.pid FROM involved)
