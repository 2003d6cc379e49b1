//! Runs the examples and checks what they print, so an example that stops working fails CI.
//! Each example is compiled in as a module (its `main` unused here) and run on a buffer.

#[allow(dead_code)]
#[path = "../examples/tier.rs"]
mod tier;

/// The tier's rules applied in one sequential loop: what the staged, fused, key-routed run
/// must settle to.
fn expected_totals() -> Vec<(u64, u64)> {
    let mut totals = vec![(0u64, 0u64); tier::ACCOUNTS as usize];
    for id in 0..tier::ORDERS {
        let order = tier::order(id);
        let notional = u64::from(order.qty) * u64::from(order.price);
        let total = &mut totals[order.account as usize];
        if order.qty > 0 && total.1 + notional <= tier::ACCOUNT_LIMIT {
            total.0 += 1;
            total.1 += notional;
        }
    }
    totals
}

#[test]
fn the_tier_example_settles_what_a_sequential_run_of_its_rules_does() {
    let expected = expected_totals();
    // The limit must bind for some account, or the risk stage's per-key state goes untested.
    let orders_accepted: u64 = expected.iter().map(|(orders, _)| orders).sum();
    let valid = (0..tier::ORDERS).filter(|&id| tier::order(id).qty > 0).count() as u64;
    assert!(orders_accepted < valid, "the risk limit never binds: {orders_accepted} of {valid}");

    let mut output = Vec::new();
    tier::run(&mut output).expect("the example runs");
    let output = String::from_utf8(output).unwrap();
    let mut lines = output.lines();
    for (account, (orders, notional)) in expected.iter().enumerate() {
        let line = format!("account {account}: {orders} orders accepted, notional {notional}");
        assert_eq!(lines.next(), Some(line.as_str()), "output:\n{output}");
    }
    let notional: u64 = expected.iter().map(|(_, notional)| notional).sum();
    let total = format!(
        "total: {orders_accepted} of {} orders accepted, notional {notional}",
        tier::ORDERS
    );
    assert_eq!(lines.next(), Some(total.as_str()), "output:\n{output}");
    assert_eq!(lines.next(), None);
}
