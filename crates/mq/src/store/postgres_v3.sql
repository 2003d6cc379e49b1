-- Migration 3: less work per sent message (sends are CPU-bound in PostgreSQL).
-- * No index on sender_id: no query looks messages up by sender alone (the "for me from
--   sender S" read goes through the receiver index and filters on sender).
-- * The receiver index only holds addressed messages: messages to anyone (receiver NULL) are
--   found through the queue index, and `receiver_id = $1` implies `receiver_id IS NOT NULL`,
--   so the planner still uses the partial index for "messages for me".
-- * mq_send_batch names the id sequence instead of looking it up once per row
--   (pg_get_serial_sequence); the body is otherwise migration 2's (migrations are append-only).
DROP INDEX mq_messages_by_sender;
DROP INDEX mq_messages_by_receiver;
CREATE INDEX mq_messages_for_receiver ON mq_messages(receiver_id, id) WHERE receiver_id IS NOT NULL;

CREATE OR REPLACE FUNCTION mq_send_batch(p_sender bigint[], p_queue text[], p_receiver bigint[],
                                         p_content bytea[], p_now bigint[])
RETURNS TABLE(ord bigint, code integer, id bigint) LANGUAGE sql AS $$
    WITH input AS (
        SELECT i.ord, i.sender, i.receiver, i.content, i.now, q.id AS queue_id,
               (i.receiver IS NULL OR EXISTS (SELECT 1 FROM mq_clients c WHERE c.id = i.receiver)) AS receiver_ok
        FROM unnest(p_sender, p_queue, p_receiver, p_content, p_now)
             WITH ORDINALITY AS i(sender, queue, receiver, content, now, ord)
        LEFT JOIN mq_queues q ON q.name = i.queue
    ), numbered AS (
        SELECT input.*, CASE WHEN queue_id IS NOT NULL AND receiver_ok
                             THEN nextval('mq_messages_id_seq'::regclass) END AS new_id
        FROM input ORDER BY ord
    ), inserted AS (
        INSERT INTO mq_messages(id, queue_id, sender_id, receiver_id, arrived_us, content)
        SELECT new_id, queue_id, sender, receiver, now, content FROM numbered WHERE new_id IS NOT NULL
    )
    SELECT ord, CASE WHEN queue_id IS NULL THEN 6 WHEN NOT receiver_ok THEN 9 ELSE 0 END, coalesce(new_id, 0)
    FROM numbered ORDER BY ord
$$;
