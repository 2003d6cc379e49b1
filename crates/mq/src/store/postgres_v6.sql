-- Migration 6: no per-row foreign-key check on sends. The check (a trigger running
-- `SELECT … FROM mq_queues … FOR KEY SHARE` once per inserted message) was the largest part of
-- PostgreSQL's extra CPU per sent message over a plain INSERT. The send statement now takes the
-- same KEY SHARE lock once per queue and statement (see SEND_SQL in postgres.rs), which keeps
-- what the constraint guaranteed: a queue being deleted (mq_delete_queue locks its row FOR
-- UPDATE) makes concurrent sends wait, and a send after the delete finds no queue (code 6), so
-- no message is ever stored for a deleted queue.
ALTER TABLE mq_messages DROP CONSTRAINT IF EXISTS mq_messages_queue_id_fkey;
