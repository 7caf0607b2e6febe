-- Enrichment, any supported version: dramatiq-pg locks each consumed message with
-- int(sha256(queue_name || message_id).hexdigest()[24:40], 16) - 2^63 (dramatiq_pg/broker.py
-- message_lock()): hex digits 25-40 as a bigint with its top bit flipped; newest rows first.
SELECT 'dramatiq', queue_name || '/' || message_id::text, k
FROM (SELECT queue_name, message_id,
             ('x' || pg_catalog.substr(pg_catalog.encode(pg_catalog.sha256(
                 pg_catalog.convert_to(queue_name || message_id::text, 'UTF8')), 'hex'), 25, 16))
             ::bit(64)::bigint # (-9223372036854775807 - 1) AS k
      FROM ONLY dramatiq.queue ORDER BY mtime DESC LIMIT %(row_limit)s) AS m
WHERE k = ANY(%(keys)s::bigint[])
