-- pooltest, any supported version: run through the pool, where the pooled client lands: the
-- server connection's address as the server sees it (the pooler's), database and role. The
-- names (shared catalogs': in the encoding they were created from) are sent as their bytes,
-- with the database's encoding (raw_text.py decodes them).
SELECT pg_catalog.inet_client_addr()::text AS address,
       pg_catalog.encode(pg_catalog.decode(pg_catalog.quote_literal(
           pg_catalog.current_database()), 'escape'), 'hex') AS database,
       pg_catalog.encode(pg_catalog.decode(pg_catalog.quote_literal(CURRENT_USER), 'escape'),
                         'hex') AS role,
       pg_catalog.getdatabaseencoding() AS encoding
