//! Runs the examples and checks what they print, so an example that stops working fails CI.
//! Each example is compiled in as a module (its `main` unused here) and run on a buffer.

#[allow(dead_code)]
#[path = "../examples/replay.rs"]
mod replay;

fn replay_text(orders: &str) -> Result<String, String> {
    let mut output = Vec::new();
    replay::run(orders, &mut output).map_err(|error| error.to_string())?;
    Ok(String::from_utf8(output).unwrap())
}

#[test]
fn the_replay_example_prints_the_trades_the_shipped_orders_make() {
    let orders = include_str!("../examples/orders.txt");
    // Worked out by hand from the file's comments: price-time priority, the IOC remainder,
    // the owner check, a replace that keeps its place, and fill-or-kill both ways.
    let expected = "\
trade 50 @ 101: order 4 took from order 1
trade 10 @ 102: order 4 took from order 2
engine cancelled order 5: ImmediateRemainder
rejected order 2: NotOrderOwner
engine cancelled order 6: FillOrKillUnfilled
trade 15 @ 102: order 7 took from order 2
11 requests, 3 trades, 1 orders resting
best bid 95 x 25, best ask 0 x 0
";
    assert_eq!(replay_text(orders).unwrap(), expected);
}

#[test]
fn the_replay_example_names_the_line_it_cannot_read() {
    let error = replay_text("new 1 7 sell 101 50\n\nnew 2 7 short 101 50\n").unwrap_err();
    assert_eq!(error, "line 3: side Some(\"short\"): expected buy or sell");
}
