//! `examples/order_gateway.rs` on a real device: on rxe0 inside `cargo xtask rxe` (the
//! `real_device*` convention: the dead exchange is a destroyed QP whose packets rxe drops, so
//! the gateway's order ends with `RETRY_EXC_ERR` after the transport retries), and on
//! softnic's two behaviour profiles on every `cargo test`. (`tests/examples.rs` runs it on
//! the default softnic with more orders.)

#[allow(dead_code)]
#[path = "../examples/order_gateway.rs"]
mod order_gateway;

use hotverbs::testing::device_or_softnic_profiles;
use hotverbs::*;
use order_gateway::{run_on, Legacy, Report, Wr, WINDOW};

fn open() -> Vec<(String, Context)> {
    device_or_softnic_profiles("real_device_order_gateway", "gateway")
}

fn check(label: &str, orders: u64, window: usize, r: &Report) {
    let at = format!("{label}, {} window {window}: {r:?}", r.path);
    assert_eq!(r.acked, orders, "{at}");
    assert_eq!(r.resent, window as u64, "{at}");
    assert_eq!(r.posted, orders + r.resent, "{at}");
    assert_eq!(r.retired + r.dropped, r.posted, "{at}");
    assert_eq!(r.errors.first(), Some(&WcError::RetryExc), "{at}");
    assert!(r.errors[1..].iter().all(|e| *e == WcError::WrFlush), "{at}");
    eprintln!(
        "{at}\n  p50 {} ns, p99 {} ns, {:.0} orders/s",
        r.rtt_ns[0], r.rtt_ns[1], r.rate
    );
}

/// Every order acked in order across the exchange's death and the gateway's recovery, on
/// both verbs post paths, one order and a full window in flight; every gateway send WR
/// retired by a completion or dropped by the recovery, exactly once.
#[test]
fn order_gateway_survives_its_exchange_dying() {
    const ORDERS: u64 = 2_000;
    for (label, ctx) in open() {
        for window in [1, WINDOW] {
            check(
                &label,
                ORDERS,
                window,
                &run_on::<Legacy>(&ctx, ORDERS, window).unwrap(),
            );
            check(
                &label,
                ORDERS,
                window,
                &run_on::<Wr>(&ctx, ORDERS, window).unwrap(),
            );
        }
    }
}
