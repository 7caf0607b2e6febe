-- Enrichment, any supported version: pg-boss v11+ locks each queue table's maintenance with
-- pg_advisory_xact_lock(('x' || encode(sha224((current_database() || '.pgboss.' || schema
-- || table || key)::bytea), 'hex'))::bit(64)::bigint) (its plans.js advisoryLock()); the
-- tables are pgboss.queue.table_name ("job_common", or "j<sha224>" for a partitioned queue).
SELECT 'pg_boss', q.t || '/' || h.name, h.k
FROM (SELECT DISTINCT r.t FROM (SELECT table_name::text AS t FROM ONLY pgboss.queue
                                LIMIT %(row_limit)s) AS r) AS q
CROSS JOIN LATERAL (
    SELECT x.name, ('x' || pg_catalog.encode(pg_catalog.sha224(
                        (pg_catalog.current_database() || '.pgboss.pgboss' || q.t || x.name)
                        ::bytea), 'hex'))::bit(64)::bigint AS k
    FROM pg_catalog.unnest(ARRAY['failJobsByTimeout', 'deletion', 'failJobsByHeartbeat',
                                 'cleanupDependencies']) AS x(name)) AS h
WHERE h.k = ANY(%(keys)s::bigint[])
