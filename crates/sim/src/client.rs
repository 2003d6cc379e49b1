//! A client: a session on its gateway (`client % gateways`, where the tier routes its
//! reports) that places, cancels and replaces orders, reconnects after its gateway dies,
//! asks for what it missed and resends the orders nobody answered.

use exchange::msg::{
    CoreOutput, InboundOrder, OrderType, OutputKind, Side, TimeInForce, request_kind,
};

use crate::check::Invariant;
use crate::msg::{Addr, Msg, Timer};
use crate::process::SimClient;
use crate::world::World;

/// How long a client waits before connecting again, ns.
const RECONNECT_NS: u64 = 300_000_000;
/// Instruments the clients trade (few, so orders meet).
const INSTRUMENTS: u64 = 4;
/// Most orders a client keeps open to cancel or replace.
const OPEN_MAX: usize = 16;

impl World {
    /// Drops client `n`'s connection; it connects again later.
    pub fn disconnect(&mut self, n: usize) {
        if self.clients[n].conn.take().is_some() {
            let jitter = self.rng.range(0, RECONNECT_NS);
            self.timer(Addr::Client(n), RECONNECT_NS + jitter, Timer::Connect);
        }
    }

    pub(crate) fn client_timer(&mut self, n: usize, timer: Timer) {
        match timer {
            Timer::Connect => self.connect(n),
            Timer::Send if !self.quiet => {
                if let Some(conn) = self.clients[n].conn {
                    let order = self.next_request(n);
                    self.clients[n].unanswered.push(order);
                    let to = Addr::Gateway(self.clients[n].gateway);
                    self.send_tcp(n, to, conn, Msg::Order { client: n, order });
                }
                let gap = self.rng.exponential_ns(self.settings.order_gap_ns);
                self.timer(Addr::Client(n), gap, Timer::Send);
            }
            _ => {}
        }
    }

    fn connect(&mut self, n: usize) {
        let gateway = self.clients[n].gateway;
        if !self.gateways[gateway].life.up {
            self.timer(Addr::Client(n), RECONNECT_NS, Timer::Connect);
            return;
        }
        let conn = self.gateways[gateway].life.inc;
        let client = &mut self.clients[n];
        client.conn = Some(conn);
        let last_seq = client.last_seq;
        let resend = client.unanswered.clone();
        // A resent replace is a new request to the tier (the session layer has no request id
        // that would make the engine refuse a second copy), so it may fill its quantity again.
        for order in resend.iter().filter(|order| order.kind == request_kind::REPLACE) {
            client.fills.replaced(order.order_id, order.qty);
        }
        let hello = if client.fix {
            client.resend_requested = false;
            Msg::Logon { client: n }
        } else {
            Msg::Hello { client: n, last_seq }
        };
        self.send_tcp(n, Addr::Gateway(gateway), conn, hello);
        for order in resend {
            self.send_tcp(n, Addr::Gateway(gateway), conn, Msg::Order { client: n, order });
        }
    }

    /// A new order (most often), a cancel or a replace of one still open.
    fn next_request(&mut self, n: usize) -> InboundOrder {
        let roll = self.rng.range(0, 100);
        let open = self.clients[n].open.len() as u64;
        let instrument = self.rng.range(0, INSTRUMENTS) as u32;
        let offset = (self.rng.range(0, 21) as i64 - 10) * 5;
        let price_on = |instrument: u32| 100_000 + i64::from(instrument) * 1_000 + offset;
        let price = price_on(instrument);
        let qty = 10 * self.rng.range(1, 10) as u32;
        let side = if self.rng.chance(0.5) { Side::Buy } else { Side::Sell };
        let client = &mut self.clients[n];
        let mut order = InboundOrder {
            kind: request_kind::NEW,
            side: side as u8,
            order_type: OrderType::Limit as u8,
            time_in_force: TimeInForce::Day as u8,
            instrument,
            client: n as u32,
            order_id: 0,
            price,
            qty,
            ..InboundOrder::default()
        };
        if roll < 25 && open > 0 {
            let (target, instrument) = client.open[(roll % open) as usize];
            let replace = roll < 8;
            order.kind = if replace { request_kind::REPLACE } else { request_kind::CANCEL };
            // To the order's instrument: its shard holds it.
            (order.order_id, order.instrument, order.price) =
                (target, instrument, price_on(instrument));
            if replace {
                client.fills.replaced(target, qty);
            } else {
                (order.price, order.qty) = (0, 0);
            }
            return order;
        }
        client.next_order += 1;
        order.order_id = (n as u64) << 32 | client.next_order;
        client.fills.sent(order.order_id, qty);
        order
    }

    pub(crate) fn client_receives(&mut self, n: usize, msg: Msg) {
        let (conn, seq, output) = match msg {
            Msg::Report { conn, seq, output } => (conn, seq, Some(output)),
            Msg::NotKept { conn, seq } => (conn, seq, None),
            Msg::Fix { conn, bytes, output } => return self.fix_receives(n, conn, &bytes, output),
            _ => return,
        };
        let client = &mut self.clients[n];
        if client.conn != Some(conn) || seq <= client.last_seq {
            return;
        }
        if seq > client.last_seq + 1 {
            let detail = format!("client {n} got report {seq} after {}", client.last_seq);
            return self.checker.fail(Invariant::SessionGap, self.now_ns, detail);
        }
        client.last_seq = seq;
        if let Some(output) = output {
            self.take_report(n, seq, output);
        }
    }

    /// Report `seq` of client `n`'s session, taken: its fills, its order's answer, the
    /// reference's check.
    pub(crate) fn take_report(&mut self, n: usize, seq: u64, output: CoreOutput) {
        let client = &mut self.clients[n];
        client.reports += 1;
        if let Err(detail) = client.fills.report(&output) {
            self.checker.fail(Invariant::Overfill, self.now_ns, format!("client {n}: {detail}"));
        }
        self.clients[n].answered(&output);
        self.checker.answered(n, seq, &output, self.now_ns);
    }
}

impl SimClient {
    /// Takes `output` as its order's answer (from its session, or a resync's notice that it
    /// was lost).
    pub(crate) fn answered(&mut self, output: &CoreOutput) {
        self.unanswered.retain(|order| order.order_id != output.order_id);
        match output.kind {
            OutputKind::Accepted | OutputKind::PartiallyFilled
                if !self.open.iter().any(|(id, _)| *id == output.order_id) =>
            {
                if self.open.len() == OPEN_MAX {
                    self.open.remove(0);
                }
                self.open.push((output.order_id, output.instrument));
            }
            OutputKind::Filled | OutputKind::Cancelled | OutputKind::Rejected => {
                self.open.retain(|(id, _)| *id != output.order_id);
            }
            _ => {}
        }
    }
}
