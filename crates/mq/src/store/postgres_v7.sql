-- Migration 7: reads name each message's queue from the group's own argument when the group
-- names one (a pop or lease of a queue: every message it takes is of that queue), instead of
-- looking the name up once per message; only reads "for me" from any queue still look it up.
-- Otherwise migration 5's function (migrations are append-only).
CREATE OR REPLACE FUNCTION mq_read_batch(p_me bigint[], p_to_me boolean[], p_queue text[], p_sender bigint[],
                              p_mode integer[], p_lease_us bigint[], p_now bigint[],
                              p_count integer[])
RETURNS TABLE(grp integer, code integer, id bigint, queue text, sender_id bigint,
              receiver_id bigint, arrived_us bigint, deliveries integer, content bytea)
LANGUAGE plpgsql AS $$
DECLARE g integer; v_queue bigint; v_limit integer; v_ids bigint[];
BEGIN
    FOR g IN 1 .. coalesce(array_length(p_me, 1), 0) LOOP
        v_queue := NULL;
        IF p_queue[g] IS NOT NULL THEN
            SELECT q.id INTO v_queue FROM mq_queues q WHERE q.name = p_queue[g];
            IF v_queue IS NULL THEN
                RETURN QUERY SELECT g, 6, NULL::bigint, NULL::text, NULL::bigint, NULL::bigint,
                                    NULL::bigint, NULL::integer, NULL::bytea;
                CONTINUE;
            END IF;
        END IF;
        v_limit := CASE WHEN p_mode[g] = 1 THEN 1 ELSE p_count[g] END;
        IF p_to_me[g] THEN
            SELECT array_agg(s.id) INTO v_ids FROM (
                SELECT x.id FROM mq_messages x
                WHERE x.receiver_id = p_me[g] AND (v_queue IS NULL OR x.queue_id = v_queue)
                  AND (p_sender[g] IS NULL OR x.sender_id = p_sender[g])
                  AND x.visible_us <= p_now[g]
                ORDER BY x.receiver_id, x.id LIMIT v_limit FOR UPDATE SKIP LOCKED) s;
        ELSE
            SELECT array_agg(s.id) INTO v_ids FROM (
                SELECT x.id FROM mq_messages x
                WHERE x.queue_id = v_queue AND (x.receiver_id IS NULL OR x.receiver_id = p_me[g])
                  AND x.visible_us <= p_now[g]
                ORDER BY x.queue_id, x.id LIMIT v_limit FOR UPDATE SKIP LOCKED) s;
        END IF;
        CONTINUE WHEN v_ids IS NULL;
        IF p_mode[g] = 0 THEN
            RETURN QUERY DELETE FROM mq_messages x WHERE x.id = ANY(v_ids)
                RETURNING g, 0, x.id, coalesce(p_queue[g], (SELECT q.name FROM mq_queues q WHERE q.id = x.queue_id)),
                          x.sender_id, x.receiver_id, x.arrived_us, x.deliveries, x.content;
        ELSIF p_mode[g] = 2 THEN
            RETURN QUERY UPDATE mq_messages x
                SET visible_us = p_now[g] + p_lease_us[g], leased_by = p_me[g],
                    deliveries = x.deliveries + 1
                WHERE x.id = ANY(v_ids)
                RETURNING g, 0, x.id, coalesce(p_queue[g], (SELECT q.name FROM mq_queues q WHERE q.id = x.queue_id)),
                          x.sender_id, x.receiver_id, x.arrived_us, x.deliveries, x.content;
        ELSE
            RETURN QUERY SELECT g, 0, x.id, q.name, x.sender_id, x.receiver_id, x.arrived_us,
                                x.deliveries, x.content
                FROM mq_messages x JOIN mq_queues q ON q.id = x.queue_id WHERE x.id = ANY(v_ids);
        END IF;
    END LOOP;
END $$;
