-- Enrichment, any supported version: the tables pg_repack is repacking, by name. pg_repack
-- locks pg_try_advisory_lock(16185446, CAST(-2147483648 + oid AS integer)); %(oids)s are
-- those OIDs (of this database's locks). Reads only the catalog pg_class: no user code runs.
SELECT c.oid::bigint, c.oid::pg_catalog.regclass::text
FROM pg_catalog.pg_class AS c
WHERE c.oid = ANY(%(oids)s::pg_catalog.oid[])
