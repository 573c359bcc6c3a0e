//! rdma_cm IDs sharing one event channel: each ID gets its own events, whichever ID's wait
//! reads them from the channel (`hotverbs::cm`'s module docs, "Events on a shared
//! channel").
//!
//! These need a real RDMA device with an IP address (rdma_cm has no softnic): each probes
//! for one and prints "skipped: no RDMA device" when there is none, like
//! `tests/real_device.rs`, which includes this file as a module so that `cargo xtask rxe`
//! runs them in the rxe VM (it runs the `real_device*` targets). The routing itself is
//! unit-tested without a device, over synthetic events and a fake librdmacm, in
//! `src/cm.rs`.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::fd::AsRawFd;
use std::sync::mpsc;
use std::time::Duration;

use hotverbs::cm::{CmId, ConnParam, EventChannel};
use hotverbs::testing::{gid_index, real_device};
use hotverbs::{AccessFlags, Context, QpBuilder, QpType};

const T: Duration = Duration::from_secs(10);
/// How long one side waits for the other to get going: it only bounds a failure path, so
/// it is generous for a loaded host running the VM under TCG.
const PEER_WAIT: Duration = Duration::from_secs(60);

/// The device's rdma_cm address: `$HOTVERBS_CM_ADDR`, else its RoCE v2 IPv4 GID's
/// address (as in `tests/real_device.rs`).
fn cm_addr(ctx: &Context) -> SocketAddr {
    if let Ok(a) = std::env::var("HOTVERBS_CM_ADDR") {
        return SocketAddr::new(a.parse().unwrap(), 0);
    }
    let info = ctx.port_info(None, gid_index()).unwrap();
    let ip = info
        .gid
        .ipv4()
        .map(|o| IpAddr::V4(Ipv4Addr::from(o)))
        .unwrap_or(IpAddr::V4(Ipv4Addr::new(10, 77, 0, 1)));
    SocketAddr::new(ip, 0)
}

/// A listener on a new channel, bound to the device's address on a port the kernel picks:
/// the channel, the listener and the address to connect to.
fn listening() -> Option<(EventChannel, CmId, SocketAddr)> {
    let ctx = real_device()?;
    let addr = cm_addr(&ctx);
    drop(ctx);
    let ch = EventChannel::new().unwrap();
    let listener = CmId::new(&ch).unwrap();
    listener.bind(addr).unwrap();
    listener.listen(4).unwrap();
    let port = listener.local_port().unwrap();
    Some((ch, listener, SocketAddr::new(addr.ip(), port)))
}

/// Waits until `ch` has an event pending (without reading it).
fn wait_pending(ch: &EventChannel, what: &str) {
    let mut p = libc::pollfd {
        fd: ch.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = PEER_WAIT.as_millis() as i32;
    // SAFETY: one valid pollfd for the call.
    let n = unsafe { libc::poll(&mut p, 1, ms) };
    assert_eq!(n, 1, "no {what} pending within {PEER_WAIT:?}");
}

/// An RC client on its own channel: resolves `to`, makes its QP and connects with
/// `private`, on a thread; reports the connect's result, then (if connected) waits for
/// the server's disconnect.
fn client(
    to: SocketAddr,
    private: &'static [u8],
) -> std::thread::JoinHandle<hotverbs::Result<Vec<u8>>> {
    std::thread::spawn(move || {
        let ch = EventChannel::new()?;
        let mut id = CmId::new(&ch)?;
        id.resolve_addr(None, to, PEER_WAIT)?;
        id.resolve_route(PEER_WAIT)?;
        let ctx = id.context()?;
        let pd = ctx.alloc_pd()?;
        let cq = ctx.create_cq(16, None)?;
        id.create_qp(QpBuilder::new(&pd, &cq, &cq, QpType::Rc))?;
        let reply = id.connect(
            &ConnParam {
                private_data: private.to_vec(),
                ..Default::default()
            },
            PEER_WAIT,
        )?;
        id.wait_disconnected(PEER_WAIT)?;
        Ok(reply)
    })
}

/// A connect request arrives on a channel while another ID of it resolves an address: that
/// ID's wait reads the request first, parks it for the listener and goes on to its own
/// ADDR_RESOLVED; the listener then takes the request and accepts. (Before events were
/// routed, the resolve failed with "expected RDMA_CM_EVENT_ADDR_RESOLVED, got
/// RDMA_CM_EVENT_CONNECT_REQUEST" and the request's new ID was never destroyed.)
#[test]
fn rdma_cm_a_request_read_by_another_ids_wait_reaches_its_listener() {
    let Some((ch, listener, addr)) = listening() else {
        return;
    };
    let peer = client(addr, b"to the listener");
    wait_pending(&ch, "connect request");
    // A second ID on the listener's channel, resolving the same address meanwhile.
    let other = CmId::new(&ch).unwrap();
    other.resolve_addr(None, addr, T).unwrap();
    other.resolve_route(T).unwrap();

    let (mut conn, private) = listener.get_request(Duration::ZERO).unwrap();
    assert!(private.starts_with(b"to the listener"), "{private:?}");
    let ctx = conn.context().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16, None).unwrap();
    conn.create_qp(QpBuilder::new(&pd, &cq, &cq, QpType::Rc))
        .unwrap();
    conn.accept(
        &ConnParam {
            private_data: b"accepted".to_vec(),
            ..Default::default()
        },
        T,
    )
    .unwrap();
    conn.disconnect().unwrap();
    conn.wait_disconnected(T).unwrap();
    let reply = peer.join().unwrap().unwrap();
    assert!(reply.starts_with(b"accepted"), "{reply:?}");
    // Nothing of anyone's was left over on the shared channel.
    let e = ch.get_event(Duration::ZERO).unwrap_err();
    assert_eq!(e.errno(), libc::ETIMEDOUT, "{e}");
    drop((other, conn, listener));
}

/// A listener dropped with a connect request parked for it refuses the request: the client
/// hears RDMA_CM_EVENT_REJECTED at once (not a timeout), and the request's new ID is
/// destroyed rather than leaked.
#[test]
fn rdma_cm_a_listener_dropped_with_a_parked_request_rejects_it() {
    let Some((ch, listener, addr)) = listening() else {
        return;
    };
    let peer = client(addr, b"anyone?");
    wait_pending(&ch, "connect request");
    let other = CmId::new(&ch).unwrap();
    other.resolve_addr(None, addr, T).unwrap();
    drop(listener);
    let e = peer.join().unwrap().unwrap_err();
    assert_eq!(e.verb(), "rdma_connect", "{e}");
    assert!(e.to_string().contains("RDMA_CM_EVENT_REJECTED"), "{e}");
    drop(other);
}

/// A server and its clients on one channel, each side waiting in its own thread, for a few
/// connections in a row: the listener's get_request/accept, its connections' disconnects
/// and the clients' resolve/connect/disconnect each get their own events, whichever thread
/// reads them (and the late ones, such as RDMA_CM_EVENT_TIMEWAIT_EXIT, reach no one else).
#[test]
fn rdma_cm_clients_and_server_on_one_channel_in_two_threads() {
    const ROUNDS: usize = 3;
    let Some((ch, listener, addr)) = listening() else {
        return;
    };
    let (sent, received) = mpsc::channel();
    let server = std::thread::spawn(move || {
        let mut privates = Vec::new();
        for _ in 0..ROUNDS {
            let (mut conn, private) = listener.get_request(PEER_WAIT).unwrap();
            let ctx = conn.context().unwrap();
            let pd = ctx.alloc_pd().unwrap();
            let cq = ctx.create_cq(16, None).unwrap();
            let qp = conn
                .create_qp(QpBuilder::new(&pd, &cq, &cq, QpType::Rc).max_recv_wr(4))
                .unwrap();
            let rx = pd.alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
            // SAFETY: rx untouched until the completion.
            unsafe { qp.post_recv(1, &[rx.local(0, 64).unwrap()]).unwrap() };
            conn.accept(&ConnParam::default(), T).unwrap();
            let wc = cq.wait_one(T).unwrap().ok().unwrap();
            sent.send(rx.read_vec(0, wc.byte_len() as usize).unwrap())
                .unwrap();
            conn.wait_disconnected(T).unwrap();
            privates.push(private);
        }
        privates
    });
    for round in 0..ROUNDS {
        let mut id = CmId::new(&ch).unwrap();
        id.resolve_addr(None, addr, T).unwrap();
        id.resolve_route(T).unwrap();
        let ctx = id.context().unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(16, None).unwrap();
        id.create_qp(QpBuilder::new(&pd, &cq, &cq, QpType::Rc).sq_sig_all(true))
            .unwrap();
        id.connect(
            &ConnParam {
                private_data: format!("round {round}").into_bytes(),
                ..Default::default()
            },
            T,
        )
        .unwrap();
        let msg = format!("hello #{round}");
        let mut tx = pd.alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
        tx.write_from(0, msg.as_bytes()).unwrap();
        // SAFETY: tx untouched until the completion.
        unsafe {
            id.qp()
                .unwrap()
                .post_send(&hotverbs::SendWr::send(
                    2,
                    &[tx.local(0, msg.len()).unwrap()],
                ))
                .unwrap()
        };
        assert_eq!(cq.wait_one(T).unwrap().ok().unwrap().wr_id(), 2);
        assert_eq!(received.recv_timeout(T).unwrap(), msg.as_bytes());
        id.disconnect().unwrap();
        id.wait_disconnected(T).unwrap();
    }
    let privates = server.join().unwrap();
    for (round, private) in privates.iter().enumerate() {
        let want = format!("round {round}");
        assert!(private.starts_with(want.as_bytes()), "{private:?}");
    }
}
