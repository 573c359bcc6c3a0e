//! Runs the examples' logic as tests, on softnic, and checks the data they exchange.
//! (The same example on a real device is in `tests/real_device.rs`.)

// The example's command-line half (`main`, argument parsing) is not used here.
#[allow(dead_code)]
#[path = "../examples/rdma_rc.rs"]
mod rdma_rc;

/// The manual's RC example end to end: the client receives the server's SEND, fetches the
/// server's buffer with RDMA READ and overwrites it with RDMA WRITE.
#[test]
fn rdma_rc_example_loopback_on_softnic() {
    let (server, client) = rdma_rc::loopback(None, None).unwrap();
    assert_eq!(client.received.as_deref(), Some("SEND operation "));
    assert_eq!(client.read.as_deref(), Some("RDMA read operation "));
    assert_eq!(client.final_contents, "RDMA write operation");
    // The server saw none of the one-sided operations, yet its buffer changed.
    assert_eq!(server.received, None);
    assert_eq!(server.read, None);
    assert_eq!(server.final_contents, "RDMA write operation");
}

#[allow(dead_code)]
#[path = "../examples/order_gateway.rs"]
mod order_gateway;

/// The order gateway end to end on both verbs post paths, one order and a full window in
/// flight: every order acked in order (the example checks each ack's sequence number),
/// the orders the dead exchange never acked re-sent, and every gateway send WR retired by
/// a completion or dropped by the recovery, exactly once.
#[test]
fn order_gateway_example_survives_its_exchange_dying() {
    use order_gateway::{run_on, Legacy, Wr, WINDOW};
    let ctx = hotverbs::Context::open_softnic_with(hotverbs::SoftnicConfig {
        name: "softnic_gateway".into(),
        ..Default::default()
    })
    .unwrap();
    for window in [1, WINDOW] {
        for r in [
            run_on::<Legacy>(&ctx, 20_000, window).unwrap(),
            run_on::<Wr>(&ctx, 20_000, window).unwrap(),
        ] {
            let at = format!("{} window {window}: {r:?}", r.path);
            assert_eq!(r.acked, 20_000, "{at}");
            assert_eq!(r.resent, window as u64, "{at}");
            assert_eq!(r.posted, 20_000 + r.resent, "{at}");
            assert_eq!(r.retired + r.dropped, r.posted, "{at}");
            assert_eq!(r.errors.first(), Some(&hotverbs::WcError::RetryExc), "{at}");
            assert!(
                r.errors[1..]
                    .iter()
                    .all(|e| *e == hotverbs::WcError::WrFlush),
                "{at}"
            );
            assert!(r.rtt_ns[0] > 0 && r.rtt_ns[0] <= r.rtt_ns[3], "{at}");
        }
    }
}
