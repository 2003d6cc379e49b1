//! The master data's journal: the master-data process is the sequencer of its own input
//! (client limits and instrument reference updates from the master feed, halts and bands from
//! the external events process) and journals each update it applies, write-ahead, before it
//! publishes the new version to the pre-process.
//!
//! Why write-ahead (`sync`, whatever the shards' policy): once a version is published, the
//! pre-process may admit orders because of it, and those orders become durable in the shard
//! journals; the update that admitted them must not be lost in a crash that keeps them.
//! Updates are rare and this thread is off the critical path, so one fdatasync each is cheap.
//!
//! Recovery: the newest valid master snapshot (every `snapshot_every_records` updates), then
//! the updates journaled after it, re-applied in sequence to the configured reference data.

use std::path::Path;

use crate::error::ExchangeError::{self, BadInput};
use crate::error::{Result, journal_failed};
use journal::{
    JournalConfig, JournalSender, JournalWriter, Policy, Record, RecoverOptions, Snapshotter,
    StateMachine, recover_from,
};

use crate::book::Listing;
use crate::master::{Client, Instrument, MasterData, MasterUpdate, Status};
use matching::wire::{Fields, Put};

use super::JournalOptions;

/// The master journal's directory under the data directory.
pub const MASTER_DIR: &str = "master";
/// Encoded size of a [`MasterRecord`]'s payload: tag plus the largest update (`Band`:
/// instrument, low, high).
pub const MASTER_RECORD_PAYLOAD_BYTES: usize = 1 + 4 + 8 + 8;

const TAG_NONE: u8 = 0;
const TAG_STATUS: u8 = 1;
const TAG_LIMITS: u8 = 2;
const TAG_CLIENT: u8 = 3;
const TAG_HALTED: u8 = 4;
const TAG_BAND: u8 = 5;
const MASTER_SNAPSHOT_MAGIC: [u8; 8] = *b"LTXMSTR1";

/// One applied master-data update as the journal stores it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MasterRecord {
    pub seq: u64,
    pub update: MasterUpdate,
}

fn status_code(status: Status) -> u8 {
    match status {
        Status::Active => 0,
        Status::Inactive => 1,
    }
}

fn status_from_code(code: u8) -> Result<Status, String> {
    match code {
        0 => Ok(Status::Active),
        1 => Ok(Status::Inactive),
        other => Err(format!("bad instrument status code {other}")),
    }
}

impl Record for MasterRecord {
    const PAYLOAD_BYTES: usize = MASTER_RECORD_PAYLOAD_BYTES;

    fn seq(&self) -> u64 {
        self.seq
    }

    fn encode(&self, payload: &mut [u8]) {
        let mut out = Put::new(payload);
        let mut put = |field: &[u8]| out.put(field);
        match self.update {
            MasterUpdate::None => put(&[TAG_NONE]),
            MasterUpdate::InstrumentStatus { instrument, status } => {
                put(&[TAG_STATUS]);
                put(&instrument.to_le_bytes());
                put(&[status_code(status)]);
            }
            MasterUpdate::InstrumentLimits { instrument, lot, qty_max } => {
                put(&[TAG_LIMITS]);
                put(&instrument.to_le_bytes());
                put(&lot.to_le_bytes());
                put(&qty_max.to_le_bytes());
            }
            MasterUpdate::ClientLimit { client, enabled, order_value_max } => {
                put(&[TAG_CLIENT]);
                put(&client.to_le_bytes());
                put(&[u8::from(enabled)]);
                put(&order_value_max.to_le_bytes());
            }
            MasterUpdate::Halted { instrument, halted } => {
                put(&[TAG_HALTED]);
                put(&instrument.to_le_bytes());
                put(&[u8::from(halted)]);
            }
            MasterUpdate::Band { instrument, low, high } => {
                put(&[TAG_BAND]);
                put(&instrument.to_le_bytes());
                put(&low.to_le_bytes());
                put(&high.to_le_bytes());
            }
        }
    }
}

/// Decodes a journaled master update; `Err` names why not.
pub fn decode_master(payload: &[u8]) -> Result<MasterUpdate, String> {
    let mut fields = Fields::new(payload);
    Ok(match fields.u8()? {
        TAG_NONE => MasterUpdate::None,
        TAG_STATUS => MasterUpdate::InstrumentStatus {
            instrument: fields.u32()?,
            status: status_from_code(fields.u8()?)?,
        },
        TAG_LIMITS => MasterUpdate::InstrumentLimits {
            instrument: fields.u32()?,
            lot: fields.u32()?,
            qty_max: fields.u32()?,
        },
        TAG_CLIENT => MasterUpdate::ClientLimit {
            client: fields.u32()?,
            enabled: fields.u8()? != 0,
            order_value_max: fields.u64()?,
        },
        TAG_HALTED => MasterUpdate::Halted { instrument: fields.u32()?, halted: fields.u8()? != 0 },
        TAG_BAND => MasterUpdate::Band {
            instrument: fields.u32()?,
            low: fields.i64()?,
            high: fields.i64()?,
        },
        other => return Err(format!("unknown master update tag {other}")),
    })
}

/// The master data as its journal protects it.
pub struct MasterState {
    pub data: MasterData,
    /// The first journaled update that did not decode or apply (recovery refuses to go on).
    pub refused: Option<String>,
}

impl MasterState {
    /// A blake3 digest (hex) of the master data's content (its snapshot encoding).
    pub fn digest(&self) -> String {
        let mut bytes = Vec::new();
        self.write_snapshot(&mut bytes);
        blake3::hash(&bytes).to_hex().to_string()
    }
}

impl StateMachine for MasterState {
    fn apply(&mut self, seq: u64, payload: &[u8]) {
        if self.refused.is_some() {
            return;
        }
        let applied = decode_master(payload).and_then(|update| {
            self.data.apply(&update).map_err(|why| format!("{update:?}: {why}"))
        });
        if let Err(why) = applied {
            self.refused = Some(format!("master update {seq}: {why}"));
        }
    }

    fn write_snapshot(&self, out: &mut Vec<u8>) {
        // The version is not state: it counts publications of the cell, which a restart
        // begins anew.
        out.extend_from_slice(&MASTER_SNAPSHOT_MAGIC);
        out.extend_from_slice(&(self.data.instruments.len() as u32).to_le_bytes());
        for instrument in &self.data.instruments {
            let Some(i) = instrument else {
                out.push(0);
                continue;
            };
            out.push(1);
            out.extend_from_slice(&i.listing.instrument.to_le_bytes());
            out.extend_from_slice(&i.listing.ladder_low.to_le_bytes());
            out.extend_from_slice(&i.listing.tick.to_le_bytes());
            out.extend_from_slice(&i.listing.levels.to_le_bytes());
            out.extend_from_slice(&i.lot.to_le_bytes());
            out.extend_from_slice(&i.qty_max.to_le_bytes());
            out.extend_from_slice(&i.band_low.to_le_bytes());
            out.extend_from_slice(&i.band_high.to_le_bytes());
            out.extend_from_slice(&[status_code(i.status), u8::from(i.halted)]);
        }
        out.extend_from_slice(&(self.data.clients.len() as u32).to_le_bytes());
        for client in &self.data.clients {
            match client {
                None => out.push(0),
                Some(c) => {
                    out.extend_from_slice(&[1, u8::from(c.enabled)]);
                    out.extend_from_slice(&c.order_value_max.to_le_bytes());
                }
            }
        }
    }

    fn restore(bytes: &[u8]) -> Result<Self, String> {
        let mut fields = Fields::new(bytes);
        if fields.take::<8>()? != MASTER_SNAPSHOT_MAGIC {
            return Err("not a master-data snapshot (bad magic)".into());
        }
        let count = fields.u32()? as usize;
        // Every entry takes at least one byte: a count beyond the bytes left is damage.
        let mut instruments = Vec::with_capacity(count.min(fields.rest().len()));
        for _ in 0..count {
            instruments.push(match fields.u8()? {
                0 => None,
                _ => Some(Instrument {
                    listing: Listing {
                        instrument: fields.u32()?,
                        ladder_low: fields.i64()?,
                        tick: fields.i64()?,
                        levels: fields.u32()?,
                    },
                    lot: fields.u32()?,
                    qty_max: fields.u32()?,
                    band_low: fields.i64()?,
                    band_high: fields.i64()?,
                    status: status_from_code(fields.u8()?)?,
                    halted: fields.u8()? != 0,
                }),
            });
        }
        let count = fields.u32()? as usize;
        let mut clients = Vec::with_capacity(count.min(fields.rest().len()));
        for _ in 0..count {
            clients.push(match fields.u8()? {
                0 => None,
                _ => Some(Client { enabled: fields.u8()? != 0, order_value_max: fields.u64()? }),
            });
        }
        if !fields.rest().is_empty() {
            return Err(format!("{} bytes after the master data", fields.rest().len()));
        }
        Ok(MasterState { data: MasterData { version: 0, instruments, clients }, refused: None })
    }

    /// The content digest's first 8 bytes (master snapshots are small: hashing is cheap).
    fn state_hash(&self) -> u64 {
        let digest = self.digest();
        u64::from_str_radix(&digest[..16], 16).expect("a hex digest")
    }
}

/// What recovery found for the master data.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct MasterRecovery {
    /// Last recovered update (0: none journaled yet).
    pub recovered_seq: u64,
    pub snapshot_seq: Option<u64>,
    pub replayed_records: u64,
    /// Digest of the recovered master data (equals the stopped run's final one).
    pub recovered_digest: String,
}

/// The master-data process's journal: recovered data, the write-ahead journal and its
/// snapshots.
pub struct MasterJournal {
    pub state: MasterState,
    pub last_seq: u64,
    pub sender: JournalSender<MasterRecord>,
    pub writer: JournalWriter,
    pub snapshots: Option<(Snapshotter, u64)>,
    pub recovery: MasterRecovery,
}

/// Recovers the master data journaled under `data_dir` on top of `reference` (the
/// configured master data) and opens its journal.
pub fn open_master(
    data_dir: &Path,
    options: &JournalOptions,
    snapshot_every_records: u64,
    reference: &MasterData,
) -> Result<MasterJournal> {
    let dir = data_dir.join(MASTER_DIR);
    let initial = || MasterState { data: reference.clone(), refused: None };
    let recovered = recover_from(&dir, RecoverOptions { repair: options.repair }, initial)
        .map_err(journal_failed(format!("recovering the master journal {}", dir.display())))?;
    if let Some(why) = &recovered.state.refused {
        let why = format!("master journal {} cannot be re-applied: {why}", dir.display());
        return Err(ExchangeError::Failed(why));
    }
    let data = &recovered.state.data;
    if data.listings() != reference.listings() || data.clients.len() != reference.clients.len() {
        return Err(BadInput(format!(
            "the master data in {} lists other instruments or clients than this run's universe",
            dir.display()
        )));
    }
    let recovery = MasterRecovery {
        recovered_seq: recovered.last_seq,
        snapshot_seq: recovered.snapshot_seq,
        replayed_records: recovered.replayed_records,
        recovered_digest: recovered.state.digest(),
    };
    let config = JournalConfig {
        policy: Policy::Sync,
        segment_bytes: options.segment_bytes,
        ..JournalConfig::default()
    };
    let (sender, writer) = JournalWriter::spawn::<MasterRecord>(recovered.tail, &config)
        .map_err(journal_failed(format!("starting the journal writer of {}", dir.display())))?;
    let snapshots = if snapshot_every_records == 0 {
        None
    } else {
        let snapshotter = Snapshotter::spawn(dir, writer.durable())
            .map_err(journal_failed("starting the master data's snapshot thread"))?;
        Some((snapshotter, snapshot_every_records))
    };
    Ok(MasterJournal {
        state: recovered.state,
        last_seq: recovered.last_seq,
        sender,
        writer,
        snapshots,
        recovery,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flow::{UniverseConfig, reference_master_data};

    #[test]
    fn every_update_round_trips_and_the_snapshot_restores_exactly() {
        let updates = [
            MasterUpdate::None,
            MasterUpdate::InstrumentStatus { instrument: 3, status: Status::Inactive },
            MasterUpdate::InstrumentLimits { instrument: 4, lot: 5, qty_max: 500 },
            MasterUpdate::ClientLimit { client: 9, enabled: false, order_value_max: u64::MAX },
            MasterUpdate::Halted { instrument: 1, halted: true },
            MasterUpdate::Band { instrument: 2, low: -7, high: i64::MAX },
        ];
        let mut payload = [0u8; MASTER_RECORD_PAYLOAD_BYTES];
        for update in updates {
            MasterRecord { seq: 1, update }.encode(&mut payload);
            assert_eq!(decode_master(&payload), Ok(update));
        }
        payload[0] = 77;
        assert!(decode_master(&payload).unwrap_err().contains("tag 77"));

        let mut state = MasterState {
            data: reference_master_data(&UniverseConfig { instruments: 5, clients: 12 }),
            refused: None,
        };
        state.data.clients[11] = None;
        for (seq, update) in updates.iter().take(5).enumerate() {
            MasterRecord { seq: seq as u64 + 1, update: *update }.encode(&mut payload);
            state.apply(seq as u64 + 1, &payload);
        }
        assert!(state.refused.is_none(), "{:?}", state.refused);
        let mut bytes = Vec::new();
        state.write_snapshot(&mut bytes);
        let restored = MasterState::restore(&bytes).unwrap();
        assert_eq!(restored.data.instruments, state.data.instruments);
        assert_eq!(restored.data.clients, state.data.clients);
        assert_eq!(restored.state_hash(), state.state_hash());
        assert!(MasterState::restore(&bytes[..bytes.len() - 1]).is_err());
        // An update that cannot apply on replay stops recovery rather than being skipped.
        MasterRecord { seq: 9, update: MasterUpdate::Halted { instrument: 99, halted: true } }
            .encode(&mut payload);
        state.apply(9, &payload);
        assert!(state.refused.unwrap().contains("unknown instrument"));
    }
}
