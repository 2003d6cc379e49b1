//! Who may hold a connection: at most [`CONNECTIONS_MAX`] in all, and before logging in at most
//! [`PREAUTH_CONNECTIONS_MAX`], of which [`PREAUTH_PER_ADDRESS_MAX`] from any one address.
//! Logged-in sessions are bounded by the credentials (one each), so connections that never log
//! in, from one address or many, can take only the pre-authentication slots, and only until the
//! logon timeout: they cannot lock the clients out. Refusals are logged at most once a second,
//! with their count, so a flood cannot flood the log.

use std::cell::RefCell;
use std::collections::HashMap;
use std::net::IpAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// Connections open at once; further ones are closed at accept.
pub const CONNECTIONS_MAX: usize = 1024;
/// Connections that have not logged in yet, from every address together.
pub const PREAUTH_CONNECTIONS_MAX: usize = 64;
/// Connections that have not logged in yet, from one address.
pub const PREAUTH_PER_ADDRESS_MAX: usize = 8;
/// At most one log line about refused connections per this interval.
const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(1);

/// Why a connection was closed at accept: too many of them in all, before their login, or
/// from its address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TooMany {
    Connections,
    BeforeLogin,
    FromAddress,
}

/// The counts behind the bounds (one per server, on its I/O thread).
#[derive(Default)]
pub struct Admission {
    open: usize,
    preauth: usize,
    preauth_by_address: HashMap<IpAddr, usize>,
    refused_unlogged: u64,
    last_log: Option<Instant>,
}

/// A connection's place: a pre-authentication slot until [`Ticket::logged_in`], and one of
/// the open connections until dropped.
pub struct Ticket {
    admission: Rc<RefCell<Admission>>,
    address: IpAddr,
    preauth: bool,
}

impl Admission {
    /// Admits a connection from `address`, or says why not (and logs it, rate-limited).
    pub fn admit(this: &Rc<RefCell<Admission>>, address: IpAddr) -> Result<Ticket, TooMany> {
        let mut admission = this.borrow_mut();
        let from_address = admission.preauth_by_address.get(&address).copied().unwrap_or(0);
        let refusal = if admission.open >= CONNECTIONS_MAX {
            Some(TooMany::Connections)
        } else if admission.preauth >= PREAUTH_CONNECTIONS_MAX {
            Some(TooMany::BeforeLogin)
        } else if from_address >= PREAUTH_PER_ADDRESS_MAX {
            Some(TooMany::FromAddress)
        } else {
            None
        };
        if let Some(refusal) = refusal {
            admission.log_refusal(refusal, address);
            return Err(refusal);
        }
        admission.open += 1;
        admission.preauth += 1;
        *admission.preauth_by_address.entry(address).or_default() += 1;
        Ok(Ticket { admission: this.clone(), address, preauth: true })
    }

    fn log_refusal(&mut self, refusal: TooMany, address: IpAddr) {
        self.refused_unlogged += 1;
        let now = Instant::now();
        if self.last_log.is_some_and(|last| now.duration_since(last) < REFUSAL_LOG_INTERVAL) {
            return;
        }
        let refused = std::mem::take(&mut self.refused_unlogged);
        tracing::warn!(refused, last = ?refusal, %address, "connections refused at accept");
        self.last_log = Some(now);
    }

    fn release_preauth(&mut self, address: IpAddr) {
        self.preauth -= 1;
        if let Some(count) = self.preauth_by_address.get_mut(&address) {
            *count -= 1;
            if *count == 0 {
                self.preauth_by_address.remove(&address);
            }
        }
    }
}

impl Ticket {
    /// The connection logged in: its pre-authentication slot is free for another.
    pub fn logged_in(&mut self) {
        if std::mem::take(&mut self.preauth) {
            self.admission.borrow_mut().release_preauth(self.address);
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.logged_in();
        self.admission.borrow_mut().open -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_holds_a_bounded_share_of_the_pre_authentication_slots() {
        use std::{cell::RefCell, rc::Rc};
        let admission = Rc::new(RefCell::new(Admission::default()));
        let address = "127.0.0.2".parse().unwrap();
        let held: Vec<_> = (0..PREAUTH_PER_ADDRESS_MAX)
            .map(|_| Admission::admit(&admission, address).unwrap())
            .collect();
        assert_eq!(Admission::admit(&admission, address).err(), Some(TooMany::FromAddress));
        let mut first = held.into_iter().next().unwrap();
        first.logged_in(); // its pre-authentication slot is free again
        assert!(Admission::admit(&admission, address).is_ok());
    }
}
