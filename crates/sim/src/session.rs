//! The session layers: a native session resumes from its last sequence at login
//! (`gateway::sequence::native_replay_from`); a FIX session numbers its Logon too, takes
//! messages by production's MsgSeqNum rule (`gateway::sequence::fix_inbound`), asks for a gap
//! again with a ResendRequest, and the gateway answers it by production's plan
//! (`gateway::sequence::resend_plan`: stored reports again with PossDupFlag, everything else
//! gap-filled). FIX messages travel in production's encoding (`gateway::fix::Builder`, read
//! back with `gateway::fix::Message::parse`).

use exchange::msg::CoreOutput;
use gateway::fix::{self, Builder, Message, tag};
use gateway::sequence::{self, Inbound, ResendStep};

use crate::check::Invariant;
use crate::msg::{Addr, Msg};
use crate::world::World;

/// The gateway's CompID in its FIX messages.
const GATEWAY_COMP_ID: &[u8] = b"LEANTIER";
/// ExecType (150) of a report: its kind's code (the simulated codec's choice, checked back).
const EXEC_KIND: u32 = 150;
/// LeavesQty (151).
const LEAVES_QTY: u32 = 151;
/// GapFillFlag (123).
const GAP_FILL_FLAG: u32 = 123;

impl World {
    /// A native login: the session's reports replayed from the client's next on (those
    /// synced: what the store holds for sure).
    pub(crate) fn native_login(&mut self, n: usize, conn: u32, client: usize, last_seq: u64) {
        let gateway = &mut self.gateways[n];
        gateway.sessions[client] = Some(conn);
        let store = &gateway.durable;
        let next_seq = store.synced[client] + 1;
        // The simulated store keeps a session's whole history (first kept: 1).
        let Ok(from) = sequence::native_replay_from(last_seq + 1, next_seq, 1) else { return };
        let replay: Vec<(u64, Option<CoreOutput>)> =
            (from..next_seq).map(|seq| (seq, store.sessions[client][seq as usize - 1])).collect();
        for (seq, output) in replay {
            let msg = match output {
                Some(output) => Msg::Report { conn, seq, output },
                None => Msg::NotKept { conn, seq },
            };
            self.send_tcp(client, Addr::Client(client), 0, msg);
        }
    }

    /// A FIX Logon: the gateway's Logon takes the session's next number (in the store; it
    /// goes out once synced), the client asks for any gap before it.
    pub(crate) fn fix_logon(&mut self, n: usize, conn: u32, client: usize) {
        self.gateways[n].sessions[client] = Some(conn);
        self.number_logon(n, client);
    }

    /// Sends the Logon numbered `seq`, its number synced.
    pub(crate) fn send_logon(&mut self, n: usize, client: usize, conn: u32, seq: u64) {
        let bytes = self.fix_message(n, client, b"A", seq, false, |b| {
            b.int(tag::ENCRYPT_METHOD, 0).int(tag::HEART_BT_INT, 30);
        });
        self.send_tcp(client, Addr::Client(client), 0, Msg::Fix { conn, bytes, output: None });
    }

    /// Answers a FIX ResendRequest from `begin` on by production's plan over the stored
    /// messages.
    pub(crate) fn fix_resend(&mut self, n: usize, conn: u32, client: usize, begin: u64) {
        let store = &self.gateways[n].durable;
        let (session, end) = (&store.sessions[client], store.synced[client]);
        let begin = begin.max(1);
        let stored = (begin..=end).filter(|seq| session[*seq as usize - 1].is_some());
        let mut steps = Vec::new();
        self.sessions.resend_requests += 1;
        sequence::resend_plan(begin, end, stored.map(|seq| (seq, false)), |step| steps.push(step));
        for step in steps {
            let (bytes, output) = match step {
                ResendStep::GapFill { from, to } => {
                    self.sessions.gap_fills += 1;
                    let bytes = self.fix_message(n, client, b"4", from, true, |b| {
                        b.field(GAP_FILL_FLAG, b"Y").int(tag::NEW_SEQ_NO, to as i64);
                    });
                    (bytes, None)
                }
                ResendStep::Resend { seq, .. } => {
                    self.sessions.resent += 1;
                    let output = self.gateways[n].durable.sessions[client][seq as usize - 1];
                    let output = output.expect("the plan resends stored reports only");
                    (self.fix_report(n, client, seq, true, &output), Some(output))
                }
            };
            self.send_tcp(client, Addr::Client(client), 0, Msg::Fix { conn, bytes, output });
        }
    }

    /// Sends report `seq` of `client`'s session, synced just now, on `conn` (a FIX session's
    /// as its record holds it).
    pub(crate) fn send_report(
        &mut self,
        n: usize,
        client: usize,
        conn: u32,
        seq: u64,
        output: CoreOutput,
    ) {
        let msg = if self.clients[client].fix {
            let bytes = self.stored_fix_message(n, client, seq);
            Msg::Fix { conn, bytes, output: Some(output) }
        } else {
            Msg::Report { conn, seq, output }
        };
        self.send_tcp(client, Addr::Client(client), 0, msg);
    }

    pub(crate) fn fix_report(
        &mut self,
        n: usize,
        client: usize,
        seq: u64,
        poss_dup: bool,
        output: &CoreOutput,
    ) -> Vec<u8> {
        self.fix_message(n, client, b"8", seq, poss_dup, |b| {
            b.int(tag::ORDER_ID, output.order_id as i64)
                .int(EXEC_KIND, output.kind as i64)
                .int(tag::LAST_PX, output.price)
                .int(tag::LAST_QTY, i64::from(output.qty))
                .int(LEAVES_QTY, i64::from(output.leaves_qty));
        })
    }

    /// One FIX message of gateway `n` to `client`, numbered `seq`, in production's encoding.
    fn fix_message(
        &mut self,
        n: usize,
        client: usize,
        msg_type: &[u8],
        seq: u64,
        poss_dup: bool,
        body: impl FnOnce(&mut Builder),
    ) -> Vec<u8> {
        let gateway = &mut self.gateways[n];
        let sent = fix::utc_timestamp(gateway.life.clock.wall(self.now_ns));
        let target = format!("C{client}");
        let builder = &mut gateway.fix;
        builder
            .begin(msg_type, GATEWAY_COMP_ID, target.as_bytes(), seq)
            .field(tag::SENDING_TIME, &sent);
        if poss_dup {
            builder.field(tag::POSS_DUP_FLAG, b"Y");
        }
        body(builder);
        builder.finish().to_vec()
    }

    /// A FIX client receives `bytes` (carrying `output` when a report): production's rule
    /// decides, the checker follows every number taken.
    pub(crate) fn fix_receives(
        &mut self,
        n: usize,
        conn: u32,
        bytes: &[u8],
        output: Option<CoreOutput>,
    ) {
        if self.clients[n].conn != Some(conn) {
            return;
        }
        let Ok(message) = Message::parse(bytes) else {
            let detail = format!("client {n} got a FIX message its codec refuses");
            return self.checker.fail(Invariant::SessionGap, self.now_ns, detail);
        };
        let seq = message.get(tag::MSG_SEQ_NUM).and_then(fix::parse_u64).unwrap_or(0);
        let poss_dup = message.get(tag::POSS_DUP_FLAG) == Some(b"Y");
        let client = &self.clients[n];
        let next_in = client.last_seq + 1;
        match sequence::fix_inbound(next_in, seq, poss_dup, client.resend_requested) {
            Inbound::DropDuplicate => return,
            Inbound::TooLow => {
                let detail =
                    format!("client {n} got {seq} again without PossDup, expecting {next_in}");
                return self.checker.fail(Invariant::SessionGap, self.now_ns, detail);
            }
            Inbound::Gap(ask_from) => {
                if let Some(begin) = ask_from {
                    let to = Addr::Gateway(client.gateway);
                    self.clients[n].resend_requested = true;
                    self.send_tcp(n, to, conn, Msg::ResendRequest { client: n, begin });
                }
                return;
            }
            Inbound::Take => {}
        }
        let client = &mut self.clients[n];
        client.resend_requested = false;
        client.last_seq = seq;
        if seq != client.covered {
            let covered = client.covered - 1;
            let detail = format!("client {n} took {seq}; its session holds up to {covered}");
            return self.checker.fail(Invariant::SessionGap, self.now_ns, detail);
        }
        client.covered = seq + 1;
        match message.msg_type() {
            b"4" => self.gap_filled(n, seq, &message),
            b"8" => match output {
                Some(output) if carries(&message, &output) => self.take_report(n, seq, output),
                _ => {
                    let detail =
                        format!("client {n}'s report {seq} does not carry its report's fields");
                    self.checker.fail(Invariant::SessionGap, self.now_ns, detail);
                }
            },
            _ => {}
        }
    }

    /// A gap fill taken at `seq`: the numbers up to its NewSeqNo must hold no report in the
    /// gateway's store (a gap fill over a report loses it from the session).
    fn gap_filled(&mut self, n: usize, seq: u64, message: &Message) {
        let new_seq = message.get(tag::NEW_SEQ_NO).and_then(fix::parse_u64).unwrap_or(0);
        let client = &mut self.clients[n];
        let Some(next_in) = sequence::fix_sequence_reset(seq + 1, new_seq) else { return };
        client.last_seq = next_in - 1;
        client.covered = next_in;
        let session = &self.gateways[client.gateway].durable.sessions[n];
        let filled =
            (seq..next_in).find(|at| session.get(*at as usize - 1).is_some_and(Option::is_some));
        if let Some(report) = filled {
            let detail = format!("client {n}: a gap fill {seq}..{next_in} over report {report}");
            self.checker.fail(Invariant::SessionGap, self.now_ns, detail);
        }
    }
}

/// Whether a FIX report's fields are `output`'s.
fn carries(message: &Message, output: &CoreOutput) -> bool {
    let int = |t: u32| message.get(t).and_then(fix::parse_whole);
    int(tag::ORDER_ID) == Some(output.order_id as i64)
        && int(EXEC_KIND) == Some(output.kind as i64)
        && int(tag::LAST_PX) == Some(output.price)
        && int(tag::LAST_QTY) == Some(i64::from(output.qty))
        && int(LEAVES_QTY) == Some(i64::from(output.leaves_qty))
}
