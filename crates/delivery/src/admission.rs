//! Who may hold one of the delivery edge's connections. Consumers are not authenticated (the
//! edge's listener is meant for its own host's consumers), so the bounds are by source
//! address: before its hello a connection takes one of [`HELLO_PENDING_MAX`] slots, at most
//! [`HELLO_PENDING_PER_ADDRESS_MAX`] of them per address, and after it one of the edge's
//! `consumers_max` seats, at most `consumers_per_address_max` per address. So connections
//! that never say hello, or consumers from one address, cannot take what the others need;
//! refused ones are closed at once (no task, no buffer, no descriptor kept).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};

/// Connections waiting to say hello, all addresses together.
pub const HELLO_PENDING_MAX: usize = 64;
/// Connections waiting to say hello, from one address.
pub const HELLO_PENDING_PER_ADDRESS_MAX: usize = 8;
/// Default most consumers from one address (a quarter of the default `consumers_max`).
pub const CONSUMERS_PER_ADDRESS_MAX_DEFAULT: usize = 16;

/// Why a connection was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("too many connections waiting to say hello")]
    HelloPendingFull,
    #[error("too many connections from this address waiting to say hello")]
    HelloPendingFromAddress,
    #[error("consumers_max reached")]
    ConsumersFull,
    #[error("consumers_per_address_max reached for this address")]
    ConsumersFromAddress,
}

#[derive(Default)]
struct PerAddress {
    pending: usize,
    consumers: usize,
}

#[derive(Default)]
struct Counts {
    pending: usize,
    consumers: usize,
    by_address: HashMap<IpAddr, PerAddress>,
}

/// The counts behind the bounds, shared by the edge's connection tasks.
pub struct Admission {
    counts: Mutex<Counts>,
    consumers_max: usize,
    consumers_per_address_max: usize,
}

/// A connection's place while it has not said hello (given back when dropped).
pub struct Pending {
    admission: Arc<Admission>,
    address: IpAddr,
}

/// A consumer's seat (given back when dropped).
pub struct Seat {
    admission: Arc<Admission>,
    address: IpAddr,
}

impl Admission {
    /// Bounds of `consumers_max` consumers, `consumers_per_address_max` from one address.
    pub fn new(consumers_max: usize, consumers_per_address_max: usize) -> Arc<Admission> {
        let counts = Mutex::new(Counts::default());
        Arc::new(Admission { counts, consumers_max, consumers_per_address_max })
    }

    fn counts(&self) -> std::sync::MutexGuard<'_, Counts> {
        // A panic elsewhere leaves the counts consistent (each update is one statement).
        self.counts.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Admits a new connection from `address` until its hello, or says why not.
    ///
    /// ```
    /// use delivery::admission::{Admission, HELLO_PENDING_PER_ADDRESS_MAX, Refusal};
    /// let admission = Admission::new(64, 16);
    /// let address = "127.0.0.3".parse().unwrap();
    /// let held: Vec<_> = (0..HELLO_PENDING_PER_ADDRESS_MAX)
    ///     .map(|_| admission.arrive(address).unwrap())
    ///     .collect();
    /// assert_eq!(admission.arrive(address).err(), Some(Refusal::HelloPendingFromAddress));
    /// assert!(admission.arrive("127.0.0.4".parse().unwrap()).is_ok(), "another address");
    /// drop(held);
    /// assert!(admission.arrive(address).is_ok(), "the slots come back");
    /// ```
    pub fn arrive(self: &Arc<Self>, address: IpAddr) -> Result<Pending, Refusal> {
        let mut counts = self.counts();
        if counts.pending >= HELLO_PENDING_MAX {
            return Err(Refusal::HelloPendingFull);
        }
        let here = counts.by_address.entry(address).or_default();
        if here.pending >= HELLO_PENDING_PER_ADDRESS_MAX {
            return Err(Refusal::HelloPendingFromAddress);
        }
        here.pending += 1;
        counts.pending += 1;
        Ok(Pending { admission: self.clone(), address })
    }
}

impl Pending {
    /// The connection said hello: it takes a consumer's seat, or says why not.
    ///
    /// ```
    /// use delivery::admission::{Admission, Refusal};
    /// let admission = Admission::new(3, 2);
    /// let (one, other) = ("127.0.0.3".parse().unwrap(), "127.0.0.4".parse().unwrap());
    /// let seats = [one, one].map(|a| admission.arrive(a).unwrap().seat().unwrap());
    /// let refused = admission.arrive(one).unwrap().seat().err();
    /// assert_eq!(refused, Some(Refusal::ConsumersFromAddress));
    /// let third = admission.arrive(other).unwrap().seat().unwrap();
    /// assert_eq!(admission.arrive(other).unwrap().seat().err(), Some(Refusal::ConsumersFull));
    /// drop((seats, third));
    /// ```
    pub fn seat(self) -> Result<Seat, Refusal> {
        let admission = self.admission.clone();
        let address = self.address;
        let mut counts = admission.counts();
        let full = counts.consumers >= admission.consumers_max;
        let here = counts.by_address.entry(address).or_default();
        if here.consumers >= admission.consumers_per_address_max {
            return Err(Refusal::ConsumersFromAddress);
        }
        if full {
            return Err(Refusal::ConsumersFull);
        }
        here.consumers += 1;
        counts.consumers += 1;
        drop(counts);
        Ok(Seat { admission, address })
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        let mut counts = self.admission.counts();
        counts.pending -= 1;
        release(&mut counts.by_address, self.address, |here| here.pending -= 1);
    }
}

impl Drop for Seat {
    fn drop(&mut self) {
        let mut counts = self.admission.counts();
        counts.consumers -= 1;
        release(&mut counts.by_address, self.address, |here| here.consumers -= 1);
    }
}

/// Applies `give_back` to `address`'s counts and forgets an address that holds nothing.
fn release(
    by_address: &mut HashMap<IpAddr, PerAddress>,
    address: IpAddr,
    give_back: impl FnOnce(&mut PerAddress),
) {
    if let Some(here) = by_address.get_mut(&address) {
        give_back(here);
        if here.pending == 0 && here.consumers == 0 {
            by_address.remove(&address);
        }
    }
}
