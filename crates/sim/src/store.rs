//! The gateway's session store on a simulated disk: every batch's records in production's
//! format (`gateway::record::encode_record`: a FIX session's message as `FIX_SENT`, a native
//! session's event as `NATIVE_EVENT` in the native codec's frame, a Logon's number as
//! `FIX_NEXT_OUT`, the routed positions as `ROUTED`, after the reports as production's
//! `Log::commit` appends them), ended by production's batch end claiming the store's synced
//! end, written to the page cache and synced 0.2–3 ms later; a message goes out only once
//! its batch is synced. A crash is a power failure (the unsynced writes lost; with
//! `gateway_store_tears`, half the time the write-back torn; with `gateway_store_corruption`,
//! 1–8 bytes flipped among those the durable batch ends claim synced); a restart recovers the
//! store through production's scan and verdict (`gateway::record::scan`,
//! `gateway::record::tail`: damage before the watermark skipped, a torn tail cut) and moves
//! the sessions past skipped damage as production's `Log::reserve_past_damage` does. The
//! invariant `store-keeps-what-it-sent` checks that every message sent is recovered with its
//! bytes, or lay in a damaged range production reported (the session then skips it).

use std::collections::HashMap;

use exchange::msg::CoreOutput;
use gateway::native::{self, Event, ServerMsg};
use gateway::record::{self, Damage, Record, Scanned, Tail, kind};
use gateway::routed;

use crate::check::Invariant;
use crate::msg::{Addr, Timer};
use crate::process::{StoreWrite, StoredPayload, Unwritten};
use crate::world::World;

/// A message's record: (kind, payload parts' bytes).
type Encoded = (u8, Vec<u8>);

/// What a recovery's scan found.
struct Found {
    /// Per client, the session numbers its recovered records carry.
    seqs: Vec<Vec<u64>>,
    /// Messages recovered with other bytes than were written: (client, sequence).
    changed: Vec<(usize, u64)>,
    /// The routed positions recovered.
    positions: HashMap<(u32, u32), routed::Position>,
}

impl World {
    /// Numbers routed `reports`, writes them and the changed positions to the store as one
    /// batch; they go out once it is synced.
    pub(crate) fn write(&mut self, n: usize, shard: usize, reports: Vec<(usize, CoreOutput)>) {
        let mut batch = Vec::new();
        let mut numbered = Vec::with_capacity(reports.len());
        for (client, output) in reports {
            let seq = self.gateways[n].durable.sessions[client].len() as u64 + 1;
            let (kind, payload) = self.session_record(n, client, seq, &output);
            let at = record::encode_record(&mut batch, kind, client as u32, &[&payload]);
            self.number(n, client, Some(output), &payload, at);
            numbered.push((client, seq));
        }
        let restart = Some((shard, self.gateways[n].feeds[shard].input.1));
        self.commit(n, batch, numbered, restart);
    }

    /// A FIX session's Logon takes the next number: a `FIX_NEXT_OUT` record past it, synced
    /// before the Logon goes out (as production holds it).
    pub(crate) fn number_logon(&mut self, n: usize, client: usize) {
        let seq = self.gateways[n].durable.sessions[client].len() as u64 + 1;
        let payload = (seq + 1).to_le_bytes();
        let mut batch = Vec::new();
        let at = record::encode_record(&mut batch, kind::FIX_NEXT_OUT, client as u32, &[&payload]);
        self.number(n, client, None, &payload, at);
        self.commit(n, batch, vec![(client, seq)], None);
    }

    /// Numbers a message whose record payload is `payload`, at `at` in the batch about to
    /// be written at the file's end.
    fn number(
        &mut self,
        n: usize,
        client: usize,
        output: Option<CoreOutput>,
        payload: &[u8],
        at: usize,
    ) {
        let gateway = &mut self.gateways[n];
        let store = &mut gateway.durable;
        // After what a full disk refused: it is written first.
        let at = store.disk.cache.len() + gateway.unwritten.bytes.len() + at;
        store.sessions[client].push(output);
        let stored = StoredPayload { at, len: payload.len(), hash: hash(payload), sent: true };
        store.records[client].push(stored);
    }

    /// Whether `client`'s message `seq` has its record's payload on disk, the bytes numbered
    /// (what a power failure leaves).
    fn durable_record(&self, n: usize, client: usize, seq: u64) -> bool {
        let store = &self.gateways[n].durable;
        let StoredPayload { at, len, hash: numbered, .. } = store.records[client][seq as usize - 1];
        store.disk.durable().get(at..at + len).is_some_and(|payload| hash(payload) == numbered)
    }

    /// The bytes of `client`'s FIX message `seq` as its record holds them.
    pub(crate) fn stored_fix_message(&self, n: usize, client: usize, seq: u64) -> Vec<u8> {
        let store = &self.gateways[n].durable;
        let StoredPayload { at, len, .. } = store.records[client][seq as usize - 1];
        store.disk.cache[at + 8..at + len].to_vec()
    }

    /// Adds `batch` (numbering `numbered`) to what waits to be written and writes it.
    fn commit(
        &mut self,
        n: usize,
        batch: Vec<u8>,
        numbered: Vec<(usize, u64)>,
        restart: Option<(usize, u64)>,
    ) {
        let unwritten = &mut self.gateways[n].unwritten;
        unwritten.bytes.extend_from_slice(&batch);
        unwritten.numbered.extend(numbered);
        unwritten.restarts.extend(restart);
        self.write_unwritten(n);
    }

    /// Production's `Log::commit`: appends the changed routed positions and the batch end to
    /// what waits, writes it and starts its sync. A full disk refuses the write: everything
    /// stays unwritten and held (production cuts off what reached the file and tries again
    /// at its next commit), nothing of it goes out.
    pub(crate) fn write_unwritten(&mut self, n: usize) {
        let now_ns = self.now_ns;
        let gateway = &mut self.gateways[n];
        let epoch = gateway.write_epoch + 1;
        let mut batch = std::mem::take(&mut gateway.unwritten.bytes);
        let positions_at = batch.len();
        gateway.routed.append_changed(&mut batch, epoch);
        gateway.unwritten.positions.extend_from_slice(&batch[positions_at..]);
        let records_end = batch.len();
        // Last in the batch, as production's `Log::commit` writes it, with its claim.
        record::end_batch(&mut batch, gateway.durable.synced_end as u64);
        let disk = &mut gateway.durable.disk;
        if disk.write(disk.cache.len(), &batch, now_ns).is_err() {
            batch.truncate(records_end);
            gateway.unwritten.bytes = batch;
            self.store_writes_refused += 1;
            if !std::mem::replace(&mut gateway.unwritten.refused, true) {
                self.note(format!("gateway {n}'s store: disk full, its batch held"));
            }
            return;
        }
        let sync = disk.begin_sync();
        let end = disk.cache.len();
        gateway.write_epoch = epoch;
        let Unwritten { numbered, positions, restarts, .. } =
            std::mem::take(&mut gateway.unwritten);
        gateway.pending.push(StoreWrite { epoch, numbered, positions, restarts, sync, end });
        let sync_ns = self.rng.range(200_000, 3_000_000);
        self.timer(Addr::Gateway(n), sync_ns, Timer::Synced(epoch));
    }

    /// The store synced every write up to `epoch`: they are durable, and their messages go
    /// out.
    pub(crate) fn synced(&mut self, n: usize, epoch: u64) {
        let gateway = &mut self.gateways[n];
        let done = gateway.pending.iter().take_while(|write| write.epoch <= epoch).count();
        let mut outgoing = Vec::new();
        for write in gateway.pending.drain(..done) {
            gateway.durable.disk.complete_sync(write.sync);
            gateway.durable.synced_end = write.end;
            for (client, seq) in write.numbered {
                gateway.durable.synced[client] = seq;
                if let Some(conn) = gateway.sessions[client] {
                    outgoing.push((client, conn, seq));
                }
            }
            let mut at = 0;
            while at + record::HEADER_BYTES <= write.positions.len() {
                let len =
                    u32::from_le_bytes(write.positions[at..at + 4].try_into().expect("4 bytes"));
                let payload = &write.positions[at + record::HEADER_BYTES..][..len as usize];
                if let Some((key, position)) = routed::decode(payload) {
                    gateway.durable.positions.insert(key, position);
                }
                at += record::HEADER_BYTES + len as usize;
            }
            for (shard, restart_seq) in write.restarts {
                gateway.durable.restart_seqs[shard] = restart_seq;
            }
            gateway.routed.publish_durable(write.epoch);
        }
        for (client, conn, seq) in outgoing {
            if !self.durable_record(n, client, seq) {
                let detail = format!(
                    "gateway {n} sends client {client}'s message {seq} before its record is on disk"
                );
                return self.checker.fail(Invariant::StoreKeepsSent, self.now_ns, detail);
            }
            match self.gateways[n].durable.sessions[client][seq as usize - 1] {
                Some(output) => self.send_report(n, client, conn, seq, output),
                None => self.send_logon(n, client, conn, seq),
            }
        }
    }

    /// A crash: the machine loses power (with `gateway_store_tears`, half the time the
    /// write-back in flight tears).
    pub(crate) fn store_power_loss(&mut self, n: usize) {
        let tear = self.settings.gateway_store_tears && self.rng.chance(0.5);
        // Among the bytes the durable batch ends claim synced (production's watermark), as
        // the engines' `corrupt` flips only what their durable slots prove.
        let proven = match self.settings.gateway_store_corruption {
            true => record::scan(&mut self.gateways[n].durable.disk.durable(), |_| true)
                .map_or(0, |scanned| scanned.watermark),
            false => 0,
        };
        if proven > 0 {
            let offset = self.rng.range(0, proven) as usize;
            self.gateways[n].durable.disk.flip(offset, &mut self.rng);
            self.store_flips += 1;
            self.note(format!("gateway {n}'s store: bytes at {offset} flipped"));
        }
        let gateway = &mut self.gateways[n];
        let in_flight = gateway.pending.drain(..).map(|write| write.sync);
        let rng = tear.then_some(&mut self.rng);
        gateway.durable.disk.power_loss(in_flight.collect::<Vec<_>>(), rng);
    }

    /// Recovers gateway `n`'s store at its start by production's scan: each session keeps the
    /// messages recovered (each checked against what was numbered), the routed positions are
    /// the records', a torn tail is cut off, damaged records before the synced end skipped.
    pub(crate) fn recover_store(&mut self, n: usize) {
        let clients = self.clients.len();
        let store = &mut self.gateways[n].durable;
        let mut found = Found {
            seqs: vec![Vec::new(); clients],
            changed: Vec::new(),
            positions: HashMap::new(),
        };
        let bytes = std::mem::take(&mut store.disk.cache);
        let scanned = record::scan(&mut bytes.as_slice(), |record| {
            let Record { kind, client, payload, .. } = record;
            let client = client as usize;
            let numbered = |seq: u64| {
                (client < clients && seq >= 1)
                    .then(|| store.records[client].get(seq as usize - 1).map(|r| r.hash))
                    .flatten()
            };
            let seq = match kind {
                kind::FIX_SENT | kind::NATIVE_EVENT => session_seq(kind, payload),
                // A Logon's number, or a reservation past damaged records: numbers below it.
                kind::FIX_NEXT_OUT | kind::NATIVE_RESERVED => {
                    payload.try_into().ok().map(u64::from_le_bytes).and_then(|s| s.checked_sub(1))
                }
                kind::ROUTED => {
                    let Some((key, position)) = routed::decode(payload) else { return false };
                    found.positions.insert(key, position);
                    return true;
                }
                _ => None,
            };
            let Some(seq) = seq else { return false };
            if numbered(seq).is_some_and(|numbered| numbered != hash(payload)) {
                found.changed.push((client, seq));
            }
            if let Some(seqs) = found.seqs.get_mut(client) {
                seqs.push(seq);
            }
            true
        });
        store.disk.cache = bytes;
        // Reading a slice never fails (0 would make the whole store a tail: seen at once).
        let scanned = scanned.unwrap_or_default();
        if !self.after_recovery(n, &scanned, found) {
            return;
        }
        if !scanned.marked {
            self.mark_batches(n);
        }
        let skip: u64 = scanned.damaged.iter().map(Damage::records_max).sum();
        if skip > 0 {
            self.reserve_past_damage(n, skip);
        }
    }

    /// A store without a batch marker (a new one) gets one, synced, before its first batch,
    /// as production's `Log::open` writes it: from then on a torn batch is dropped whole.
    fn mark_batches(&mut self, n: usize) {
        let mut marker = Vec::new();
        let store = &mut self.gateways[n].durable;
        record::end_batch(&mut marker, store.synced_end as u64);
        store.disk.write_reserved(store.disk.cache.len(), &marker);
        store.disk.sync_all();
        store.synced_end = store.disk.cache.len();
    }

    /// Production's `Log::reserve_past_damage`: every session of the gateway (production: of
    /// every credential) goes on `skip` numbers past its last (the most the skipped records
    /// can have carried), in one reservation record each (`NATIVE_RESERVED`, `FIX_NEXT_OUT`),
    /// synced.
    fn reserve_past_damage(&mut self, n: usize, skip: u64) {
        let mut batch = Vec::new();
        let store = &mut self.gateways[n].durable;
        let base = store.disk.cache.len();
        for client in 0..self.clients.len() {
            if self.clients[client].gateway != n {
                continue;
            }
            let next = store.sessions[client].len() as u64 + skip + 1;
            let kind =
                if self.clients[client].fix { kind::FIX_NEXT_OUT } else { kind::NATIVE_RESERVED };
            let payload = next.to_le_bytes();
            let at = base + record::encode_record(&mut batch, kind, client as u32, &[&payload]);
            let reserved =
                StoredPayload { at, len: payload.len(), hash: hash(&payload), sent: false };
            store.sessions[client].resize(next as usize - 1, None);
            store.records[client].resize(next as usize - 1, reserved);
            store.synced[client] = next - 1;
        }
        record::end_batch(&mut batch, store.synced_end as u64);
        store.disk.write_reserved(base, &batch);
        store.disk.sync_all();
        store.synced_end = store.disk.cache.len();
        self.note(format!(
            "gateway {n}'s store: every session numbered {skip} past damaged records"
        ));
    }

    /// Applies production's verdict on what recovery read, then checks it against what was
    /// sent: `false` when the store refused to open (a violation recorded).
    fn after_recovery(&mut self, n: usize, scanned: &Scanned, found: Found) -> bool {
        let store = &mut self.gateways[n].durable;
        let (end, size) = (scanned.end, store.disk.cache.len() as u64);
        match record::tail(scanned, size) {
            Tail::Clean => {}
            Tail::Torn(bytes) => {
                store.disk.zero_from(end as usize);
                self.note(format!("gateway {n}'s store: a torn tail of {bytes} bytes cut off"));
            }
            Tail::Damaged(bytes) => {
                let detail =
                    format!("gateway {n}'s store refuses to open: {bytes} bytes after {end}");
                self.checker.fail(Invariant::StoreKeepsSent, self.now_ns, detail);
                return false;
            }
            Tail::Durable { offset, why } => {
                let detail = format!("gateway {n}'s store refuses to open: {why} at {offset}");
                self.checker.fail(Invariant::StoreKeepsSent, self.now_ns, detail);
                return false;
            }
        }
        let store = &mut self.gateways[n].durable;
        // Production syncs what it recovered before a batch end claims it.
        store.synced_end = store.disk.cache.len();
        store.positions = found.positions;
        if let Some((client, seq)) = found.changed.first() {
            let detail = format!(
                "gateway {n} recovered client {client}'s message {seq} with other bytes than it wrote"
            );
            self.checker.fail(Invariant::StoreKeepsSent, self.now_ns, detail);
        }
        for damage in &scanned.damaged {
            let (from, to) = (damage.from, damage.to);
            self.note(format!("gateway {n}'s store: damaged records {from}..{to} skipped"));
        }
        for (client, seqs) in found.seqs.into_iter().enumerate() {
            self.recovered_session(n, client, seqs, &scanned.damaged);
        }
        true
    }

    /// Client `client`'s session after recovery found its messages `seqs`: a sent message
    /// not among them must lie in a damaged range production skipped (reported: the session
    /// no longer holds it, and the client skips it if it has not taken it), else it is lost
    /// without a word; the session goes on after its last recovered number.
    fn recovered_session(
        &mut self,
        n: usize,
        client: usize,
        mut seqs: Vec<u64>,
        damaged: &[Damage],
    ) {
        seqs.sort_unstable();
        let store = &mut self.gateways[n].durable;
        let last = seqs.last().copied().unwrap_or(0);
        let sent = store.synced[client];
        let mut silent = None;
        let mut reported = Vec::new();
        for seq in 1..=store.synced[client] {
            let stored = store.records[client][seq as usize - 1];
            if !stored.sent || seqs.binary_search(&seq).is_ok() {
                continue;
            }
            let record_at = (stored.at - record::HEADER_BYTES) as u64;
            match damaged.iter().any(|d| (d.from..d.to).contains(&record_at)) {
                true => {
                    // Lost and reported once: a later recovery skips the damage again.
                    store.records[client][seq as usize - 1].sent = false;
                    reported.push(seq);
                }
                false => silent = silent.or(Some(seq)),
            }
        }
        let session = &mut store.sessions[client];
        let lost: Vec<_> = reported
            .iter()
            .filter_map(|&seq| session[seq as usize - 1].take().map(|output| (seq, output)))
            .collect();
        let unsent = last.saturating_sub(sent);
        store.sessions[client].truncate(last as usize);
        store.records[client].truncate(last as usize);
        store.synced[client] = last;
        if unsent > 0 {
            let what = format!("{unsent} messages of client {client} recovered that it never sent");
            self.note(format!("gateway {n}'s store: {what}"));
        }
        self.store_lost += reported.len() as u64;
        for (seq, output) in lost {
            if self.clients[client].last_seq < seq {
                self.checker.store_lost(client, output);
            }
        }
        if let Some(first) = silent {
            let detail = format!(
                "gateway {n}'s store lost client {client}'s messages {first}..={sent}, sent before the restart"
            );
            self.checker.fail(Invariant::StoreKeepsSent, self.now_ns, detail);
        }
    }

    /// A session message's record: a FIX session's message as production's `FIX_SENT`
    /// (`[MsgSeqNum][the message]`), a native session's event in its frame.
    fn session_record(
        &mut self,
        n: usize,
        client: usize,
        seq: u64,
        output: &CoreOutput,
    ) -> Encoded {
        if self.clients[client].fix {
            let mut payload = seq.to_le_bytes().to_vec();
            payload.extend_from_slice(&self.fix_report(n, client, seq, false, output));
            return (kind::FIX_SENT, payload);
        }
        let event = Event {
            kind: output.kind as u8,
            reason: output.reason as u8,
            side: output.side as u8,
            instrument: output.instrument,
            token: output.order_id as u32,
            price: output.price,
            qty: output.qty,
            leaves_qty: output.leaves_qty,
        };
        let mut frame = Vec::with_capacity(native::FRAME_BYTES_MAX);
        native::encode_server(&ServerMsg::Sequenced { seq, event }, &mut frame);
        (kind::NATIVE_EVENT, frame)
    }
}

/// The session sequence a `FIX_SENT` or `NATIVE_EVENT` payload carries (`None`: it does not
/// decode, and recovery stops there as production's does).
fn session_seq(kind: u8, payload: &[u8]) -> Option<u64> {
    if kind == kind::FIX_SENT {
        return payload.get(..8).map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")));
    }
    let (version, kind, body, _) = native::split_frame(payload).ok().flatten()?;
    match native::decode_server(version, kind, body).ok()? {
        ServerMsg::Sequenced { seq, .. } => Some(seq),
        _ => None,
    }
}

/// FNV-1a of `bytes`: what a record's payload must read back as.
fn hash(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3)
    })
}
