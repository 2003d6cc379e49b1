-- Migration 2: all sends of a batch in one set-based statement (one call, one plan execution,
-- instead of one function call per message). Ids are drawn in input order, so messages of
-- one batch keep their arrival order. Returns one row per input, in input order.
CREATE FUNCTION mq_send_batch(p_sender bigint[], p_queue text[], p_receiver bigint[], p_content bytea[],
                              p_now bigint[])
RETURNS TABLE(ord bigint, code integer, id bigint) LANGUAGE sql AS $$
    WITH input AS (
        SELECT i.ord, i.sender, i.receiver, i.content, i.now, q.id AS queue_id,
               (i.receiver IS NULL OR EXISTS (SELECT 1 FROM mq_clients c WHERE c.id = i.receiver)) AS receiver_ok
        FROM unnest(p_sender, p_queue, p_receiver, p_content, p_now)
             WITH ORDINALITY AS i(sender, queue, receiver, content, now, ord)
        LEFT JOIN mq_queues q ON q.name = i.queue
    ), numbered AS (
        SELECT input.*, CASE WHEN queue_id IS NOT NULL AND receiver_ok
                             THEN nextval(pg_get_serial_sequence('mq_messages', 'id')) END AS new_id
        FROM input ORDER BY ord
    ), inserted AS (
        INSERT INTO mq_messages(id, queue_id, sender_id, receiver_id, arrived_us, content)
        SELECT new_id, queue_id, sender, receiver, now, content FROM numbered WHERE new_id IS NOT NULL
    )
    SELECT ord, CASE WHEN queue_id IS NULL THEN 6 WHEN NOT receiver_ok THEN 9 ELSE 0 END, coalesce(new_id, 0)
    FROM numbered ORDER BY ord
$$;
