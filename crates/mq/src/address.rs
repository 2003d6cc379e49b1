//! Bounds per source address: connections open at once, and registration attempts and accounts
//! created per time window. Without them one host could take every connection slot, or keep
//! the hashing threads busy and create accounts without end, whatever the node-wide bounds.
//!
//! A source is an IPv4 address, or an IPv6 /64 prefix (one host commonly holds a whole /64, so
//! counting single IPv6 addresses would bound nothing); an IPv4-mapped IPv6 address counts as
//! its IPv4 address.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// Sources whose registration window is remembered at once. Each costs a few dozen bytes; an
/// attacker with many addresses (an IPv6 network) could otherwise grow the table without end.
/// Past it, windows that ended are forgotten, and if none has, registrations from new sources
/// are refused `Busy` until one ends.
pub const REGISTRATION_SOURCES_MAX: usize = 65_536;

/// The source a peer address counts against.
pub(crate) fn source_of(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & !((1u128 << 64) - 1))),
        v4 => v4,
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // The tables hold plain counts; a panic elsewhere leaves them consistent.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Open connections per source.
#[derive(Default)]
pub(crate) struct ConnectionsPerSource {
    open: Mutex<HashMap<IpAddr, usize>>,
}

/// One counted connection; uncounted on drop. Owns its table's handle so it can move into the
/// connection's task.
pub(crate) struct SourceConnection {
    table: Arc<ConnectionsPerSource>,
    source: IpAddr,
}

impl ConnectionsPerSource {
    /// Counts a connection from `source` unless it already has `max` open.
    pub(crate) fn open(self: &Arc<Self>, source: IpAddr, max: usize) -> Option<SourceConnection> {
        let mut open = lock(&self.open);
        let count = open.entry(source).or_insert(0);
        if *count >= max {
            return None;
        }
        *count += 1;
        Some(SourceConnection { table: Arc::clone(self), source })
    }
}

impl Drop for SourceConnection {
    fn drop(&mut self) {
        let mut open = lock(&self.table.open);
        if let Some(count) = open.get_mut(&self.source) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.source);
            }
        }
    }
}

/// The per-source registration limits of one window.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RegistrationLimits {
    pub(crate) window: Duration,
    pub(crate) attempts_max: usize,
    pub(crate) accounts_max: usize,
}

/// A source's counts in its current window (which starts at its first attempt).
struct Window {
    started: Instant,
    attempts: usize,
    accounts: usize,
}

/// Why a source may not register now.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum SourceRefusal {
    #[error("too many registration attempts from this address; retry later")]
    Attempts,
    #[error("too many accounts created from this address; retry later")]
    Accounts,
    #[error("too many addresses registering; retry later")]
    Sources,
}

/// Registration attempts and accounts created per source and window.
pub(crate) struct RegistrationWindows {
    limits: RegistrationLimits,
    windows: Mutex<HashMap<IpAddr, Window>>,
}

impl RegistrationWindows {
    pub(crate) fn new(limits: RegistrationLimits) -> RegistrationWindows {
        RegistrationWindows { limits, windows: Mutex::new(HashMap::new()) }
    }

    /// Counts an attempt from `source` at `now`, unless its window has no attempt left.
    pub(crate) fn attempt(&self, source: IpAddr, now: Instant) -> Result<(), SourceRefusal> {
        let mut windows = lock(&self.windows);
        let window = self.current(&mut windows, source, now)?;
        if window.attempts >= self.limits.attempts_max {
            return Err(SourceRefusal::Attempts);
        }
        window.attempts += 1;
        Ok(())
    }

    /// Takes one account creation for `source`, unless its window has none left; it is given
    /// back unless [`AccountCreation::created`] is called.
    pub(crate) fn create_account(
        &self,
        source: IpAddr,
        now: Instant,
    ) -> Result<AccountCreation<'_>, SourceRefusal> {
        let mut windows = lock(&self.windows);
        let window = self.current(&mut windows, source, now)?;
        if window.accounts >= self.limits.accounts_max {
            return Err(SourceRefusal::Accounts);
        }
        window.accounts += 1;
        Ok(AccountCreation { windows: self, source })
    }
}

/// An account creation taken from a source's window: given back on drop (the hashing failed,
/// the registration was cancelled, the name was taken meanwhile) unless it created an account.
pub(crate) struct AccountCreation<'a> {
    windows: &'a RegistrationWindows,
    source: IpAddr,
}

impl AccountCreation<'_> {
    pub(crate) fn created(self) {
        std::mem::forget(self);
    }
}

impl Drop for AccountCreation<'_> {
    fn drop(&mut self) {
        if let Some(window) = lock(&self.windows.windows).get_mut(&self.source) {
            window.accounts = window.accounts.saturating_sub(1);
        }
    }
}

impl RegistrationWindows {
    /// `source`'s window at `now`, a new one if it had none or it ended.
    fn current<'t>(
        &self,
        windows: &'t mut HashMap<IpAddr, Window>,
        source: IpAddr,
        now: Instant,
    ) -> Result<&'t mut Window, SourceRefusal> {
        let ended = |w: &Window| now.saturating_duration_since(w.started) >= self.limits.window;
        if !windows.contains_key(&source) && windows.len() >= REGISTRATION_SOURCES_MAX {
            windows.retain(|_, w| !ended(w));
            if windows.len() >= REGISTRATION_SOURCES_MAX {
                return Err(SourceRefusal::Sources);
            }
        }
        let window =
            windows.entry(source).or_insert(Window { started: now, attempts: 0, accounts: 0 });
        if ended(window) {
            *window = Window { started: now, attempts: 0, accounts: 0 };
        }
        Ok(window)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv6_counts_by_its_64_prefix_and_mapped_ipv4_as_ipv4() {
        let a: IpAddr = "2001:db8:1:2:aaaa::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:bbbb::2".parse().unwrap();
        assert_eq!(source_of(a), source_of(b));
        assert_ne!(source_of(a), source_of("2001:db8:1:3::1".parse().unwrap()));
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().unwrap();
        assert_eq!(source_of(mapped), "10.0.0.1".parse::<IpAddr>().unwrap());
    }

    #[test]
    fn connections_are_counted_per_source_and_uncounted_on_drop() {
        let table = Arc::new(ConnectionsPerSource::default());
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let first = table.open(a, 2).unwrap();
        let _second = table.open(a, 2).unwrap();
        assert!(table.open(a, 2).is_none(), "a's bound");
        assert!(table.open(b, 2).is_some(), "another source is not affected");
        drop(first);
        assert!(table.open(a, 2).is_some(), "a slot is back");
    }

    #[test]
    fn windows_bound_attempts_and_accounts_and_renew() {
        let limits = RegistrationLimits {
            window: Duration::from_secs(60),
            attempts_max: 3,
            accounts_max: 1,
        };
        let windows = RegistrationWindows::new(limits);
        let (a, t0): (IpAddr, _) = ("10.0.0.1".parse().unwrap(), Instant::now());
        for _ in 0..3 {
            windows.attempt(a, t0).unwrap();
        }
        assert_eq!(windows.attempt(a, t0), Err(SourceRefusal::Attempts));
        drop(windows.create_account(a, t0).unwrap());
        windows.create_account(a, t0).unwrap().created();
        assert_eq!(windows.create_account(a, t0).err(), Some(SourceRefusal::Accounts));
        let later = t0 + Duration::from_secs(60);
        windows.attempt(a, later).unwrap();
        windows.create_account(a, later).unwrap().created();
    }
}
