-- Enrichment, any supported version: hashtext() of names listed in the registry ([known]
-- hashtext, pgmq queues) and of pg_partman's constant lock names. hashtext is PostgreSQL's own
-- function, so it is computed here rather than reimplemented.
SELECT 'hashtext' AS source, s AS name, pg_catalog.hashtext(s)::bigint AS key
FROM pg_catalog.unnest(%(strings)s::text[]) AS s
