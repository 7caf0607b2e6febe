-- The sampler's cheap probe, any supported version: the client backends and what they are
-- doing, from pg_stat_activity alone. It takes no lock-manager lock (pg_locks takes every
-- partition lock and copies the table), so it can run every interval on a server with 100k
-- locks; a full read is due only when this changes. lockdiag's own sessions are left out.
SELECT a.pid, a.backend_start, a.state, a.state_change, a.wait_event_type, a.wait_event
FROM pg_catalog.pg_stat_activity AS a
WHERE a.backend_type = 'client backend'
  AND a.pid <> pg_catalog.pg_backend_pid()
  AND a.application_name IS DISTINCT FROM %(own)s
