//! A live connection's outbound side, shared by its session task, the router and the store:
//! bytes waiting for the socket and bytes held until the store has made them durable.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;

use tokio::sync::Notify;

use crate::native;

/// Why the server ends a session on its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cut {
    /// It fell [`crate::Settings::outbox_bytes_max`] behind.
    SlowConsumer,
    /// Its refusals within a second passed its throttle's rate and
    /// [`crate::hub::THROTTLE_BREACH_REFUSALS_MIN`]: every refusal is a stored reply, so a flood would
    /// grow the store without bound.
    ThrottleBreach,
}

impl Cut {
    pub fn reason(self) -> &'static str {
        match self {
            Cut::SlowConsumer => "slow consumer: outbound buffer full",
            Cut::ThrottleBreach => "over twice its throttle's rate for a second",
        }
    }

    /// The native protocol's [`native::error_code`].
    pub fn error_code(self) -> u8 {
        match self {
            Cut::SlowConsumer => native::error_code::SLOW_CONSUMER,
            Cut::ThrottleBreach => native::error_code::THROTTLE_BREACH,
        }
    }
}

/// A live connection's outbound side: bytes waiting for its writer, and bytes held until the
/// store has made their records durable ([`crate::store`]); both bounded together.
#[derive(Default)]
pub struct Link {
    out: RefCell<Vec<u8>>,
    wake: Notify,
    /// Set once when the session must end; the connection says why and closes.
    cut: Cell<Option<Cut>>,
    held: RefCell<Vec<u8>>,
    /// (store write epoch, end of the held bytes that wait for it), oldest first.
    marks: RefCell<VecDeque<(u64, usize)>>,
    /// Whether the store's list of links with held bytes has this one.
    waiting: Cell<bool>,
}

impl Link {
    /// Queues bytes; past `limit` queued bytes the session is cut off as a slow consumer.
    pub fn send(&self, bytes: &[u8], limit: usize) -> bool {
        if !self.admit(bytes.len(), limit) {
            return false;
        }
        self.out.borrow_mut().extend_from_slice(bytes);
        self.wake.notify_one();
        true
    }

    /// Holds bytes until the store's next commit is durable (see [`crate::store::Log::hold`]).
    pub fn hold(&self, bytes: &[u8], limit: usize) -> bool {
        if !self.admit(bytes.len(), limit) {
            return false;
        }
        self.held.borrow_mut().extend_from_slice(bytes);
        true
    }

    fn admit(&self, bytes: usize, limit: usize) -> bool {
        let queued = self.out.borrow().len() + self.held.borrow().len();
        if queued + bytes > limit {
            self.cut.set(Some(Cut::SlowConsumer));
            self.wake.notify_one();
            return false;
        }
        true
    }

    /// Why the session must end, once it must.
    pub fn cut(&self) -> Option<Cut> {
        self.cut.get()
    }

    /// Ends the session for `cut` unless it is ending already (the first reason stays).
    pub fn end(&self, cut: Cut) {
        if self.cut.get().is_none() {
            self.cut.set(Some(cut));
            self.wake.notify_one();
        }
    }

    /// Resolves when bytes are queued or the session must end.
    pub fn woken(&self) -> tokio::sync::futures::Notified<'_> {
        self.wake.notified()
    }

    /// Whether nothing waits for the socket.
    pub fn is_written(&self) -> bool {
        self.out.borrow().is_empty()
    }

    /// Swaps what waits for the socket into `writing` (empty), so that the session writes it
    /// while routing queues more.
    pub fn take_out(&self, writing: &mut Vec<u8>) {
        std::mem::swap(&mut *self.out.borrow_mut(), writing);
    }

    /// Puts the link on the store's list of links with held bytes: whether it was not on it.
    pub fn enlist(&self) -> bool {
        !self.waiting.replace(true)
    }

    /// Whether the link stays on the store's list (it still holds bytes).
    pub fn stay_listed(&self, still: bool) {
        self.waiting.set(still);
    }

    /// Whether bytes wait for the store.
    pub fn is_holding(&self) -> bool {
        !self.held.borrow().is_empty()
    }

    /// The bytes held so far wait for write epoch `epoch`.
    pub fn mark(&self, epoch: u64) {
        let end = self.held.borrow().len();
        let mut marks = self.marks.borrow_mut();
        if end == marks.back().map_or(0, |mark| mark.1) {
            return; // nothing held since the last mark
        }
        match marks.back_mut() {
            Some(last) if last.0 == epoch => last.1 = end,
            _ => marks.push_back((epoch, end)),
        }
    }

    /// Moves the held bytes whose epoch is durable to the outbox; whether any stay held.
    pub fn release(&self, durable: u64) -> bool {
        let mut marks = self.marks.borrow_mut();
        let mut upto = 0;
        while let Some(&(epoch, end)) = marks.front() {
            if epoch > durable {
                break;
            }
            upto = end;
            marks.pop_front();
        }
        let mut held = self.held.borrow_mut();
        if upto > 0 {
            self.out.borrow_mut().extend_from_slice(&held[..upto]);
            held.drain(..upto);
            marks.iter_mut().for_each(|mark| mark.1 -= upto);
            self.wake.notify_one();
        }
        !held.is_empty()
    }
}

#[cfg(test)]
impl Link {
    /// What waits for the socket (tests read it without a session).
    pub fn written_for_tests(&self) -> std::cell::Ref<'_, Vec<u8>> {
        self.out.borrow()
    }
}
