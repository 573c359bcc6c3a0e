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
