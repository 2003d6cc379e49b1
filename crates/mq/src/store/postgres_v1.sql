-- Migration 1: tables, indexes and the operations as functions.
-- Result codes (column `code`): 0 ok, 6 unknown queue, 7 queue exists, 8 queue not empty,
-- 9 unknown receiver, 10 no message, 11 not lease holder (same numbers as the protocol reasons).

CREATE TABLE mq_clients (id bigserial PRIMARY KEY, name text NOT NULL UNIQUE);
CREATE TABLE mq_queues (id bigserial PRIMARY KEY, name text NOT NULL UNIQUE);
CREATE TABLE mq_messages (
    id bigserial PRIMARY KEY,
    queue_id bigint NOT NULL REFERENCES mq_queues(id),
    sender_id bigint NOT NULL,
    receiver_id bigint,
    arrived_us bigint NOT NULL,
    visible_us bigint NOT NULL DEFAULT 0,
    leased_by bigint,
    deliveries integer NOT NULL DEFAULT 0,
    content bytea NOT NULL
);
CREATE INDEX mq_messages_by_queue ON mq_messages(queue_id, id);
CREATE INDEX mq_messages_by_receiver ON mq_messages(receiver_id, id);
CREATE INDEX mq_messages_by_sender ON mq_messages(sender_id, id);

CREATE FUNCTION mq_register(p_name text) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE v_id bigint;
BEGIN
    INSERT INTO mq_clients(name) VALUES (p_name) ON CONFLICT (name) DO NOTHING RETURNING id INTO v_id;
    IF v_id IS NULL THEN
        SELECT id INTO v_id FROM mq_clients WHERE name = p_name;
    END IF;
    RETURN v_id;
END $$;

CREATE FUNCTION mq_create_queue(p_name text, OUT code integer, OUT id bigint) LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO mq_queues(name) VALUES (p_name) ON CONFLICT (name) DO NOTHING RETURNING mq_queues.id INTO id;
    code := CASE WHEN id IS NULL THEN 7 ELSE 0 END;
END $$;

-- Locks the queue row first: a concurrent send's foreign-key check (KEY SHARE) then waits, so
-- "empty" cannot change between the check and the delete.
CREATE FUNCTION mq_delete_queue(p_name text, p_purge boolean, OUT code integer, OUT n bigint)
LANGUAGE plpgsql AS $$
DECLARE v_queue bigint;
BEGIN
    SELECT q.id INTO v_queue FROM mq_queues q WHERE q.name = p_name FOR UPDATE;
    IF v_queue IS NULL THEN code := 6; n := 0; RETURN; END IF;
    SELECT count(*) INTO n FROM mq_messages WHERE queue_id = v_queue;
    IF n > 0 AND NOT p_purge THEN code := 8; RETURN; END IF;
    DELETE FROM mq_messages WHERE queue_id = v_queue;
    DELETE FROM mq_queues WHERE mq_queues.id = v_queue;
    code := 0;
END $$;

CREATE FUNCTION mq_send(p_sender bigint, p_queue text, p_receiver bigint, p_content bytea, p_now bigint,
                        OUT code integer, OUT id bigint) LANGUAGE plpgsql AS $$
DECLARE v_queue bigint;
BEGIN
    SELECT q.id INTO v_queue FROM mq_queues q WHERE q.name = p_queue;
    IF v_queue IS NULL THEN code := 6; RETURN; END IF;
    IF p_receiver IS NOT NULL AND NOT EXISTS (SELECT 1 FROM mq_clients c WHERE c.id = p_receiver) THEN
        code := 9; RETURN;
    END IF;
    INSERT INTO mq_messages(queue_id, sender_id, receiver_id, arrived_us, content)
    VALUES (v_queue, p_sender, p_receiver, p_now, p_content) RETURNING mq_messages.id INTO id;
    code := 0;
END $$;

-- p_mode: 0 pop, 1 peek, 2 lease for p_lease_us. p_to_me: only messages addressed to p_me
-- (optionally from one queue / sender); otherwise the oldest message of p_queue readable by
-- p_me (addressed to p_me or to anyone). Messages under a live lease are invisible.
CREATE FUNCTION mq_read(p_me bigint, p_to_me boolean, p_queue text, p_sender bigint, p_mode integer,
                        p_lease_us bigint, p_now bigint,
                        OUT code integer, OUT id bigint, OUT queue text, OUT sender_id bigint,
                        OUT receiver_id bigint, OUT arrived_us bigint, OUT deliveries integer,
                        OUT content bytea) LANGUAGE plpgsql AS $$
DECLARE v_queue bigint; m mq_messages%ROWTYPE;
BEGIN
    IF p_queue IS NOT NULL THEN
        SELECT q.id INTO v_queue FROM mq_queues q WHERE q.name = p_queue;
        IF v_queue IS NULL THEN code := 6; RETURN; END IF;
    END IF;
    IF p_to_me THEN
        SELECT * INTO m FROM mq_messages x
        WHERE x.receiver_id = p_me AND (v_queue IS NULL OR x.queue_id = v_queue)
          AND (p_sender IS NULL OR x.sender_id = p_sender) AND x.visible_us <= p_now
        ORDER BY x.id LIMIT 1 FOR UPDATE SKIP LOCKED;
    ELSE
        SELECT * INTO m FROM mq_messages x
        WHERE x.queue_id = v_queue AND (x.receiver_id IS NULL OR x.receiver_id = p_me)
          AND x.visible_us <= p_now
        ORDER BY x.id LIMIT 1 FOR UPDATE SKIP LOCKED;
    END IF;
    IF m.id IS NULL THEN code := 10; RETURN; END IF;
    IF p_mode = 0 THEN
        DELETE FROM mq_messages x WHERE x.id = m.id;
    ELSIF p_mode = 2 THEN
        UPDATE mq_messages x SET visible_us = p_now + p_lease_us, leased_by = p_me,
            deliveries = x.deliveries + 1 WHERE x.id = m.id;
        m.deliveries := m.deliveries + 1;
    END IF;
    SELECT q.name INTO queue FROM mq_queues q WHERE q.id = m.queue_id;
    code := 0; id := m.id; sender_id := m.sender_id; receiver_id := m.receiver_id;
    arrived_us := m.arrived_us; deliveries := m.deliveries; content := m.content;
END $$;

CREATE FUNCTION mq_ack(p_id bigint, p_me bigint, p_now bigint) RETURNS integer LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM mq_messages WHERE id = p_id AND leased_by = p_me AND visible_us > p_now;
    RETURN CASE WHEN FOUND THEN 0 ELSE 11 END;
END $$;

CREATE FUNCTION mq_list_queues(p_me bigint, p_limit bigint) RETURNS TABLE(name text) LANGUAGE sql STABLE AS $$
    SELECT q.name FROM mq_queues q
    WHERE EXISTS (SELECT 1 FROM mq_messages m WHERE m.queue_id = q.id
                  AND (m.receiver_id = p_me OR m.receiver_id IS NULL))
    ORDER BY q.name LIMIT p_limit
$$;

CREATE FUNCTION mq_queue_depth(p_queue text, OUT code integer, OUT n bigint) LANGUAGE plpgsql AS $$
DECLARE v_queue bigint;
BEGIN
    SELECT q.id INTO v_queue FROM mq_queues q WHERE q.name = p_queue;
    IF v_queue IS NULL THEN code := 6; n := 0; RETURN; END IF;
    SELECT count(*) INTO n FROM mq_messages WHERE queue_id = v_queue;
    code := 0;
END $$;
