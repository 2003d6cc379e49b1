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
//! * Snapshots ([`ShardSnapshotter`]): a follower thread per shard applies the journal's
//!   durable records to a replica of the shard's [`ShardState`] and, every
//!   `snapshot_every_records` records (tier config), writes the replica's state (books with
//!   every resting order in price-time priority, listings, halts and bands, counters, output
//!   hash) atomically and removes the journal segments it covers. The core does no snapshot
//!   work at all: its pause bound is zero (see `durability/follower.rs` for why not serialise
//!   on the core or copy-on-write).
//! * Master data ([`open_master`]): the master-data process journals every update it applies,
//!   write-ahead, with snapshots of its own, so a restart recovers the master data too.
//! * Restart: [`open_shards`] recovers each shard's [`ShardState`] from the newest valid
//!   snapshot (a damaged one is skipped with a warning: the older one, or a full replay, is
//!   used) plus the journal after it, and resumes sequencing after it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

mod follower;
mod master;
pub use follower::{FOLLOW_CHUNK_BYTES, FOLLOW_POLL, ShardSnapshotter, SnapshotReport};
pub use master::{
    MASTER_DIR, MasterJournal, MasterRecord, MasterRecovery, MasterState, decode_master,
    open_master,
};

use crate::error::ExchangeError::{self, BadInput};
use crate::error::{Result, io_failed, journal_failed};
use journal::segment::SEGMENT_BYTES_DEFAULT;
use journal::{
    DurableSeq, JournalConfig, JournalSender, JournalWriter, Policy, Record, RecoverOptions,
    StateMachine, recover_from,
};
use pipeline::metrics::now_ns;

use crate::book::Listing;
use crate::core::{CoreLimits, MatchingCore};
use crate::msg::{
    Command, CoreOutput, InstrumentId, OUTPUT_HASH_STATE_BYTES_MAX, OrderType, OutputHash,
    SequencedInput, Side, Stamps, TimeInForce,
};
use matching::wire::{Fields, Put};

/// How the tier journals its sequenced input (`--journal`, TOML `journal`): a journal
/// [`Policy`], or `None` for no journal. Spelled `group` (the default), `sync`, `relaxed` (the
/// policy's own serde names) or `off`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct JournalMode(pub Option<Policy>);

/// The spelling of "no journal".
const JOURNAL_OFF: &str = "off";

impl JournalMode {
    /// No journal.
    pub const OFF: JournalMode = JournalMode(None);
    /// Every mode, the default first.
    pub const ALL: [JournalMode; 4] = [
        JournalMode(Some(Policy::Group)),
        JournalMode(Some(Policy::Sync)),
        JournalMode(Some(Policy::Relaxed)),
        JournalMode::OFF,
    ];

    /// The config and flag spelling: the policy's name, or `off`.
    pub fn name(self) -> &'static str {
        self.0.map_or(JOURNAL_OFF, Policy::name)
    }

    /// The journal policy, `None` when journaling is off.
    pub fn policy(self) -> Option<Policy> {
        self.0
    }

    /// Whether replies wait for the durable sequence.
    pub fn holds_replies(self) -> bool {
        matches!(self.0, Some(Policy::Group | Policy::Sync))
    }
}

impl Default for JournalMode {
    fn default() -> Self {
        JournalMode(Some(Policy::Group))
    }
}

impl From<Policy> for JournalMode {
    fn from(policy: Policy) -> Self {
        JournalMode(Some(policy))
    }
}

/// One word, as reports and data-directory names have always shown it: `Group`, `Off`.
impl std::fmt::Debug for JournalMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(policy) => write!(f, "{policy:?}"),
            None => f.write_str("Off"),
        }
    }
}

/// The config and flag spelling: `group`, `off`.
impl std::fmt::Display for JournalMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for JournalMode {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        JournalMode::ALL.into_iter().find(|mode| mode.name() == text).ok_or_else(|| {
            format!("journal `{text}`: expected group, sync, relaxed or {JOURNAL_OFF}")
        })
    }
}

impl serde::Serialize for JournalMode {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name())
    }
}

impl<'de> serde::Deserialize<'de> for JournalMode {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
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
const TAG_CANCEL_ON_DISCONNECT: u8 = 7;

/// A [`SequencedInput`] as the journal stores it (the latency stamps are not journaled).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ShardRecord(pub SequencedInput);

impl Record for ShardRecord {
    const PAYLOAD_BYTES: usize = SHARD_RECORD_PAYLOAD_BYTES;

    fn seq(&self) -> u64 {
        self.0.seq
    }

    fn encode(&self, payload: &mut [u8]) {
        let mut out = Put::new(payload);
        let mut put = |field: &[u8]| out.put(field);
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
            Command::CancelOnDisconnect { order_id, client } => {
                put(&[TAG_CANCEL_ON_DISCONNECT]);
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

/// Decodes a journaled payload back into the sequenced input `seq`; `Err` names why not.
pub fn decode(seq: u64, payload: &[u8]) -> Result<SequencedInput, String> {
    let mut fields = Fields::new(payload);
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
        TAG_CANCEL_ON_DISCONNECT => {
            Command::CancelOnDisconnect { order_id: fields.u64()?, client: fields.u32()? }
        }
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

    /// The most bytes a snapshot of this shard takes (a full order pool).
    pub fn snapshot_bytes_max(&self) -> usize {
        self.core.snapshot_bytes_max() + OUTPUT_HASH_STATE_BYTES_MAX
    }

    /// A blake3 digest (hex) of the whole state as a snapshot encodes it: books and resting
    /// orders in priority order, halts, bands, counters and output hash. Equal digests mean
    /// equal states, whatever the order pool's slot layout.
    pub fn state_digest(&self) -> String {
        let mut bytes = Vec::with_capacity(self.snapshot_bytes_max());
        self.write_snapshot(&mut bytes);
        blake3::hash(&bytes).to_hex().to_string()
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

    /// The core's state, then the output hash's (so a restored shard continues the hash).
    fn write_snapshot(&self, out: &mut Vec<u8>) {
        self.core.write_snapshot(out);
        self.hash.write_to(out);
    }

    fn restore(bytes: &[u8]) -> Result<Self, String> {
        let (core, rest) = MatchingCore::restore(bytes)?;
        let (hash, rest) = OutputHash::read_from(rest)?;
        if !rest.is_empty() {
            return Err(format!("{} bytes after the shard state", rest.len()));
        }
        Ok(ShardState { core, hash, undecodable: None })
    }

    /// The output hash: it covers every output the shard ever produced, so two states with
    /// the same hash went through the same history (snapshot files carry it as a check).
    fn state_hash(&self) -> u64 {
        let digest = self.hash.digest();
        u64::from_le_bytes(digest[..8].try_into().expect("a blake3 digest has 32 bytes"))
    }
}

/// Default snapshot interval: journaled inputs of a shard between two of its snapshots.
pub const SNAPSHOT_EVERY_RECORDS_DEFAULT: u64 = 100_000;
/// Where the shard journals live and how to open them.
#[derive(Clone, Debug)]
pub struct JournalOptions {
    /// Data directory (one `shard-N` journal under it); `None`: a fresh temporary directory.
    pub data_dir: Option<PathBuf>,
    /// Truncate a journal at a corrupt record instead of refusing to start.
    pub repair: bool,
    /// Size of each pre-allocated segment file (recovery reads the last one to its end).
    pub segment_bytes: u64,
    /// With the journal off: the one core shard starts from this snapshot instead of empty
    /// books (a replicated engine restoring its group's snapshot).
    pub restore: Option<ShardRestore>,
}

impl Default for JournalOptions {
    fn default() -> Self {
        JournalOptions {
            data_dir: None,
            repair: false,
            segment_bytes: SEGMENT_BYTES_DEFAULT,
            restore: None,
        }
    }
}

/// A core shard's starting point taken elsewhere: its snapshot after its input `last_seq`.
#[derive(Clone)]
pub struct ShardRestore {
    /// The shard's last input sequence the snapshot covers.
    pub last_seq: u64,
    /// [`ShardState`]'s snapshot bytes ([`StateMachine::write_snapshot`]).
    pub snapshot: Arc<Vec<u8>>,
}

impl std::fmt::Debug for ShardRestore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let bytes = self.snapshot.len();
        f.debug_struct("ShardRestore")
            .field("last_seq", &self.last_seq)
            .field("bytes", &bytes)
            .finish()
    }
}

/// What recovery found for one shard.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct ShardRecovery {
    pub shard: usize,
    pub dir: PathBuf,
    /// Last recovered sequence (0: a fresh journal); sequencing resumes after it.
    pub recovered_seq: u64,
    /// The snapshot recovery started from (`None`: a replay from the first record).
    pub snapshot_seq: Option<u64>,
    pub replayed_records: u64,
    /// Time to load the snapshot and replay the journal, ns.
    pub recovery_ns: u64,
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
    /// The snapshot follower (`None` when journaling or snapshots are off).
    pub snapshots: Option<ShardSnapshotter>,
    pub recovery: ShardRecovery,
}

/// The shard journals of one run; keeps a temporary data directory alive until dropped.
pub struct ShardJournals {
    /// Where the journals live (`None` when journaling is off).
    pub data_dir: Option<PathBuf>,
    pub shards: Vec<OpenedShard>,
    pub durables: Vec<Option<Arc<DurableSeq>>>,
    /// The data directory's lock: one process writes its journals (held until this drops,
    /// after the writers stopped).
    _owner: Option<ops::StoreLock>,
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

/// Recovers (or creates) the journal of each of `shard_count` shards and starts the writers
/// (and the snapshot threads, when `snapshot_every_records` > 0).
pub fn open_shards(
    mode: JournalMode,
    options: &JournalOptions,
    snapshot_every_records: u64,
    shard_count: usize,
    listings: &[Listing],
    limits: CoreLimits,
) -> Result<ShardJournals> {
    let Some(policy) = mode.policy() else {
        return unjournaled_shards(options, shard_count, listings, limits);
    };
    if options.restore.is_some() {
        let why = "a shard snapshot to restore from is for a tier without a journal";
        return Err(BadInput(why.into()));
    }
    let (data_dir, temp_dir) = data_dir_of(options)?;
    // Before anything is read: a second process's recovery would cut the live writer's tail.
    let owner = ops::StoreLock::acquire(&data_dir)
        .map_err(|source| ExchangeError::Owned { dir: data_dir.clone(), source })?;
    let existing = existing_shards(&data_dir);
    if existing != 0 && existing != shard_count {
        // Instruments are routed to shards by key: another shard count would send an
        // instrument's orders to a shard that does not hold its book.
        return Err(BadInput(format!(
            "{} holds {existing} shard journals but the tier runs {shard_count} core shards",
            data_dir.display()
        )));
    }
    let mut shards = Vec::with_capacity(shard_count);
    let mut durables = Vec::with_capacity(shard_count);
    for shard in 0..shard_count {
        let place = (data_dir.as_path(), shard);
        let opened = open_shard(policy, options, snapshot_every_records, place, listings, limits)?;
        durables.push(opened.writer.as_ref().map(JournalWriter::durable));
        shards.push(opened);
    }
    Ok(ShardJournals {
        data_dir: Some(data_dir),
        shards,
        durables,
        _owner: Some(owner),
        _temp_dir: temp_dir,
    })
}

/// The shards of a tier without a journal: fresh books, or the first from the snapshot to
/// restore from (a restored tier runs one shard). A data directory is refused: nothing would
/// be recovered from it or written to it.
fn unjournaled_shards(
    options: &JournalOptions,
    shard_count: usize,
    listings: &[Listing],
    limits: CoreLimits,
) -> Result<ShardJournals> {
    if let Some(dir) = &options.data_dir {
        return Err(BadInput(format!(
            "data directory {} given with the journal off: nothing would be recovered or \
             written (use --journal group, sync or relaxed)",
            dir.display()
        )));
    }
    let (first_state, first_seq) = match &options.restore {
        None => (ShardState::new(listings, limits), 0),
        Some(_) if shard_count != 1 => {
            return Err(BadInput("a restored tier runs one core shard".into()));
        }
        Some(restore) => {
            let state = ShardState::restore(&restore.snapshot)
                .map_err(|why| BadInput(format!("the shard snapshot to restore from: {why}")))?;
            (state, restore.last_seq)
        }
    };
    let mut first = Some((first_state, first_seq));
    let shards = (0..shard_count)
        .map(|shard| {
            let (state, last_seq) =
                first.take().unwrap_or_else(|| (ShardState::new(listings, limits), 0));
            let recovery = ShardRecovery { shard, ..ShardRecovery::default() };
            OpenedShard { state, last_seq, sender: None, writer: None, snapshots: None, recovery }
        })
        .collect();
    let durables = vec![None; shard_count];
    Ok(ShardJournals { data_dir: None, shards, durables, _owner: None, _temp_dir: None })
}

/// The data directory of `options`, or a temporary one (kept while the returned guard lives).
fn data_dir_of(options: &JournalOptions) -> Result<(PathBuf, Option<tempfile::TempDir>)> {
    if let Some(dir) = &options.data_dir {
        return Ok((dir.clone(), None));
    }
    let temp = tempfile::Builder::new().prefix("leantier-exchange-").tempdir();
    let temp = temp.map_err(io_failed("creating a temporary data directory"))?;
    Ok((temp.path().to_path_buf(), Some(temp)))
}

fn open_shard(
    policy: Policy,
    options: &JournalOptions,
    snapshot_every_records: u64,
    (data_dir, shard): (&Path, usize),
    listings: &[Listing],
    limits: CoreLimits,
) -> Result<OpenedShard> {
    let dir = shard_dir(data_dir, shard);
    let fresh = || ShardState::new(listings, limits);
    let started_ns = now_ns();
    let recovered = recover_from(&dir, RecoverOptions { repair: options.repair }, fresh)
        .map_err(journal_failed(format!("recovering the shard journal {}", dir.display())))?;
    let recovery_ns = now_ns().saturating_sub(started_ns);
    check_recovered(&recovered.state, &dir, listings, limits)?;
    let recovery = ShardRecovery {
        shard,
        dir: dir.clone(),
        recovered_seq: recovered.last_seq,
        snapshot_seq: recovered.snapshot_seq,
        replayed_records: recovered.replayed_records,
        recovery_ns,
        recovered_hash: recovered.state.hash.hex(),
        torn_tail_truncated: recovered.torn_tail.is_some(),
        repaired: recovered.repaired.is_some(),
    };
    let config =
        JournalConfig { policy, segment_bytes: options.segment_bytes, ..JournalConfig::default() };
    let (next_seq, resume) = (recovered.tail.next_seq, recovered.tail.open_segment.clone());
    let (sender, writer) = JournalWriter::spawn::<ShardRecord>(recovered.tail, &config)
        .map_err(journal_failed(format!("starting the journal writer of {}", dir.display())))?;
    let snapshots = match snapshot_every_records {
        0 => None,
        every => {
            let from = (&recovered.state, next_seq, resume);
            Some(start_snapshots(dir, writer.durable(), from, every)?)
        }
    };
    Ok(OpenedShard {
        state: recovered.state,
        last_seq: recovered.last_seq,
        sender: Some(sender),
        writer: Some(writer),
        snapshots,
        recovery,
    })
}

/// Starts the shard's snapshot follower from the recovered state (`from`: the state, the next
/// journal sequence and where the open segment resumes). Its replica starts as a copy of that
/// state: start-up, not the critical path (one serialisation and restore).
fn start_snapshots(
    dir: PathBuf,
    durable: Arc<DurableSeq>,
    (state, next_seq, resume): (&ShardState, u64, Option<journal::reader::EndPosition>),
    every_records: u64,
) -> Result<ShardSnapshotter> {
    let mut bytes = Vec::with_capacity(state.snapshot_bytes_max());
    state.write_snapshot(&mut bytes);
    let replica = ShardState::restore(&bytes).map_err(ExchangeError::Failed)?;
    ShardSnapshotter::spawn(dir, durable, replica, next_seq, resume, every_records)
        .map_err(ExchangeError::Failed)
}

/// Refuses a recovered state the run cannot go on from: a record it could not decode, or a
/// snapshot taken with other listings or another pool size (its books would mean something
/// else than the journal's records did).
fn check_recovered(
    state: &ShardState,
    dir: &Path,
    listings: &[Listing],
    limits: CoreLimits,
) -> Result<()> {
    if let Some(why) = &state.undecodable {
        let why =
            format!("journal {} holds a record the exchange cannot decode: {why}", dir.display());
        return Err(ExchangeError::Failed(why));
    }
    if state.core.listings() != listings || state.core.limits() != limits {
        return Err(BadInput(format!(
            "the snapshot in {} was taken with other listings or another order pool size than \
             this run's configuration",
            dir.display()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One process writes a data directory's journals: a second opening is refused naming the
    /// lock, and the directory is free again once the first stopped (issue 41).
    #[test]
    fn a_data_directory_held_by_open_journals_is_refused_until_they_stop() {
        let dir = tempfile::tempdir().unwrap();
        let listings = [Listing { instrument: 0, ladder_low: 100, tick: 1, levels: 100 }];
        let limits = CoreLimits { order_pool_slots: 64, ..CoreLimits::default() };
        let data_dir = Some(dir.path().to_path_buf());
        let options = JournalOptions { data_dir, ..JournalOptions::default() };
        let open = || open_shards(JournalMode::ALL[0], &options, 0, 1, &listings, limits);
        let first = open().unwrap();
        let Err(ExchangeError::Owned { dir: held, source }) = open() else {
            panic!("one data directory opened twice");
        };
        assert_eq!(held, dir.path());
        assert!(matches!(source, ops::OpsError::Held { .. }), "{source}");
        // Writers first, then the rest (the lock with it) when the value goes.
        let stop = |journals: ShardJournals| {
            for shard in journals.shards {
                drop(shard.sender);
                shard.writer.map(JournalWriter::join).transpose().unwrap();
            }
        };
        stop(first);
        let again = open().expect("free once the first stopped");
        assert_eq!(again.shards.len(), 1);
    }

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
            Command::CancelOnDisconnect { order_id: 5, client: 6 },
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
