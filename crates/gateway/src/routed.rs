//! How far a gateway without a tier (`crate::remote`) routed each (shard, outlet)'s
//! reports, kept in the session store with the reports themselves, so that a restarted
//! gateway never routes one twice and never skips one.
//!
//! A position is (input, reports): the newest engine input whose reports were routed, and how
//! many reports of that slot's stream were routed since that input's first (refusals the
//! engine's pre-process makes carry input 0 and count with the input before them). The
//! engines publish a slot's reports in a fixed order, so a position names one place in that
//! stream whatever the stream's own sequence numbers are.
//!
//! # The argument
//!
//! - The position is a store record (`store::kind::ROUTED`) appended to the same batch
//!   as the records of the reports it counts: recovery reads both or neither.
//! - The delivery edge's start (`crate::delivered`) is only a hint, kept *behind*: the forwarder
//!   writes the stream sequence of the first report of the newest input whose position the
//!   store has made durable ([`RoutedPositions::publish_durable`]). A restart therefore asks
//!   for reports from an input's first one on, at or before the kept position.
//! - The hub drops every report at or before the kept position ([`RoutedPositions::admit`]),
//!   counting from that input's first report: exactly those the store already holds.
//!
//! So a killed gateway's successor neither repeats a report (all up to the kept position are
//! dropped) nor loses one (the stream is read again from before it).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use exchange::msg::CoreOutput;

use crate::record::{encode_record, kind};

/// Bytes of a `kind::ROUTED` record's payload: shard u32, slot u32, input u64, reports u32.
pub const POSITION_BYTES: usize = 20;

/// A place in one slot's report stream (module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Position {
    /// The newest input whose reports were routed (0: none yet).
    pub input_seq: u64,
    /// Reports routed since that input's first one.
    pub reports: u32,
}

/// Encodes a position record's payload.
pub fn encode(shard: u32, slot: u32, position: Position) -> [u8; POSITION_BYTES] {
    let mut bytes = [0u8; POSITION_BYTES];
    bytes[0..4].copy_from_slice(&shard.to_le_bytes());
    bytes[4..8].copy_from_slice(&slot.to_le_bytes());
    bytes[8..16].copy_from_slice(&position.input_seq.to_le_bytes());
    bytes[16..20].copy_from_slice(&position.reports.to_le_bytes());
    bytes
}

/// Decodes a position record's payload: ((shard, slot), position).
pub fn decode(payload: &[u8]) -> Option<((u32, u32), Position)> {
    let bytes: &[u8; POSITION_BYTES] = payload.try_into().ok()?;
    let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
    let input_seq = u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes"));
    Some(((u32_at(0), u32_at(4)), Position { input_seq, reports: u32_at(16) }))
}

/// Per (shard, slot), the newest input whose reports are durable in the store: where the
/// forwarder may move the delivery edge's start to. Shared between the I/O thread (writer) and
/// the report forwarders (readers).
#[derive(Debug)]
pub struct DurableInputs {
    slots: u32,
    inputs: Vec<AtomicU64>,
}

impl DurableInputs {
    /// Room for `shards` × `slots` positions, none durable yet (0).
    pub fn new(shards: u32, slots: u32) -> Arc<DurableInputs> {
        let inputs = (0..shards * slots).map(|_| AtomicU64::new(0)).collect();
        Arc::new(DurableInputs { slots, inputs })
    }

    /// The newest input of (shard, slot) whose position is durable (0: none).
    pub fn get(&self, shard: u32, slot: u32) -> u64 {
        let at = (shard * self.slots + slot) as usize;
        // Relaxed: a hint that only moves forward; the store, not this value, holds the truth.
        self.inputs.get(at).map_or(0, |input| input.load(Ordering::Relaxed))
    }

    fn raise(&self, shard: u32, slot: u32, input_seq: u64) {
        if let Some(input) = self.inputs.get((shard * self.slots + slot) as usize) {
            // Relaxed: as in `get`.
            input.fetch_max(input_seq, Ordering::Relaxed);
        }
    }
}

/// The hub's side: drops what was routed before a restart, keeps the positions in the store.
#[derive(Default)]
pub struct RoutedPositions {
    /// `None` until [`RoutedPositions::share`]: a gateway inside a tier keeps no positions.
    durable: Option<Arc<DurableInputs>>,
    /// Per (shard, slot): reports at or before this position were routed before the restart.
    kept: HashMap<(u32, u32), Position>,
    /// Per (shard, slot): the position after the last report routed (or dropped) in this run.
    now: HashMap<(u32, u32), Position>,
    /// Positions that changed since the last store record.
    changed: Vec<(u32, u32)>,
    /// (write epoch, shard, slot, input): positions written, waiting to be durable.
    written: VecDeque<(u64, u32, u32, u64)>,
    /// Reports dropped as routed before the restart (metrics).
    pub dropped: u64,
}

impl RoutedPositions {
    /// Starts from the positions the store recovered.
    pub fn recovered(kept: HashMap<(u32, u32), Position>) -> RoutedPositions {
        // Put back only under the `regress-forget-routed` feature: the gateway that routes
        // again, after a restart, what it routed before (for proving that `crates/sim` finds it).
        let kept = if cfg!(feature = "regress-forget-routed") { HashMap::new() } else { kept };
        RoutedPositions { kept, ..RoutedPositions::default() }
    }

    /// Turns position keeping on: reports of client `c` come through slot `c % slots`.
    pub fn share(&mut self, durable: Arc<DurableInputs>) {
        self.durable = Some(durable);
    }

    /// Whether `output` (a client report) is to be routed: `false` for one at or before the
    /// kept position (counted in `dropped`). Advances the slot's position either way.
    pub fn admit(&mut self, output: &CoreOutput) -> bool {
        let Some(durable) = &self.durable else { return true };
        let key = (output.shard, output.client % durable.slots.max(1));
        let now = self.now.entry(key).or_default();
        if output.seq != 0 && output.seq != now.input_seq {
            *now = Position { input_seq: output.seq, reports: 0 };
        }
        now.reports += 1;
        let position = *now;
        if !self.changed.contains(&key) {
            self.changed.push(key);
        }
        let routed_before = self.kept.get(&key).is_some_and(|kept| position <= *kept);
        if routed_before && self.dropped == 0 {
            let kept = self.kept[&key];
            tracing::info!(
                shard = key.0,
                slot = key.1,
                input = kept.input_seq,
                reports = kept.reports,
                "gateway: dropping the reports routed before the restart (counted in \
                 gateway_reports_already_routed_total)"
            );
        }
        self.dropped += u64::from(routed_before);
        !routed_before
    }

    /// Appends a position record per slot whose position changed to `batch` (the batch that
    /// also holds the reports counted), whose write epoch will be `epoch`.
    pub fn append_changed(&mut self, batch: &mut Vec<u8>, epoch: u64) {
        for key in self.changed.drain(..) {
            let position = self.now[&key];
            encode_record(batch, kind::ROUTED, 0, &[&encode(key.0, key.1, position)]);
            self.written.push_back((epoch, key.0, key.1, position.input_seq));
        }
    }

    /// Publishes the positions the store made durable (up to write epoch `durable_epoch`).
    pub fn publish_durable(&mut self, durable_epoch: u64) {
        let Some(durable) = &self.durable else { return };
        while let Some(&(epoch, shard, slot, input_seq)) = self.written.front() {
            if epoch > durable_epoch {
                break;
            }
            durable.raise(shard, slot, input_seq);
            self.written.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(seq: u64, client: u32) -> CoreOutput {
        CoreOutput { seq, client, ..CoreOutput::default() }
    }

    #[test]
    #[cfg_attr(feature = "regress-forget-routed", ignore = "the bug is put back")]
    fn reports_up_to_the_kept_position_are_dropped_counting_from_their_inputs_first() {
        let kept = Position { input_seq: 7, reports: 2 };
        let mut positions = RoutedPositions::recovered(HashMap::from([((0, 0), kept)]));
        positions.share(DurableInputs::new(1, 1));
        // A restart reads the stream again from input 5's first report.
        let stream = [report(5, 1), report(0, 1), report(7, 1), report(7, 2), report(7, 1)];
        let admitted: Vec<bool> = stream.iter().map(|r| positions.admit(r)).collect();
        assert_eq!(admitted, [false, false, false, false, true]);
        assert_eq!(positions.dropped, 4);
        assert!(positions.admit(&report(8, 1)), "a later input is routed");
    }

    #[test]
    fn positions_round_trip_and_a_short_payload_is_refused() {
        let position = Position { input_seq: u64::MAX - 1, reports: 3 };
        assert_eq!(decode(&encode(4, 1, position)), Some(((4, 1), position)));
        assert_eq!(decode(&encode(4, 1, position)[..19]), None);
    }

    #[test]
    fn a_gateway_inside_a_tier_keeps_no_positions() {
        let kept = HashMap::from([((0, 0), Position { input_seq: 9, reports: 9 })]);
        let mut positions = RoutedPositions::recovered(kept);
        assert!(positions.admit(&report(1, 1)), "nothing is dropped without `share`");
    }
}
