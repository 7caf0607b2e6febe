-- Any supported version: relations of the connected database by OID, named (schema-qualified:
-- the session's search_path is pg_catalog). For the tables pg_repack is repacking (its key
-- carries the table's OID) and for `log --dsn`. Reads only the catalog pg_class: no user code
-- runs. The name is sent as its bytes (a SQL_ASCII database's may be in any encoding), with the
-- database's encoding to decode it in (raw_text.py).
SELECT c.oid::bigint AS oid,
       pg_catalog.encode(pg_catalog.decode(pg_catalog.quote_literal(
           c.oid::pg_catalog.regclass::text), 'escape'), 'hex') AS name,
       pg_catalog.getdatabaseencoding() AS encoding
FROM pg_catalog.pg_class AS c
WHERE c.oid = ANY(%(oids)s::pg_catalog.oid[])
