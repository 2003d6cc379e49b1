//! A connection's replies from the database workers, without an allocation per request.
//!
//! Each connection makes one unbounded channel when it opens. Its reading half numbers the
//! requests it hands to the workers ([`Outbox::reply_to`]: a clone of the channel's sender and
//! the number, no allocation); a worker sends `(number, result)` on it when the batch commits
//! ([`ReplyTo::send`]). Its writing half writes replies in request order, so it takes request
//! `n`'s result by number ([`Inbox::take`]): two workers may commit one connection's requests
//! in either order, and a result that comes before an earlier request's is kept in a fixed
//! table until its turn.
//!
//! Why the table cannot overflow: the connection bounds the requests it has with the workers
//! at once (its pipeline, plus the one the writer waits for and the one the reader is handing
//! over) and makes the table that long ([`channel`]'s `outstanding_max`), so numbers taken
//! modulo it never meet. A slot found taken would mean a reply given to the wrong request, so
//! it is a release-build assertion.
//!
//! The channel stays open while the reading half or any unanswered [`ReplyTo`] holds a sender;
//! a [`ReplyTo`] dropped unanswered (a worker stopped with it in its batch) answers
//! [`Unanswered::unanswered`] ("database worker stopped"), so the writer never waits for a
//! reply that cannot come.

use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::mpsc;

/// The result given for a request whose worker stopped before answering it.
pub(crate) trait Unanswered {
    fn unanswered() -> Self;
}

type Numbered<T> = (u64, T);

/// A connection's reply channel for at most `outstanding_max` requests with the workers at
/// once: the reading half's end and the writing half's.
pub(crate) fn channel<T>(outstanding_max: usize) -> (Outbox<T>, Inbox<T>) {
    let (to_writer, from_workers) = mpsc::unbounded_channel();
    let early = (0..outstanding_max).map(|_| None).collect();
    (Outbox { to_writer, numbered: AtomicU64::new(0) }, Inbox { from_workers, early })
}

/// The reading half's end: numbers the requests it hands to the workers.
pub(crate) struct Outbox<T> {
    to_writer: mpsc::UnboundedSender<Numbered<T>>,
    /// Requests numbered so far. Relaxed: only this connection's reading half counts.
    numbered: AtomicU64,
}

impl<T: Unanswered> Outbox<T> {
    /// Where the next request handed to the workers is answered, and its number.
    pub(crate) fn reply_to(&self) -> (ReplyTo<T>, u64) {
        let number = self.numbered.fetch_add(1, Ordering::Relaxed);
        (ReplyTo { to: Some(self.to_writer.clone()), number }, number)
    }
}

/// Where a worker answers one request (see the module docs).
pub(crate) struct ReplyTo<T: Unanswered> {
    /// `None` once answered or dismissed.
    to: Option<mpsc::UnboundedSender<Numbered<T>>>,
    number: u64,
}

impl<T: Unanswered> ReplyTo<T> {
    /// Hands the result to the connection (nothing happens if it has gone away).
    pub(crate) fn send(mut self, committed: T) {
        if let Some(to) = self.to.take() {
            let _ = to.send((self.number, committed));
        }
    }

    /// Drops it without an answer: its request never reached a worker and was answered
    /// already, so the writer will not ask for this number.
    pub(crate) fn dismiss(mut self) {
        self.to = None;
    }
}

impl<T: Unanswered> Drop for ReplyTo<T> {
    fn drop(&mut self) {
        if let Some(to) = self.to.take() {
            let _ = to.send((self.number, T::unanswered()));
        }
    }
}

/// The writing half's end: each request's result, by number.
pub(crate) struct Inbox<T> {
    from_workers: mpsc::UnboundedReceiver<Numbered<T>>,
    /// Results that came before an earlier request's, at their number modulo the length.
    early: Vec<Option<Numbered<T>>>,
}

impl<T: Unanswered> Inbox<T> {
    /// Request `number`'s result if it has come.
    pub(crate) fn try_take(&mut self, number: u64) -> Option<T> {
        if let Some(committed) = self.take_early(number) {
            return Some(committed);
        }
        while let Ok((came, committed)) = self.from_workers.try_recv() {
            if came == number {
                return Some(committed);
            }
            self.keep_early(came, committed);
        }
        None
    }

    /// Waits for request `number`'s result; "database worker stopped" if it cannot come.
    pub(crate) async fn take(&mut self, number: u64) -> T {
        if let Some(committed) = self.try_take(number) {
            return committed;
        }
        while let Some((came, committed)) = self.from_workers.recv().await {
            if came == number {
                return committed;
            }
            self.keep_early(came, committed);
        }
        T::unanswered()
    }

    fn slot(&mut self, number: u64) -> &mut Option<Numbered<T>> {
        let length = self.early.len() as u64;
        &mut self.early[(number % length) as usize]
    }

    fn take_early(&mut self, number: u64) -> Option<T> {
        let slot = self.slot(number);
        match slot {
            Some((kept, _)) if *kept == number => slot.take().map(|(_, committed)| committed),
            _ => None,
        }
    }

    fn keep_early(&mut self, number: u64, committed: T) {
        let outstanding_max = self.early.len();
        let slot = self.slot(number);
        assert!(
            slot.is_none(),
            "reply {number} came with its slot taken: more than {outstanding_max} replies \
             outstanding on one connection"
        );
        *slot = Some((number, committed));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A result: `Some(id)`, or `None` for "worker stopped".
    #[derive(Debug, PartialEq)]
    struct Result(Option<u64>);

    impl Unanswered for Result {
        fn unanswered() -> Self {
            Result(None)
        }
    }

    const OUTSTANDING_MAX: usize = 8;

    fn result(id: u64) -> Result {
        Result(Some(id))
    }

    fn id_of(result: Result) -> Option<u64> {
        result.0
    }

    /// Results answered in reverse order, over several wraps of the table, are taken in request
    /// order, each its own.
    #[tokio::test]
    async fn results_come_back_in_request_order_whatever_order_workers_answer() {
        let (outbox, mut inbox) = channel(OUTSTANDING_MAX);
        for round in 0..5 {
            let window = OUTSTANDING_MAX as u64;
            let mut numbers = Vec::new();
            let mut replies: Vec<ReplyTo<Result>> = (0..window)
                .map(|_| {
                    let (reply, number) = outbox.reply_to();
                    numbers.push(number);
                    reply
                })
                .collect();
            while let Some(reply) = replies.pop() {
                let number = reply.number;
                reply.send(result(number * 10));
            }
            for number in numbers {
                assert_eq!(id_of(inbox.take(number).await), Some(number * 10), "round {round}");
            }
        }
    }

    /// A `ReplyTo` dropped unanswered answers "database worker stopped"; a dismissed one sends
    /// nothing, so a later request's result is the next to come.
    #[tokio::test]
    async fn a_dropped_reply_answers_worker_stopped_and_a_dismissed_one_nothing() {
        let (outbox, mut inbox) = channel(OUTSTANDING_MAX);
        let (dropped, first) = outbox.reply_to();
        drop(dropped);
        assert_eq!(id_of(inbox.take(first).await), None, "worker stopped");
        let (dismissed, _) = outbox.reply_to();
        dismissed.dismiss();
        let (answered, third) = outbox.reply_to();
        answered.send(result(3));
        assert_eq!(id_of(inbox.try_take(third).expect("came")), Some(3));
        assert!(inbox.early.iter().all(Option::is_none), "nothing kept for the dismissed one");
    }

    /// With the reading half gone and nothing unanswered, a wait ends with "worker stopped"
    /// instead of hanging.
    #[tokio::test]
    async fn a_wait_ends_when_no_reply_can_come() {
        let (outbox, mut inbox) = channel(OUTSTANDING_MAX);
        let (reply, number) = outbox.reply_to();
        reply.dismiss();
        drop(outbox);
        assert_eq!(id_of(inbox.take(number).await), None);
    }
}
