//! The gateway's session store on a simulated disk: every batch's records in production's
//! format (`gateway::record::encode_record`: a FIX session's message as `FIX_SENT`, a native
//! session's event as `NATIVE_EVENT` in the native codec's frame, a Logon's number as
//! `FIX_NEXT_OUT`, the routed positions as `ROUTED`, after the reports as production's
//! `Log::commit` appends them) written to the page cache and synced 0.2–3 ms later; a
//! message goes out only once its batch is synced. A crash is a power failure (the unsynced
//! writes lost; with `gateway_store_tears`, half the time the write-back torn); a restart recovers the store through
//! production's scan (`gateway::record::scan`, `gateway::record::tail`), and the invariant
//! `store-keeps-what-it-sent` checks that every message sent is recovered with its bytes.

use exchange::msg::CoreOutput;
use gateway::native::{self, Event, ServerMsg};
use gateway::record::{self, Record, Tail, kind};
use gateway::routed;

use crate::check::Invariant;
use crate::msg::{Addr, Timer};
use crate::process::{StoreWrite, StoredPayload};
use crate::world::World;

/// A message's record: (kind, payload parts' bytes).
type Encoded = (u8, Vec<u8>);

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
        let store = &mut self.gateways[n].durable;
        let at = store.disk.cache.len() + at;
        store.sessions[client].push(output);
        store.records[client].push(StoredPayload { at, len: payload.len(), hash: hash(payload) });
    }

    /// The bytes of `client`'s FIX message `seq` as its record holds them.
    pub(crate) fn stored_fix_message(&self, n: usize, client: usize, seq: u64) -> Vec<u8> {
        let store = &self.gateways[n].durable;
        let StoredPayload { at, len, .. } = store.records[client][seq as usize - 1];
        store.disk.cache[at + 8..at + len].to_vec()
    }

    /// Appends the changed routed positions to `batch`, writes it and starts its sync.
    fn commit(
        &mut self,
        n: usize,
        mut batch: Vec<u8>,
        numbered: Vec<(usize, u64)>,
        restart: Option<(usize, u64)>,
    ) {
        let gateway = &mut self.gateways[n];
        gateway.write_epoch += 1;
        let epoch = gateway.write_epoch;
        let positions_at = batch.len();
        gateway.routed.append_changed(&mut batch, epoch);
        let positions = batch[positions_at..].to_vec();
        // Last in the batch, as production's `Log::commit` writes it.
        record::end_batch(&mut batch);
        let disk = &mut gateway.durable.disk;
        // No disk-full fault targets a gateway (its store's space is not simulated).
        disk.write_reserved(disk.cache.len(), &batch);
        let sync = disk.begin_sync();
        gateway.pending.push(StoreWrite { epoch, numbered, positions, restart, sync });
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
            if let Some((shard, restart_seq)) = write.restart {
                gateway.durable.restart_seqs[shard] = restart_seq;
            }
            gateway.routed.publish_durable(write.epoch);
        }
        for (client, conn, seq) in outgoing {
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
        let durable_bytes = self.gateways[n].durable.disk.durable_len();
        if self.settings.gateway_store_corruption && durable_bytes > 0 {
            let offset = self.rng.range(0, durable_bytes as u64) as usize;
            self.gateways[n].durable.disk.flip(offset, &mut self.rng);
            self.note(format!("gateway {n}'s store: bytes at {offset} flipped"));
        }
        let gateway = &mut self.gateways[n];
        let in_flight = gateway.pending.drain(..).map(|write| write.sync);
        let rng = tear.then_some(&mut self.rng);
        gateway.durable.disk.power_loss(in_flight.collect::<Vec<_>>(), rng);
    }

    /// Recovers gateway `n`'s store at its start by production's scan: each session keeps the
    /// messages recovered (each checked against what was numbered), the routed positions are
    /// the records', a torn tail is cut off.
    pub(crate) fn recover_store(&mut self, n: usize) {
        let clients = self.clients.len();
        let store = &mut self.gateways[n].durable;
        let mut recovered = vec![0u64; clients];
        let mut changed = Vec::new();
        let mut positions = std::collections::HashMap::new();
        let bytes = std::mem::take(&mut store.disk.cache);
        let end = record::scan(&mut bytes.as_slice(), |record| {
            let Record { kind, client, payload, .. } = record;
            let client = client as usize;
            let numbered = |seq: u64| {
                (client < clients && seq >= 1)
                    .then(|| store.records[client].get(seq as usize - 1).map(|r| r.hash))
                    .flatten()
            };
            let seq = match kind {
                kind::FIX_SENT | kind::NATIVE_EVENT => session_seq(kind, payload),
                kind::FIX_NEXT_OUT => {
                    payload.try_into().ok().map(u64::from_le_bytes).map(|s| s - 1)
                }
                kind::ROUTED => {
                    let Some((key, position)) = routed::decode(payload) else { return false };
                    positions.insert(key, position);
                    return true;
                }
                _ => None,
            };
            let Some(seq) = seq else { return false };
            if numbered(seq).is_some_and(|numbered| numbered != hash(payload)) {
                changed.push((client, seq));
            }
            if let Some(last) = recovered.get_mut(client) {
                *last = (*last).max(seq);
            }
            true
        });
        store.disk.cache = bytes;
        // Reading a slice never fails (0 would make the whole store a tail: seen at once).
        let scanned = end.unwrap_or(record::Scanned { end: 0, marked: false });
        self.after_recovery(n, scanned.end, recovered, changed, positions);
        if !scanned.marked {
            self.mark_batches(n);
        }
    }

    /// A store without a batch marker (a new one) gets one, synced, before its first batch,
    /// as production's `Log::open` writes it: from then on a torn batch is dropped whole.
    fn mark_batches(&mut self, n: usize) {
        let mut marker = Vec::new();
        record::end_batch(&mut marker);
        let disk = &mut self.gateways[n].durable.disk;
        disk.write_reserved(disk.cache.len(), &marker);
        disk.sync_all();
    }

    fn after_recovery(
        &mut self,
        n: usize,
        end: u64,
        recovered: Vec<u64>,
        changed: Vec<(usize, u64)>,
        positions: std::collections::HashMap<(u32, u32), routed::Position>,
    ) {
        let store = &mut self.gateways[n].durable;
        let size = store.disk.cache.len() as u64;
        match record::tail(end, size) {
            Tail::Clean => {}
            Tail::Torn(bytes) => {
                store.disk.zero_from(end as usize);
                self.note(format!("gateway {n}'s store: a torn tail of {bytes} bytes cut off"));
            }
            Tail::Damaged(bytes) => {
                let detail =
                    format!("gateway {n}'s store refuses to open: {bytes} bytes after {end}");
                return self.checker.fail(Invariant::StoreKeepsSent, self.now_ns, detail);
            }
        }
        let store = &mut self.gateways[n].durable;
        store.positions = positions;
        let mut lost = None;
        let mut unsent = 0;
        for (client, last) in recovered.into_iter().enumerate() {
            if last < store.synced[client] {
                lost.get_or_insert((client, last + 1, store.synced[client]));
            }
            unsent += last.saturating_sub(store.synced[client]);
            store.sessions[client].truncate(last as usize);
            store.records[client].truncate(last as usize);
            store.synced[client] = last;
        }
        if unsent > 0 {
            self.note(format!(
                "gateway {n}'s store: {unsent} messages recovered that it never sent"
            ));
        }
        if let Some((client, seq)) = changed.first() {
            let detail = format!(
                "gateway {n} recovered client {client}'s message {seq} with other bytes than it wrote"
            );
            return self.checker.fail(Invariant::StoreKeepsSent, self.now_ns, detail);
        }
        if let Some((client, first, last)) = lost {
            let detail = format!(
                "gateway {n}'s store lost client {client}'s messages {first}..={last}, sent before the restart"
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
