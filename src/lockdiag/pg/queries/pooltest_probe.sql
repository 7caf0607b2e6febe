-- pooltest, any supported version: run through the pool, where the pooled client lands: the
-- server connection's address as the server sees it (the pooler's), database and role.
SELECT pg_catalog.inet_client_addr()::text, pg_catalog.current_database(), CURRENT_USER
