-- Enrichment, any supported version: Que locks the job id itself.
SELECT 'que', id::text, id::bigint FROM ONLY public.que_jobs WHERE id = ANY(%(keys)s::bigint[])
