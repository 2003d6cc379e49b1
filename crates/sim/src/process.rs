//! The simulated processes' state: what each runs on and keeps (their behaviour is in
//! [`crate::engine`], [`crate::gateway`] and [`crate::client`], as the world's handlers).

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use delivery::edge::EpochFence;
use exchange::msg::{CoreOutput, InboundOrder};
use exchange::tier::TierConfig;
use gateway::routed::{Position, RoutedPositions};
use replication::lease::LeaseCore;
use replication::replay::GroupReplica;
use replication::snapshot::EngineSnapshot;

use crate::check::FillBook;
use crate::clock::{ProcessClock, SimInstant};
use crate::disk::{PendingSync, SimDisk};
use crate::journal::EngineJournal;
use crate::msg::Event;

/// Whether a process runs, and what waits for it while it is paused.
#[derive(Debug, Default)]
pub struct Life {
    /// Running (or paused); `false`: dead or stopped.
    pub up: bool,
    /// Paused: its events wait in `stash`.
    pub paused: bool,
    /// Its incarnation (grows at every start).
    pub inc: u32,
    /// Events that arrived while paused, in arrival order.
    pub stash: Vec<Event>,
    /// Its clocks.
    pub clock: ProcessClock,
    /// Cut off from NATS until this true time.
    pub partitioned_until_ns: u64,
}

/// A lease write in flight.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LeaseRequest {
    pub(crate) id: u64,
    pub(crate) renewal: bool,
    pub(crate) started: SimInstant,
    pub(crate) sent_ns: u64,
}

/// One engine.
pub struct SimEngine {
    /// Whether it runs.
    pub life: Life,
    /// The shard whose group it is in.
    pub shard: usize,
    pub(crate) replica: GroupReplica,
    /// The last log sequence applied.
    pub(crate) applied: u64,
    /// The production lease core.
    pub lease: LeaseCore<SimInstant>,
    pub(crate) request: Option<LeaseRequest>,
    pub(crate) next_request: u64,
    pub(crate) read_sent_ns: Option<u64>,
    /// Per gateway, every report since the engine's start (the retained window: the whole
    /// run; production keeps the last `retain_records`), the first numbered `retained_base + 1`.
    pub(crate) retained: Vec<Vec<CoreOutput>>,
    /// Per gateway, the last report before the engine's start (0, or the snapshot's).
    pub(crate) retained_base: Vec<u64>,
    /// Per gateway, the input of each retained report: a report is held until its input is
    /// durable in the engine's journal (production's reply hold).
    pub(crate) retained_inputs: Vec<Vec<u64>>,
    /// The tier journal on the engine's disk (kept across restarts).
    pub journal: EngineJournal,
    /// The snapshot the journal starts after, on the same disk (`None`: the journal starts at
    /// the log's first input).
    pub(crate) journal_snapshot: Option<EngineSnapshot>,
    /// The input after which it took its last snapshot.
    pub(crate) snapshot_taken: u64,
    /// Its snapshot being put (the object store delays it); none is taken meanwhile, as
    /// production's snapshot thread waits for its put.
    pub(crate) pending_put: Option<EngineSnapshot>,
    /// Per gateway, reports handed to the publisher so far (sent or withheld).
    pub(crate) published: Vec<u64>,
    pub(crate) leading: Option<u64>,
    /// The last regeneration's records, kept for the requests that follow: (gateway, the
    /// first's sequence, the records).
    pub(crate) regenerated: Option<(usize, u64, Vec<CoreOutput>)>,
}

impl SimEngine {
    /// A stopped engine (started by [`World::start_engine`]).
    pub fn new(tier: &TierConfig, ttl: Duration, shard: usize) -> SimEngine {
        SimEngine {
            life: Life::default(),
            shard,
            replica: GroupReplica::starting(tier, None).expect("a replica without a snapshot"),
            applied: 0,
            lease: LeaseCore::new(ttl),
            request: None,
            next_request: 0,
            read_sent_ns: None,
            retained: vec![Vec::new(); tier.outlets as usize],
            retained_base: vec![0; tier.outlets as usize],
            retained_inputs: vec![Vec::new(); tier.outlets as usize],
            journal: EngineJournal::default(),
            journal_snapshot: None,
            snapshot_taken: 0,
            pending_put: None,
            published: vec![0; tier.outlets as usize],
            leading: None,
            regenerated: None,
        }
    }

    /// The epoch it may publish under at true time `now_ns` (`None`: it may not).
    pub fn epoch(&self, now_ns: u64) -> Option<u64> {
        if !self.life.up {
            return None;
        }
        self.lease.epoch(self.life.clock.monotonic(now_ns))
    }

    /// Reports for `gateway` whose inputs the journal acknowledged durable.
    pub(crate) fn releasable(&self, gateway: usize) -> u64 {
        let acked = self.journal.acked;
        let base = self.retained_base[gateway];
        base + self.retained_inputs[gateway].partition_point(|input| *input <= acked) as u64
    }

    /// Up to `count` retained reports for `gateway` from report `first` on (none it does
    /// not hold).
    pub(crate) fn retained_from(&self, gateway: usize, first: u64, count: u64) -> &[CoreOutput] {
        let retained = &self.retained[gateway];
        let Some(start) = first.checked_sub(self.retained_base[gateway] + 1) else { return &[] };
        let start = (start as usize).min(retained.len());
        &retained[start..(start + count as usize).min(retained.len())]
    }

    /// Continues from `snapshot` (the log's inputs after it follow): the replica restored,
    /// each gateway's numbering and window starting where the snapshot's numbering goes on.
    pub(crate) fn restore(&mut self, tier: &TierConfig, snapshot: &EngineSnapshot) {
        self.replica = GroupReplica::starting(tier, Some(snapshot))
            .expect("a snapshot of this tier (the group writes only its own)");
        self.applied = snapshot.stream_seq;
        self.snapshot_taken = snapshot.stream_seq;
        for gateway in 0..self.retained.len() {
            let index =
                delivery::publish::subject_index(gateway as u32, delivery::wire::Stream::Reports);
            let base = self.replica.next_seq(index) - 1;
            self.retained_base[gateway] = base;
            self.published[gateway] = base;
            self.retained[gateway].clear();
            self.retained_inputs[gateway].clear();
        }
    }
}

/// A gateway's session store: its file on a simulated disk (production's record format) and
/// what the gateway knows of it.
#[derive(Debug, Default)]
pub(crate) struct DurableStore {
    /// The store's file.
    pub(crate) disk: SimDisk,
    /// Per client, the session's numbered messages (sequence = index + 1), written to the
    /// store and synced or not: its reports, and `None` for a number a FIX session message
    /// took (its Logon; not kept, as production keeps none: a resend gap-fills it).
    pub(crate) sessions: Vec<Vec<Option<CoreOutput>>>,
    /// Per client, each numbered message's record payload: where it lies in the file, and
    /// a hash of what recovery must read back.
    pub(crate) records: Vec<Vec<StoredPayload>>,
    /// Per client, the messages synced (and so sent): the first `synced` of `sessions`.
    pub(crate) synced: Vec<u64>,
    pub(crate) positions: HashMap<(u32, u32), Position>,
    /// Per shard, where its delivery edge starts again: the first report of the newest durable
    /// input.
    pub(crate) restart_seqs: Vec<u64>,
    /// The file's bytes known synced: what the next batch end claims (production's
    /// `Log::synced_end`).
    pub(crate) synced_end: usize,
}

/// Where a session message's record payload lies in the store's file, and its hash.
#[derive(Clone, Copy, Debug)]
pub(crate) struct StoredPayload {
    pub(crate) at: usize,
    pub(crate) len: usize,
    pub(crate) hash: u64,
    /// Whether a message took the number (`false`: a number skipped past damaged records,
    /// its record, if any, the reservation that skipped it).
    pub(crate) sent: bool,
}

/// A store write not yet synced: one batch (one shard's reports, or a Logon's number).
#[derive(Debug)]
pub(crate) struct StoreWrite {
    pub(crate) epoch: u64,
    /// The messages it numbered: (client, sequence).
    pub(crate) numbered: Vec<(usize, u64)>,
    /// The routed-position records (the production encoding).
    pub(crate) positions: Vec<u8>,
    /// The shards whose reports it holds and where their delivery edges start again.
    pub(crate) restarts: Vec<(usize, u64)>,
    /// Its sync, in flight.
    pub(crate) sync: PendingSync,
    /// The file's end after it.
    pub(crate) end: usize,
}

/// What a gateway numbered and has not written yet: production's pending batch, which a full
/// disk keeps (held) until a write succeeds.
#[derive(Debug, Default)]
pub(crate) struct Unwritten {
    /// The records.
    pub(crate) bytes: Vec<u8>,
    /// The messages they number: (client, sequence).
    pub(crate) numbered: Vec<(usize, u64)>,
    /// The routed-position records among them.
    pub(crate) positions: Vec<u8>,
    /// The shards whose reports they hold and where their delivery edges start again.
    pub(crate) restarts: Vec<(usize, u64)>,
    /// The last write was refused (a full disk).
    pub(crate) refused: bool,
}

/// A gateway's reading of one shard's report subject for it (its in-process delivery edge).
#[derive(Debug, Default)]
pub(crate) struct Feed {
    pub(crate) fence: EpochFence,
    /// The newest epoch this incarnation accepted (the checker's own, not the fence's).
    pub(crate) newest_accepted: u64,
    pub(crate) next_seq: u64,
    pub(crate) retain_sent_ns: Option<u64>,
    /// The input being routed and the stream sequence of its first report.
    pub(crate) input: (u64, u64),
}

impl Feed {
    /// A feed reading from `next_seq` on.
    pub(crate) fn from(next_seq: u64) -> Feed {
        Feed { next_seq, input: (0, next_seq), ..Feed::default() }
    }
}

/// One gateway.
pub struct SimGateway {
    /// Whether it runs.
    pub life: Life,
    /// Per shard, its report feed.
    pub(crate) feeds: Vec<Feed>,
    pub(crate) routed: RoutedPositions,
    pub(crate) durable: DurableStore,
    pub(crate) pending: Vec<StoreWrite>,
    /// Numbered, not written yet (a full disk refused the write).
    pub(crate) unwritten: Unwritten,
    pub(crate) write_epoch: u64,
    /// Per client: the connection its session is on.
    pub(crate) sessions: Vec<Option<u32>>,
    /// Builds the FIX sessions' messages (production's codec).
    pub(crate) fix: gateway::fix::Builder,
    pub(crate) appends: BTreeMap<u64, (InboundOrder, u64)>,
    /// This run's id (its appends' message ids carry it).
    pub(crate) run_id: u64,
    pub(crate) next_counter: u64,
}

impl SimGateway {
    /// A stopped gateway for `clients` clients of `shards` shards.
    pub fn new(clients: usize, shards: usize) -> SimGateway {
        SimGateway {
            life: Life::default(),
            feeds: (0..shards).map(|_| Feed::from(1)).collect(),
            routed: RoutedPositions::default(),
            durable: DurableStore {
                sessions: vec![Vec::new(); clients],
                records: vec![Vec::new(); clients],
                synced: vec![0; clients],
                restart_seqs: vec![1; shards],
                ..DurableStore::default()
            },
            pending: Vec::new(),
            unwritten: Unwritten::default(),
            write_epoch: 0,
            sessions: vec![None; clients],
            fix: gateway::fix::Builder::default(),
            appends: BTreeMap::new(),
            run_id: 0,
            next_counter: 0,
        }
    }
}

/// One client.
pub struct SimClient {
    /// Always up (clients are not faulted); its link's order is kept here.
    pub life: Life,
    /// The gateway its session is on.
    pub gateway: usize,
    pub(crate) conn: Option<u32>,
    /// A FIX session (production's sequence rules: gaps asked for again with a
    /// ResendRequest, answered with resends and gap fills); `false`: a native one (resumes
    /// from its last sequence at login).
    pub fix: bool,
    /// The session's last sequence received and taken (native: its last report's).
    pub last_seq: u64,
    /// FIX: a ResendRequest for the current gap is out (production's flag).
    pub(crate) resend_requested: bool,
    /// The checker's own count: every sequence below it was taken as a report or gap-filled
    /// where the gateway's store numbered no report.
    pub(crate) covered: u64,
    /// Reports received (liveness counts them).
    pub reports: u64,
    /// When the last message on each direction of its connection arrives (TCP order).
    pub up_last_ns: u64,
    /// See `up_last_ns`.
    pub down_last_ns: u64,
    pub(crate) next_order: u64,
    /// Orders sent and not yet answered.
    pub unanswered: Vec<InboundOrder>,
    /// Open orders to cancel or replace: (order id, instrument; its shard's).
    pub(crate) open: Vec<(u64, u32)>,
    pub(crate) fills: FillBook,
}

impl SimClient {
    /// Client `id` of a gateway.
    pub fn new(gateway: usize, fix: bool) -> SimClient {
        SimClient {
            life: Life { up: true, inc: 1, ..Life::default() },
            gateway,
            conn: None,
            fix,
            last_seq: 0,
            resend_requested: false,
            covered: 1,
            reports: 0,
            up_last_ns: 0,
            down_last_ns: 0,
            next_order: 0,
            unanswered: Vec::new(),
            open: Vec::new(),
            fills: FillBook::default(),
        }
    }
}

/// What the FIX sessions' resends did in a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SessionTally {
    /// ResendRequests the gateways answered.
    pub resend_requests: u64,
    /// Reports sent again with PossDupFlag.
    pub resent: u64,
    /// SequenceReset-GapFills sent.
    pub gap_fills: u64,
}
