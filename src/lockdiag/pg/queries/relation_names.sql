-- Any supported version: relations of the connected database by OID, named (schema-qualified:
-- the session's search_path is pg_catalog). For the tables pg_repack is repacking (its key
-- carries the table's OID) and for `log --dsn`. Reads only the catalog pg_class: no user code
-- runs.
SELECT c.oid::bigint, c.oid::pg_catalog.regclass::text
FROM pg_catalog.pg_class AS c
WHERE c.oid = ANY(%(oids)s::pg_catalog.oid[])
