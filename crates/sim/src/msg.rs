//! What travels between the simulated processes, their timers and the events of the queue.

use exchange::msg::{CoreOutput, InboundOrder};
use replication::lease::{CasOutcome, ReleaseTarget};

/// Who a message or timer is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Addr {
    /// The broker (its stream leader).
    Broker,
    /// Engine `n`.
    Engine(usize),
    /// Gateway `n`.
    Gateway(usize),
    /// Client `n`.
    Client(usize),
}

impl Addr {
    /// A number per address, for the trace hash.
    pub fn code(self) -> u64 {
        match self {
            Addr::Broker => 0,
            Addr::Engine(n) => 1 << 16 | n as u64,
            Addr::Gateway(n) => 2 << 16 | n as u64,
            Addr::Client(n) => 3 << 16 | n as u64,
        }
    }
}

/// A batch of reports (or a heartbeat: no outputs) from an engine to a gateway.
#[derive(Clone, Debug)]
pub struct Batch {
    /// The shard whose group published it.
    pub shard: usize,
    /// The publishing leadership's epoch.
    pub epoch: u64,
    /// The sequence of `outputs[0]` (the next one, for a heartbeat).
    pub first_seq: u64,
    /// The publisher's last sequence so far.
    pub last_seq: u64,
    /// The reports.
    pub outputs: Vec<CoreOutput>,
    /// An answer to the retain request from this sequence: reports from there to its first
    /// are gone for good (the gateway resyncs them, as production's `recover` does for the
    /// reply to its own request; a late reply to an older request says nothing of them).
    pub reply: Option<u64>,
}

/// What travels between processes (each variant's line says what its fields are).
#[allow(missing_docs)]
#[derive(Clone, Debug)]
pub enum Msg {
    /// Client → gateway: a session starts (again), having received up to `last_seq`.
    Hello { client: usize, last_seq: u64 },
    /// Client → gateway: a FIX session's Logon.
    Logon { client: usize },
    /// Client → gateway: a FIX ResendRequest from `begin` on (EndSeqNo 0: all).
    ResendRequest { client: usize, begin: u64 },
    /// Gateway → FIX client: a message in production's encoding on connection `conn`, with
    /// the report it carries (the checker compares them).
    Fix { conn: u32, bytes: Vec<u8>, output: Option<CoreOutput> },
    /// Client → gateway: a request.
    Order { client: usize, order: InboundOrder },
    /// Gateway → client: the session's report `seq`, on connection `conn`.
    Report { conn: u32, seq: u64, output: CoreOutput },
    /// Gateway → native client: number `seq` of its session holds no report the store kept
    /// (production's `NOT_KEPT` reject: a number skipped past damaged records, or the lost
    /// record's).
    NotKept { conn: u32, seq: u64 },
    /// Gateway → broker: append with de-duplication by (gateway, run, counter).
    /// (`run`: the gateway's incarnation, which the acknowledgement goes to; `run_id`: its
    /// run's id, drawn by production's `gateway::new_run_id`.)
    Append {
        shard: usize,
        gateway: usize,
        run: u32,
        run_id: u64,
        counter: u64,
        order: InboundOrder,
    },
    /// Broker → gateway: appended.
    AppendAck { counter: u64 },
    /// Engine → broker: the inputs from `from` on.
    Read { shard: usize, engine: usize, from: u64 },
    /// Broker → engine: inputs from `from` on.
    Records { from: u64, orders: Vec<InboundOrder> },
    /// Engine → broker: a lease write expecting `expected`.
    Cas { shard: usize, engine: usize, request: u64, expected: u64 },
    /// Broker → engine: the write's outcome.
    CasReply { request: u64, outcome: CasOutcome },
    /// Engine → broker: a lease release.
    Release { shard: usize, target: ReleaseTarget },
    /// Engine → gateway: reports or a heartbeat.
    Batch(Box<Batch>),
    /// Gateway → every engine: the leader's retained reports from `from` on.
    Retain { shard: usize, gateway: usize, from: u64 },
}

/// A process's own timers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Timer {
    /// Engine: keep or contend for the lease.
    Lease,
    /// Engine: read the log.
    Poll,
    /// Engine: a leader's heartbeat.
    Heartbeat,
    /// Engine: its journal's sync `id` completed.
    JournalSynced(u64),
    /// Engine: its snapshot's put (delayed by the object store) completes.
    SnapshotPut,
    /// Gateway: resend unacknowledged appends, retry a retain request.
    Retry,
    /// Gateway: the store's write `epoch` is synced.
    Synced(u64),
    /// Client: connect (again).
    Connect,
    /// Client: send the next order.
    Send,
}

/// Something that happens at a time (each variant's line says what its fields are).
#[allow(missing_docs)]
#[derive(Clone, Debug)]
pub enum Event {
    /// A message arrives (`conn`: the receiver's incarnation it was meant for, 0: any).
    Deliver { to: Addr, conn: u32, msg: Msg },
    /// A timer of the process's incarnation `inc` fires.
    Timer { to: Addr, inc: u32, timer: Timer },
    /// Fault `n` of the schedule starts.
    FaultStarts(usize),
    /// Fault `n` of the schedule ends.
    FaultEnds(usize),
    /// Faults are over and clients stop sending new orders.
    Quiet,
    /// A process whose start failed starts again (its supervisor's restart), if it is down.
    Start(Addr),
}
