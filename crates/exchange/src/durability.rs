//! The tier's journal: each core shard appends its [`SequencedInput`] to a journal of its own
//! (crate `journal`) and the R-Processor releases a reply only once that journal's durable
//! sequence covers the input that caused it.
//!
//! * Critical path: the core hands the record to the journal's ring (`group`: no wait, no
//!   syscall; a full ring is back-pressure) and goes on. Under `sync` it waits for the
//!   record's fsync instead: I/O on the critical path, the "before" of the experiment.
//! * Response side: outputs of one shard reach the R-Processor in sequence order and the
//!   durable sequence only grows, so waiting on the head output is a FIFO hold that needs no
//!   queue of its own: the R-Processor's inbound ring is the hold queue.
//! * Restart: [`open_shards`] recovers each shard's [`ShardState`] (its matching core plus the
//!   hash of every output it produced) from the journal and resumes sequencing after it.
//!
//! Snapshots of a shard's books are not written yet: recovery replays the whole journal.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use journal::segment::SEGMENT_BYTES_DEFAULT;
use journal::{
    DurableSeq, JournalConfig, JournalSender, JournalWriter, Policy, Record, RecoverOptions,
    StateMachine, recover_from,
};
use lab::outcome::BadInput;

use crate::book::Listing;
use crate::core::{CoreLimits, MatchingCore};
use crate::msg::{
    Command, CoreOutput, InstrumentId, OrderType, OutputHash, SequencedInput, Side, Stamps,
    TimeInForce,
};

/// How the tier journals its sequenced input (`--journal`).
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    clap::ValueEnum,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum JournalMode {
    /// Journal beside the core; replies wait until their input is on disk (group commit).
    #[default]
    Group,
    /// The core waits for each input's fsync: disk I/O on the critical path.
    Sync,
    /// Replies are not held; the journal syncs on a timer (a loss window on power failure).
    Relaxed,
    /// No journal.
    Off,
}

impl JournalMode {
    /// The journal policy, `None` when journaling is off.
    pub fn policy(self) -> Option<Policy> {
        match self {
            JournalMode::Group => Some(Policy::Group),
            JournalMode::Sync => Some(Policy::Sync),
            JournalMode::Relaxed => Some(Policy::Relaxed),
            JournalMode::Off => None,
        }
    }

    /// Whether replies wait for the durable sequence.
    pub fn holds_replies(self) -> bool {
        matches!(self, JournalMode::Group | JournalMode::Sync)
    }
}

/// Encoded size of a [`ShardRecord`]'s payload: instrument, command tag and the largest
/// command (`New`: order id, client, side, type, time in force, price, quantity).
pub const SHARD_RECORD_PAYLOAD_BYTES: usize = 4 + 1 + 8 + 4 + 3 + 8 + 4;

const TAG_NOP: u8 = 0;
const TAG_NEW: u8 = 1;
const TAG_CANCEL: u8 = 2;
const TAG_REPLACE: u8 = 3;
const TAG_HALT: u8 = 4;
const TAG_RESUME: u8 = 5;
const TAG_SET_BAND: u8 = 6;

/// A [`SequencedInput`] as the journal stores it (the latency stamps are not journaled).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ShardRecord(pub SequencedInput);

impl Record for ShardRecord {
    const PAYLOAD_BYTES: usize = SHARD_RECORD_PAYLOAD_BYTES;

    fn seq(&self) -> u64 {
        self.0.seq
    }

    fn encode(&self, payload: &mut [u8]) {
        payload.fill(0);
        let mut at = 0;
        let mut put = |field: &[u8]| {
            payload[at..at + field.len()].copy_from_slice(field);
            at += field.len();
        };
        put(&self.0.instrument.to_le_bytes());
        match self.0.command {
            Command::Nop => put(&[TAG_NOP]),
            Command::New { order_id, client, side, order_type, time_in_force, price, qty } => {
                put(&[TAG_NEW]);
                put(&order_id.to_le_bytes());
                put(&client.to_le_bytes());
                put(&[side as u8, order_type as u8, time_in_force as u8]);
                put(&price.to_le_bytes());
                put(&qty.to_le_bytes());
            }
            Command::Cancel { order_id, client } => {
                put(&[TAG_CANCEL]);
                put(&order_id.to_le_bytes());
                put(&client.to_le_bytes());
            }
            Command::Replace { order_id, client, price, qty } => {
                put(&[TAG_REPLACE]);
                put(&order_id.to_le_bytes());
                put(&client.to_le_bytes());
                put(&[0, 0, 0]);
                put(&price.to_le_bytes());
                put(&qty.to_le_bytes());
            }
            Command::Halt => put(&[TAG_HALT]),
            Command::Resume => put(&[TAG_RESUME]),
            Command::SetBand { low, high } => {
                put(&[TAG_SET_BAND]);
                put(&low.to_le_bytes());
                put(&high.to_le_bytes());
            }
        }
    }
}

/// Reads little-endian fields in order from a payload of [`SHARD_RECORD_PAYLOAD_BYTES`].
struct Fields<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Fields<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], String> {
        let field = self
            .bytes
            .get(self.at..self.at + N)
            .ok_or_else(|| format!("payload of {} bytes is too short", self.bytes.len()))?;
        self.at += N;
        Ok(field.try_into().expect("slice of N bytes"))
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take::<1>()?[0])
    }
    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.take()?))
    }
    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.take()?))
    }
    fn i64(&mut self) -> Result<i64, String> {
        Ok(i64::from_le_bytes(self.take()?))
    }
}

/// Decodes a journaled payload back into the sequenced input `seq`; `Err` names why not.
pub fn decode(seq: u64, payload: &[u8]) -> Result<SequencedInput, String> {
    let mut fields = Fields { bytes: payload, at: 0 };
    let instrument: InstrumentId = fields.u32()?;
    let tag = fields.u8()?;
    let command = match tag {
        TAG_NOP => Command::Nop,
        TAG_NEW => {
            let (order_id, client) = (fields.u64()?, fields.u32()?);
            let side = Side::from_code(fields.u8()?).ok_or("bad side code")?;
            let order_type = OrderType::from_code(fields.u8()?).ok_or("bad order type code")?;
            let time_in_force =
                TimeInForce::from_code(fields.u8()?).ok_or("bad time-in-force code")?;
            let (price, qty) = (fields.i64()?, fields.u32()?);
            Command::New { order_id, client, side, order_type, time_in_force, price, qty }
        }
        TAG_CANCEL => Command::Cancel { order_id: fields.u64()?, client: fields.u32()? },
        TAG_REPLACE => {
            let (order_id, client) = (fields.u64()?, fields.u32()?);
            fields.take::<3>()?;
            Command::Replace { order_id, client, price: fields.i64()?, qty: fields.u32()? }
        }
        TAG_HALT => Command::Halt,
        TAG_RESUME => Command::Resume,
        TAG_SET_BAND => Command::SetBand { low: fields.i64()?, high: fields.i64()? },
        other => return Err(format!("unknown command tag {other} at sequence {seq}")),
    };
    Ok(SequencedInput { seq, instrument, command, stamps: Stamps::default() })
}

/// One core shard's state as the journal protects it: the matching core plus the hash of
/// every output it produced (so a recovered shard continues the live run's output hash).
pub struct ShardState {
    pub core: MatchingCore,
    pub hash: OutputHash,
    /// The first record that did not decode (recovery refuses to go on with it).
    pub undecodable: Option<String>,
}

impl ShardState {
    pub fn new(listings: &[Listing], limits: CoreLimits) -> ShardState {
        ShardState {
            core: MatchingCore::new(listings, limits),
            hash: OutputHash::default(),
            undecodable: None,
        }
    }

    /// Processes one sequenced input, hashing each output before handing it to `emit`.
    #[inline]
    pub fn process(&mut self, input: &SequencedInput, emit: &mut impl FnMut(&CoreOutput)) {
        let hash = &mut self.hash;
        self.core.process(input, &mut |output| {
            hash.update(output);
            emit(output);
        });
    }
}

impl StateMachine for ShardState {
    fn apply(&mut self, seq: u64, payload: &[u8]) {
        if self.undecodable.is_some() {
            return;
        }
        match decode(seq, payload) {
            Ok(input) => self.process(&input, &mut |_| {}),
            Err(why) => self.undecodable = Some(why),
        }
    }

    /// Shard snapshots are not implemented: nothing is written and the exchange never offers
    /// one, so recovery always replays the journal from its first record.
    fn write_snapshot(&self, _out: &mut Vec<u8>) {}

    fn restore(_bytes: &[u8]) -> Result<Self, String> {
        Err("the exchange writes no shard snapshots; recovery replays the journal".into())
    }

    fn state_hash(&self) -> u64 {
        let digest = self.hash.digest();
        u64::from_le_bytes(digest[..8].try_into().expect("a blake3 digest has 32 bytes"))
    }
}

/// Where the shard journals live and how to open them.
#[derive(Clone, Debug)]
pub struct JournalOptions {
    /// Data directory (one `shard-N` journal under it); `None`: a fresh temporary directory.
    pub data_dir: Option<PathBuf>,
    /// Truncate a journal at a corrupt record instead of refusing to start.
    pub repair: bool,
    /// Size of each pre-allocated segment file (recovery reads the last one to its end).
    pub segment_bytes: u64,
}

impl Default for JournalOptions {
    fn default() -> Self {
        JournalOptions { data_dir: None, repair: false, segment_bytes: SEGMENT_BYTES_DEFAULT }
    }
}

/// What recovery found for one shard.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct ShardRecovery {
    pub shard: usize,
    pub dir: PathBuf,
    /// Last recovered sequence (0: a fresh journal); sequencing resumes after it.
    pub recovered_seq: u64,
    pub replayed_records: u64,
    /// The recovered output hash (hex) — equals the hash the live run had reached.
    pub recovered_hash: String,
    pub torn_tail_truncated: bool,
    pub repaired: bool,
}

/// One opened shard: recovered state plus its journal's two ends (absent when off).
pub struct OpenedShard {
    pub state: ShardState,
    pub last_seq: u64,
    pub sender: Option<JournalSender<ShardRecord>>,
    pub writer: Option<JournalWriter>,
    pub recovery: ShardRecovery,
}

/// The shard journals of one run; keeps a temporary data directory alive until dropped.
pub struct ShardJournals {
    pub shards: Vec<OpenedShard>,
    pub durables: Vec<Option<Arc<DurableSeq>>>,
    _temp_dir: Option<tempfile::TempDir>,
}

fn shard_dir(data_dir: &Path, shard: usize) -> PathBuf {
    data_dir.join(format!("shard-{shard}"))
}

/// Counts the `shard-N` directories under `data_dir`.
fn existing_shards(data_dir: &Path) -> usize {
    let mut shards = 0;
    while shard_dir(data_dir, shards).is_dir() {
        shards += 1;
    }
    shards
}

/// Recovers (or creates) the journal of each of `shard_count` shards and starts the writers.
pub fn open_shards(
    mode: JournalMode,
    options: &JournalOptions,
    shard_count: usize,
    listings: &[Listing],
    limits: CoreLimits,
) -> anyhow::Result<ShardJournals> {
    let Some(policy) = mode.policy() else {
        if let Some(dir) = &options.data_dir {
            return Err(BadInput(format!(
                "data directory {} given with the journal off: nothing would be recovered or \
                 written (use --journal group, sync or relaxed)",
                dir.display()
            ))
            .into());
        }
        let shards = (0..shard_count)
            .map(|shard| OpenedShard {
                state: ShardState::new(listings, limits),
                last_seq: 0,
                sender: None,
                writer: None,
                recovery: ShardRecovery { shard, ..ShardRecovery::default() },
            })
            .collect();
        return Ok(ShardJournals { shards, durables: vec![None; shard_count], _temp_dir: None });
    };
    let (data_dir, temp_dir) = match &options.data_dir {
        Some(dir) => (dir.clone(), None),
        None => {
            let temp = tempfile::Builder::new().prefix("leantier-exchange-").tempdir()?;
            (temp.path().to_path_buf(), Some(temp))
        }
    };
    let existing = existing_shards(&data_dir);
    if existing != 0 && existing != shard_count {
        // Instruments are routed to shards by key: another shard count would send an
        // instrument's orders to a shard that does not hold its book.
        return Err(BadInput(format!(
            "{} holds {existing} shard journals but the tier runs {shard_count} core shards",
            data_dir.display()
        ))
        .into());
    }
    let mut shards = Vec::with_capacity(shard_count);
    let mut durables = Vec::with_capacity(shard_count);
    for shard in 0..shard_count {
        let opened = open_shard(policy, options, &data_dir, shard, listings, limits)?;
        durables.push(opened.writer.as_ref().map(JournalWriter::durable));
        shards.push(opened);
    }
    Ok(ShardJournals { shards, durables, _temp_dir: temp_dir })
}

fn open_shard(
    policy: Policy,
    options: &JournalOptions,
    data_dir: &Path,
    shard: usize,
    listings: &[Listing],
    limits: CoreLimits,
) -> anyhow::Result<OpenedShard> {
    let dir = shard_dir(data_dir, shard);
    let fresh = || ShardState::new(listings, limits);
    let recovered = recover_from(&dir, RecoverOptions { repair: options.repair }, fresh)?;
    if let Some(why) = &recovered.state.undecodable {
        anyhow::bail!("journal {} holds a record the exchange cannot decode: {why}", dir.display());
    }
    let recovery = ShardRecovery {
        shard,
        dir,
        recovered_seq: recovered.last_seq,
        replayed_records: recovered.replayed_records,
        recovered_hash: recovered.state.hash.hex(),
        torn_tail_truncated: recovered.torn_tail.is_some(),
        repaired: recovered.repaired.is_some(),
    };
    let config =
        JournalConfig { policy, segment_bytes: options.segment_bytes, ..JournalConfig::default() };
    let (sender, writer) = JournalWriter::spawn::<ShardRecord>(recovered.tail, &config)?;
    Ok(OpenedShard {
        state: recovered.state,
        last_seq: recovered.last_seq,
        sender: Some(sender),
        writer: Some(writer),
        recovery,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_command_round_trips_through_the_journal_encoding() {
        let commands = [
            Command::Nop,
            Command::New {
                order_id: u64::MAX - 3,
                client: 17,
                side: Side::Sell,
                order_type: OrderType::Market,
                time_in_force: TimeInForce::Fok,
                price: -42,
                qty: 900,
            },
            Command::Cancel { order_id: 5, client: 6 },
            Command::Replace { order_id: 7, client: 8, price: 1_234_567, qty: 3 },
            Command::Halt,
            Command::Resume,
            Command::SetBand { low: i64::MIN, high: i64::MAX },
        ];
        for (index, command) in commands.into_iter().enumerate() {
            let input = SequencedInput {
                seq: index as u64 + 1,
                instrument: 1000 + index as u32,
                command,
                stamps: Stamps::default(),
            };
            let mut payload = [0u8; SHARD_RECORD_PAYLOAD_BYTES];
            ShardRecord(input).encode(&mut payload);
            assert_eq!(decode(input.seq, &payload), Ok(input));
        }
    }

    #[test]
    fn a_bad_payload_is_an_error_not_a_panic() {
        let mut payload = [0u8; SHARD_RECORD_PAYLOAD_BYTES];
        payload[4] = 99;
        assert!(decode(1, &payload).unwrap_err().contains("unknown command tag 99"));
        payload[4] = TAG_NEW;
        payload[17] = 7; // side code
        assert_eq!(decode(1, &payload).unwrap_err(), "bad side code");
        assert!(decode(1, &payload[..10]).unwrap_err().contains("too short"));
    }
}
