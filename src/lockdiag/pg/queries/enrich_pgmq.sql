-- Enrichment, any supported version: pgmq locks hashtext('pgmq.queue_' || queue_name).
(SELECT 'pgmq', queue_name::text, pg_catalog.hashtext('pgmq.queue_' || queue_name)::bigint
 FROM ONLY pgmq.meta LIMIT %(row_limit)s)
