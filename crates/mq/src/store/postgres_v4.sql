-- Migration 4 (protocol 2): client secrets and queue owners. Rows made before it have NULL:
-- a client without a secret takes the first one registered under its name; a queue without an
-- owner cannot be deleted through the protocol.
-- Result code 18: not the queue's owner (the protocol's NotOwner).
ALTER TABLE mq_clients ADD COLUMN secret_hash text;
ALTER TABLE mq_queues ADD COLUMN owner_id bigint;

-- One statement, so two nodes registering one new name at once get one row: the loser's insert
-- becomes the update, which keeps the winner's hash.
CREATE FUNCTION mq_claim_client(p_name text, p_hash text, OUT id bigint, OUT secret_hash text)
LANGUAGE sql AS $$
    INSERT INTO mq_clients AS c (name, secret_hash) VALUES (p_name, p_hash)
    ON CONFLICT (name) DO UPDATE SET secret_hash = coalesce(c.secret_hash, excluded.secret_hash)
    RETURNING c.id, c.secret_hash
$$;

DROP FUNCTION mq_create_queue(text);
CREATE FUNCTION mq_create_queue(p_name text, p_owner bigint, OUT code integer, OUT id bigint)
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO mq_queues(name, owner_id) VALUES (p_name, p_owner) ON CONFLICT (name) DO NOTHING
        RETURNING mq_queues.id INTO id;
    code := CASE WHEN id IS NULL THEN 7 ELSE 0 END;
END $$;

-- As migration 1's, plus the owner check before anything is counted or deleted.
DROP FUNCTION mq_delete_queue(text, boolean);
CREATE FUNCTION mq_delete_queue(p_name text, p_purge boolean, p_me bigint,
                                OUT code integer, OUT n bigint, OUT owner bigint)
LANGUAGE plpgsql AS $$
DECLARE v_queue bigint;
BEGIN
    n := 0;
    SELECT q.id, q.owner_id INTO v_queue, owner FROM mq_queues q WHERE q.name = p_name FOR UPDATE;
    IF v_queue IS NULL THEN code := 6; RETURN; END IF;
    IF owner IS DISTINCT FROM p_me THEN code := 18; RETURN; END IF;
    SELECT count(*) INTO n FROM mq_messages WHERE queue_id = v_queue;
    IF n > 0 AND NOT p_purge THEN code := 8; RETURN; END IF;
    DELETE FROM mq_messages WHERE queue_id = v_queue;
    DELETE FROM mq_queues WHERE mq_queues.id = v_queue;
    code := 0;
END $$;
