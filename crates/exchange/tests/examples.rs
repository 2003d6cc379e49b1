//! Runs the examples and checks what they print, so an example that stops working fails CI.
//! Each example is compiled in as a module (its `main` unused here) and run on a buffer.

#[allow(dead_code)]
#[path = "../examples/custom_tier.rs"]
mod custom_tier;

#[test]
fn the_custom_tier_example_delivers_every_report_of_its_crossing_orders() {
    let mut output = Vec::new();
    custom_tier::run(&mut output).expect("the example runs");
    let pairs = custom_tier::PAIRS;
    // Every order is accepted; each buy takes one resting sell in full (two fills, one trade);
    // each order changes the ask's quantity once (a top-of-book record), and nothing else.
    let expected = format!(
        "accepted {}, filled {}, trades {pairs}, other {}\n",
        2 * pairs,
        2 * pairs,
        2 * pairs
    );
    assert_eq!(String::from_utf8(output).unwrap(), expected);
}
