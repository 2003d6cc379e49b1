//! How a batch becomes set-based statements: consecutive requests of one kind are cut into
//! *steps*, each of which a store runs as ONE statement over arrays.
//!
//! The contract a plan keeps (the conformance test `a_mixed_batch_answers_as_one_at_a_time`
//! checks it on both stores): every request gets the answer it would get if the batch's
//! requests ran one at a time in *some* order that keeps each client's own requests in their
//! batch order. Requests of different clients in one batch are concurrent (they came from
//! different connections in the same instant), so any such order is one the node could have
//! seen; a client's own order is what it observes and what the protocol promises.
//!
//! - **Sends**: a run of consecutive sends is one step; sends never depend on each other.
//! - **Reads**: a run of consecutive reads is cut into steps in which each client has ONE read
//!   key (target and mode). The reads of one key form a *group* that the store answers with
//!   one `LIMIT n … FOR UPDATE SKIP LOCKED` selection: n pops or leases take the n oldest
//!   readable messages, n peeks all see the oldest (a peek changes nothing). A client whose
//!   next read has another key starts a new step, so a pop, a peek and a pop of one client
//!   still see the queue as it is between them. The groups of a step run in order of their
//!   first request.
//! - **Acks**: a run of consecutive acks is one step, cut where a message id repeats (the
//!   second ack of one message must see the first one's delete).
//! - Everything else (queue creation and deletion, listings, stats) is its own step.

use std::ops::Range;

use super::StoreOp;
use crate::protocol::{ReadMode, ReadTarget, Request};

/// One statement's worth of a batch; indices are positions in the batch's ops.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Step {
    Sends(Range<usize>),
    Reads(Vec<ReadGroup>),
    Acks(Range<usize>),
    One(usize),
}

/// Reads of one client with one target and mode, in batch order.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct ReadGroup {
    pub(crate) members: Vec<usize>,
}

impl ReadGroup {
    /// The latest arrival among the members: the group's "now" for visibility and leases.
    pub(crate) fn now_us(&self, ops: &[StoreOp]) -> u64 {
        self.members.iter().map(|&i| ops[i].now_us).max().unwrap_or(0)
    }
}

/// The steps of `ops`, in the order a store runs them.
pub(crate) fn plan(ops: &[StoreOp]) -> Vec<Step> {
    let mut steps = Vec::new();
    let mut start = 0;
    while start < ops.len() {
        let end = match &ops[start].request {
            Request::Send { .. } => {
                let end = run_end(ops, start, |r| matches!(r, Request::Send { .. }));
                steps.push(Step::Sends(start..end));
                end
            }
            Request::Read { .. } => read_step(ops, start, &mut steps),
            Request::Ack { .. } => ack_step(ops, start, &mut steps),
            _ => {
                steps.push(Step::One(start));
                start + 1
            }
        };
        start = end;
    }
    steps
}

/// The end of the run of requests matching `kind` from `start`.
fn run_end(ops: &[StoreOp], start: usize, kind: impl Fn(&Request) -> bool) -> usize {
    start + ops[start..].iter().take_while(|op| kind(&op.request)).count()
}

/// The key that groups reads: a client's reads of one target and mode.
fn read_key(op: &StoreOp) -> Option<(Option<u64>, &ReadTarget, ReadMode)> {
    match &op.request {
        Request::Read { target, mode } => Some((op.client_id, target, *mode)),
        _ => None,
    }
}

/// Pushes one read step starting at `start`; returns where it ends.
fn read_step(ops: &[StoreOp], start: usize, steps: &mut Vec<Step>) -> usize {
    let mut groups: Vec<ReadGroup> = Vec::new();
    let mut end = start;
    while let Some(key) = ops.get(end).and_then(read_key) {
        let client = ops[end].client_id;
        match groups.iter_mut().find(|g| ops[g.members[0]].client_id == client) {
            Some(group) if read_key(&ops[group.members[0]]) == Some(key) => group.members.push(end),
            // The client read with another key in this step: its next read starts a new one.
            Some(_) => break,
            None => groups.push(ReadGroup { members: vec![end] }),
        }
        end += 1;
    }
    steps.push(Step::Reads(groups));
    end
}

/// Pushes one ack step starting at `start`; returns where it ends.
fn ack_step(ops: &[StoreOp], start: usize, steps: &mut Vec<Step>) -> usize {
    let acked = |op: &StoreOp| match op.request {
        Request::Ack { message_id } => Some(message_id),
        _ => None,
    };
    let mut end = start;
    while let Some(id) = ops.get(end).and_then(acked) {
        if ops[start..end].iter().any(|earlier| acked(earlier) == Some(id)) {
            break;
        }
        end += 1;
    }
    steps.push(Step::Acks(start..end));
    end
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(client: u64, request: Request) -> StoreOp {
        StoreOp { client_id: Some(client), now_us: 0, request }
    }

    fn pop(client: u64, queue: &str) -> StoreOp {
        let target = ReadTarget::Queue(queue.into());
        op(client, Request::Read { target, mode: ReadMode::Pop })
    }

    fn peek(client: u64, queue: &str) -> StoreOp {
        let target = ReadTarget::Queue(queue.into());
        op(client, Request::Read { target, mode: ReadMode::Peek })
    }

    fn send(client: u64) -> StoreOp {
        op(client, Request::Send { queue: "q".into(), receiver: None, content: vec![] })
    }

    fn ack(client: u64, message_id: u64) -> StoreOp {
        op(client, Request::Ack { message_id })
    }

    fn reads(groups: &[&[usize]]) -> Step {
        Step::Reads(groups.iter().map(|m| ReadGroup { members: m.to_vec() }).collect())
    }

    #[test]
    fn runs_of_one_kind_are_one_step_each() {
        let ops = [send(1), send(2), pop(1, "q"), pop(2, "q"), pop(1, "q"), send(1), ack(1, 7)];
        let expected =
            vec![Step::Sends(0..2), reads(&[&[2, 4], &[3]]), Step::Sends(5..6), Step::Acks(6..7)];
        assert_eq!(plan(&ops), expected);
    }

    #[test]
    fn a_client_that_changes_its_read_starts_a_new_step() {
        // Client 1: pop, peek, pop. The peek must see the queue after the first pop and before
        // the second, so the three cannot share a step.
        let ops = [pop(1, "q"), pop(2, "q"), peek(1, "q"), pop(1, "q"), pop(1, "r")];
        let expected = vec![reads(&[&[0], &[1]]), reads(&[&[2]]), reads(&[&[3]]), reads(&[&[4]])];
        assert_eq!(plan(&ops), expected);
    }

    #[test]
    fn a_repeated_ack_starts_a_new_step() {
        let ops = [ack(1, 5), ack(2, 6), ack(1, 5), ack(1, 8)];
        assert_eq!(plan(&ops), vec![Step::Acks(0..2), Step::Acks(2..4)]);
    }

    #[test]
    fn other_requests_are_steps_of_their_own() {
        let ops = [op(1, Request::ListQueues), op(1, Request::Stats { queue: "q".into() })];
        assert_eq!(plan(&ops), vec![Step::One(0), Step::One(1)]);
        assert_eq!(plan(&[]), vec![]);
    }
}
