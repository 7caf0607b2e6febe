-- Enrichment, any supported version: GoodJob locks ('x' || substr(md5(key), 1, 16))::bit(64)
-- of 'good_jobs-<id>' for unfinished jobs, newest first.
SELECT 'good_job', id::text, k
FROM (SELECT id, ('x' || pg_catalog.substr(pg_catalog.md5('good_jobs-' || id::text), 1, 16))
                 ::bit(64)::bigint AS k
      FROM ONLY public.good_jobs WHERE finished_at IS NULL ORDER BY created_at DESC
      LIMIT %(row_limit)s) AS j
WHERE k = ANY(%(keys)s::bigint[])
