//! `configs/` runs as is: `exchange serve --config configs/serve.toml` (over a copy, so the
//! store lands in a temporary folder) lists the instruments file's symbols, and a FIX client
//! trades in its terms — `55=ACME 44=101.25 38=100` — and gets its ExecutionReports in the
//! same terms; a price or quantity off the instrument's grid is refused by the reason's name,
//! and `exchange client --instruments` takes and prints symbols and decimals.

#[path = "common/fix_client.rs"]
mod fix_client;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use fix_client::{FixClient, get};
use gateway::fix::tag;

const LEANTIER: &str = env!("CARGO_BIN_EXE_leantier");

/// The server, killed when dropped.
struct Served {
    child: Child,
    native: SocketAddr,
    fix: SocketAddr,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `configs/` copied into `dir`, served with listeners on free ports (flags override).
fn serve_configs(dir: &Path) -> Served {
    let configs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs");
    let copy = dir.join("configs");
    std::fs::create_dir_all(&copy).unwrap();
    for entry in std::fs::read_dir(&configs).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, copy.join(path.file_name().unwrap())).unwrap();
    }
    let config = copy.join("serve.toml");
    let args = ["exchange", "serve", "--config", config.to_str().unwrap()];
    let mut child = Command::new(LEANTIER)
        .args(args)
        .args(["--listen", "127.0.0.1:0", "--fix-listen", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines().map_while(Result::ok);
    let mut after = |prefix: &str| -> SocketAddr {
        let line = lines.by_ref().find(|l| l.starts_with(prefix)).expect("the server starts");
        line[prefix.len()..].trim().parse().unwrap()
    };
    let (native, fix) = (after("native listening on "), after("FIX 4.4 listening on "));
    std::thread::spawn(move || lines.for_each(drop));
    Served { child, native, fix }
}

fn order<'a>(
    cl_ord_id: &'a str,
    side: &'a str,
    symbol: &'a str,
    qty: &'a str,
    price: &'a str,
) -> Vec<(u32, &'a str)> {
    vec![
        (tag::CL_ORD_ID, cl_ord_id),
        (tag::SYMBOL, symbol),
        (tag::SIDE, side),
        (tag::TRANSACT_TIME, "20260101-00:00:00.000"),
        (tag::ORDER_QTY, qty),
        (tag::ORD_TYPE, "2"),
        (tag::PRICE, price),
    ]
}

#[test]
fn the_shipped_configuration_trades_symbols_and_decimal_prices() {
    let dir = tempfile::tempdir().unwrap();
    let served = serve_configs(dir.path());
    let mut buyer = FixClient::connect(served.fix, "BROKER1", 1);
    buyer.logon("demo-secret-2");
    buyer.send("D", &order("b1", "1", "ACME", "100", "101.25"));
    let accepted = buyer.recv();
    let terms =
        [tag::EXEC_TYPE, tag::SYMBOL, tag::PRICE, tag::ORDER_QTY].map(|t| get(&accepted, t));
    assert_eq!(terms, ["0", "ACME", "101.25", "100"], "{accepted:?}");

    let mut seller = FixClient::connect(served.fix, "BROKER2", 1);
    seller.logon("demo-secret-3");
    seller.send("D", &order("s1", "2", "ACME", "40", "101.25"));
    assert_eq!(get(&seller.recv(), tag::EXEC_TYPE), "0");
    let sold = seller.recv();
    let fill = [tag::EXEC_TYPE, tag::LAST_PX, tag::LAST_QTY, tag::AVG_PX].map(|t| get(&sold, t));
    assert_eq!(fill, ["F", "101.25", "40", "101.25"], "{sold:?}");
    let bought = buyer.recv();
    assert_eq!((get(&bought, tag::LAST_PX), get(&bought, tag::LEAVES_QTY)), ("101.25", "60"));

    // Off the grid: refused by name, before or by the engine.
    let refusals = [
        ("t1", "ACME", "100", "101.255", "PriceOffTick"),
        ("t2", "ACME", "100", "101.25001", "PriceOffTick"),
        ("t3", "ACME", "100.5", "101.25", "QuantityOffLot"),
        ("t4", "GLOBEX", "15", "20.05", "QuantityOffLot"),
        ("t5", "ACME", "100", "150", "PriceOutsideBand"),
    ];
    for (id, symbol, qty, price, reason) in refusals {
        buyer.send("D", &order(id, "1", symbol, qty, price));
        let refused = buyer.recv();
        let answer = [tag::EXEC_TYPE, tag::SYMBOL, tag::TEXT].map(|t| get(&refused, t));
        assert_eq!(answer, ["8", symbol, reason], "{id}: {refused:?}");
    }
    buyer.send("D", &order("t6", "1", "NOSUCH", "1", "1"));
    let rejected = buyer.recv();
    assert_eq!((get(&rejected, tag::MSG_TYPE), get(&rejected, tag::REF_TAG_ID)), ("3", "55"));

    // The native client in the same terms.
    let instruments = dir.path().join("configs/instruments.toml");
    let client = |script: &str| {
        let mut child = Command::new(LEANTIER)
            .args(["exchange", "client", "--connect", &served.native.to_string(), "--client", "1"])
            .args(["--instruments", instruments.to_str().unwrap(), "--linger", "300ms"])
            .env("LEANTIER_EXCHANGE_SECRET", "demo-secret-1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        std::io::Write::write_all(&mut child.stdin.take().unwrap(), script.as_bytes()).unwrap();
        child.wait_with_output().unwrap()
    };
    let sold = client("sell 1 ACME 10 101.25\n");
    let printed = String::from_utf8_lossy(&sold.stdout);
    assert!(sold.status.success(), "{printed}");
    assert!(printed.contains("filled order 1: sell 10 of ACME at 101.25"), "{printed}");
    let off_scale = client("buy 2 INITECH 100 1.23455\n");
    let error = String::from_utf8_lossy(&off_scale.stderr);
    assert!(!off_scale.status.success() && error.contains("price_decimals 4"), "{error}");
}
