//! Memory without a Rust owner (`verbs/src/mr.rs`): `Pd::reg_dmabuf_mr` over a memfd
//! standing in for a GPU buffer on softnic (softnic maps the fd for the registration's
//! life), and `Pd::reg_mr_raw` over a mapping of the test's own.
//!
//! The dmabuf tests prove the bytes through the fd (`pread`), never through the `Mr`: a
//! dmabuf MR is device memory, and every CPU accessor refuses it.

use std::fs::File;
use std::os::fd::{AsFd, FromRawFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::time::Duration;

use hotverbs::{
    AccessFlags, ConnectOptions, Context, Cq, Local, Msg, Pd, Qp, QpBuilder, QpType, RecvConfig,
    SendConfig, SendOps, SendWr, SoftnicConfig,
};

const T: Duration = Duration::from_secs(5);
const PAGE: u64 = 4096;

fn rw() -> AccessFlags {
    AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ
}

/// A memfd of `len` bytes named `name` (unique per test: it shows up in
/// `/proc/self/maps` while mapped), every byte `fill`.
fn memfd(name: &std::ffi::CStr, len: u64, fill: u8) -> File {
    // SAFETY: a valid NUL-terminated name and no flags.
    let raw = unsafe { libc::memfd_create(name.as_ptr(), 0) };
    assert!(
        raw >= 0,
        "memfd_create: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: a new fd, owned from here on.
    let file = File::from(unsafe { OwnedFd::from_raw_fd(raw) });
    file.write_all_at(&vec![fill; len as usize], 0).unwrap();
    file
}

/// How many mappings of the memfd called `name` this process has.
fn mappings_of(name: &str) -> usize {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines()
        .filter(|l| l.contains(&format!("/memfd:{name} ")))
        .count()
}

/// Two connected RC QPs on one softnic context, without inline data (a dmabuf SGE must
/// never be sent inline).
fn pair(ctx: &Context) -> (Pd, Cq, Qp, Qp) {
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64, None).unwrap();
    let a = QpBuilder::new(&pd, &cq, &cq, QpType::Rc).build().unwrap();
    let b = QpBuilder::new(&pd, &cq, &cq, QpType::Rc).build().unwrap();
    let port = ctx.port_info(None, None).unwrap();
    let o = ConnectOptions::default();
    a.connect(&port, &b.endpoint(&port), &o).unwrap();
    b.connect(&port, &a.endpoint(&port), &o).unwrap();
    (pd, cq, a, b)
}

#[test]
fn rdma_write_lands_in_a_memfd_registered_as_dmabuf() {
    let ctx = Context::open("softnic").unwrap();
    let (pd, cq, a, b) = pair(&ctx);
    let name = "hotverbs-dmabuf-write";
    let file = memfd(c"hotverbs-dmabuf-write", 3 * PAGE, 0xee);
    // An offset inside a page, so softnic's page-aligned mapping starts before it.
    let (offset, len, iova) = (PAGE + 100, 1000usize, 0xdead_0000u64);
    let dm = pd
        .reg_dmabuf_mr(file.as_fd(), offset, len, iova, rw())
        .unwrap();
    assert_eq!((dm.addr(), dm.len()), (iova, len));
    assert!(!dm.is_mapped());
    assert!(dm.as_ptr().is_null());
    assert_eq!(dm.remote().addr, iova);
    assert_eq!(mappings_of(name), 1, "softnic maps the registered range");

    // The peer writes 64 bytes at offset 8 of the MR.
    let payload: Vec<u8> = (0..64u8).map(|i| i.wrapping_mul(7) ^ 0x5a).collect();
    let mut tx = pd.alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    tx.write_from(0, &payload).unwrap();
    let remote = dm.remote().slice(8, 64).unwrap();
    // SAFETY: tx stays registered and untouched until the completion.
    unsafe {
        a.post_send(&SendWr::write(1, &[tx.local(0, 64).unwrap()], remote).signaled())
            .unwrap()
    };
    assert_eq!(cq.wait_one(T).unwrap().ok().unwrap().wr_id(), 1);

    let mut got = vec![0u8; len + 200];
    file.read_exact_at(&mut got, offset - 100).unwrap();
    assert!(got[..108].iter().all(|&x| x == 0xee), "before the write");
    assert_eq!(
        &got[108..172],
        &payload[..],
        "the written bytes, through the fd"
    );
    assert!(got[172..].iter().all(|&x| x == 0xee), "after the write");

    // The device reads it too: RDMA READ back into host memory, and a SEND from it.
    let rx = pd.alloc_mr(128, AccessFlags::LOCAL_WRITE).unwrap();
    // SAFETY: rx untouched until the completions.
    unsafe {
        a.post_send(&SendWr::read(2, &[rx.local(0, 64).unwrap()], remote).signaled())
            .unwrap();
        a.post_recv(3, &[rx.local(64, 64).unwrap()]).unwrap();
        // The dmabuf MR as a local source (lkey): 8 bytes of the untouched prefix + 8 of
        // the payload.
        b.post_send(&SendWr::send(4, &[dm.local(0, 16).unwrap()]).signaled())
            .unwrap();
    }
    let mut ids: Vec<u64> = (0..3)
        .map(|_| cq.wait_one(T).unwrap().ok().unwrap().wr_id())
        .collect();
    ids.sort();
    assert_eq!(ids, [2, 3, 4]);
    assert_eq!(rx.read_vec(0, 64).unwrap(), payload);
    let mut want = vec![0xee; 8];
    want.extend_from_slice(&payload[..8]);
    assert_eq!(rx.read_vec(64, 16).unwrap(), want);

    // Deregistration unmaps softnic's mapping; the fd's bytes stay.
    drop(dm);
    assert_eq!(mappings_of(name), 0, "dereg_mr unmaps");
    file.read_exact_at(&mut got[..64], offset + 8).unwrap();
    assert_eq!(&got[..64], &payload[..]);
}

#[test]
fn dmabuf_mr_refuses_every_cpu_accessor_and_receive_leases() {
    let ctx = Context::open("softnic").unwrap();
    let (pd, _cq, a, _b) = pair(&ctx);
    let file = memfd(c"hotverbs-dmabuf-cpu", PAGE, 0);
    let mut dm = pd
        .reg_dmabuf_mr(file.as_fd(), 0, PAGE as usize, 0x1000, rw())
        .unwrap();
    let efault = |e: hotverbs::Error| {
        assert_eq!(e.errno(), libc::EFAULT, "{e}");
        assert!(e.to_string().contains("dmabuf"), "{e}");
    };
    efault(dm.as_slice().unwrap_err());
    efault(dm.as_mut_slice().unwrap_err());
    efault(dm.read_vec(0, 8).unwrap_err());
    efault(dm.write_from(0, b"x").unwrap_err());
    efault(dm.read_u64(0).unwrap_err());
    efault(dm.write_u64(0, 1).unwrap_err());
    // A receive lease (and so a RecvRing, which reads its slots on the CPU).
    efault(a.lease_recv(&dm, 0, 64).unwrap_err());
    efault(
        a.recv_ring::<4>(&mut dm, 0, RecvConfig::new(0, 64, 4))
            .map(drop)
            .unwrap_err(),
    );
    assert!(!dm.is_leased());
    // The descriptors are fine: they are what the device uses.
    assert_eq!(dm.local(16, 32).unwrap().addr, 0x1010);
    assert_eq!(dm.sge().lkey, dm.lkey());
}

#[test]
fn dmabuf_on_a_device_without_it_says_not_supported_by_the_device() {
    let ctx = Context::open_softnic_with(SoftnicConfig {
        name: "softnic-nodmabuf".into(),
        dmabuf: false,
        ..Default::default()
    })
    .unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let file = memfd(c"hotverbs-dmabuf-unsupported", PAGE, 0);
    let e = pd
        .reg_dmabuf_mr(file.as_fd(), 0, PAGE as usize, 0, rw())
        .unwrap_err();
    assert_eq!(
        (e.verb(), e.errno()),
        ("ibv_reg_dmabuf_mr", libc::EOPNOTSUPP)
    );
    let msg = e.to_string();
    assert!(
        msg.contains("dmabuf memory registration")
            && msg.contains("not supported by softnic-nodmabuf"),
        "{msg}"
    );
    // Nothing was registered: the PD is free.
    pd.destroy().unwrap();
}

#[test]
fn dmabuf_arguments_are_checked() {
    let ctx = Context::open("softnic").unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let file = memfd(c"hotverbs-dmabuf-args", 2 * PAGE, 0);
    let fd = file.as_fd();
    let einval = |r: hotverbs::Result<hotverbs::Mr<'static>>| {
        let e = r.unwrap_err();
        assert_eq!(
            (e.verb(), e.errno()),
            ("ibv_reg_dmabuf_mr", libc::EINVAL),
            "{e}"
        );
        e
    };
    einval(pd.reg_dmabuf_mr(fd, 0, 0, 0, rw()));
    einval(pd.reg_dmabuf_mr(fd, 0, 4096, u64::MAX - 100, rw()));
    // Beyond the end of the buffer.
    einval(pd.reg_dmabuf_mr(fd, PAGE + 1, PAGE as usize, 0, rw()));
    let e = einval(pd.reg_dmabuf_mr(fd, 0, 64, 0, AccessFlags::REMOTE_WRITE));
    assert!(e.to_string().contains("LOCAL_WRITE"), "{e}");
    // The last byte of the buffer is fine.
    pd.reg_dmabuf_mr(fd, 2 * PAGE - 1, 1, 0, rw()).unwrap();
    // A pipe is no buffer.
    let mut p = [0; 2];
    // SAFETY: a valid out-array of two fds.
    assert_eq!(unsafe { libc::pipe(p.as_mut_ptr()) }, 0);
    // SAFETY: the two new fds, owned from here on.
    let (r, _w) = unsafe { (OwnedFd::from_raw_fd(p[0]), OwnedFd::from_raw_fd(p[1])) };
    assert!(pd.reg_dmabuf_mr(r.as_fd(), 0, 64, 0, rw()).is_err());
}

#[test]
fn reg_mr_raw_registers_memory_nobody_owns() {
    let ctx = Context::open("softnic").unwrap();
    let (pd, cq, a, _b) = pair(&ctx);
    let len = 2 * PAGE as usize;
    // SAFETY: a new anonymous mapping; no existing memory is affected.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    let p = p.cast::<u8>();
    // SAFETY: the mapping is zeroed, valid and ours until the munmap below, after the Mr
    // is dropped; the test reads it through the Mr only while registered.
    let raw = unsafe { pd.reg_mr_raw(p, len, rw()) }.unwrap();
    assert_eq!((raw.addr(), raw.len(), raw.as_ptr()), (p as u64, len, p));
    assert!(raw.is_mapped());

    let mut tx = pd.alloc_mr(16, AccessFlags::LOCAL_WRITE).unwrap();
    tx.write_from(0, b"into raw memory!").unwrap();
    let remote = raw.remote().slice(PAGE - 8, 16).unwrap();
    // SAFETY: tx untouched until the completion.
    unsafe {
        a.post_send(&SendWr::write(1, &[tx.local(0, 16).unwrap()], remote).signaled())
            .unwrap()
    };
    cq.wait_one(T).unwrap().ok().unwrap();
    assert_eq!(
        raw.read_vec(PAGE as usize - 8, 16).unwrap(),
        b"into raw memory!"
    );
    drop(raw);
    // SAFETY: deregistered: the memory is ours alone again.
    let bytes = unsafe { std::slice::from_raw_parts(p.add(PAGE as usize - 8), 16) };
    assert_eq!(bytes, b"into raw memory!");
    // SAFETY: the mapping made above, no longer registered or borrowed.
    assert_eq!(unsafe { libc::munmap(p.cast(), len) }, 0);

    // SAFETY: a null address is refused before anything is registered.
    let e = unsafe { pd.reg_mr_raw(std::ptr::null_mut(), 64, rw()) }.unwrap_err();
    assert_eq!((e.verb(), e.errno()), ("ibv_reg_mr", libc::EINVAL));
}

/// What each ring kind does with a small registered buffer, for the dmabuf test below.
#[derive(Clone, Copy, Debug)]
enum RingKind {
    Send,
    Wr,
    Direct,
}

/// SENDs `dm.local(0, 16)` through a ring of `kind` with `max_inline` 64 and
/// `inline_bufs(false)`, then returns what the peer received. A ring that inlined the
/// buffer would read the IOVA on the CPU (not mapped in this process: a crash).
fn send_from_dmabuf(kind: RingKind) -> Vec<u8> {
    let ctx = match kind {
        RingKind::Direct => Context::open_softnic_with(SoftnicConfig {
            name: "softnic_mlx5".into(),
            mlx5: true,
            ..Default::default()
        })
        .unwrap(),
        _ => Context::open("softnic").unwrap(),
    };
    let pd = ctx.alloc_pd().unwrap();
    let (cq_a, cq_b) = (
        ctx.create_cq(64, None).unwrap(),
        ctx.create_cq(64, None).unwrap(),
    );
    let mut qa = QpBuilder::new(&pd, &cq_a, &cq_a, QpType::Rc).max_inline_data(64);
    if let RingKind::Wr = kind {
        qa = qa.send_ops(SendOps::SEND);
    }
    let a = qa.build().unwrap();
    let b = QpBuilder::new(&pd, &cq_b, &cq_b, QpType::Rc)
        .build()
        .unwrap();
    let port = ctx.port_info(None, None).unwrap();
    let o = ConnectOptions::default();
    a.connect(&port, &b.endpoint(&port), &o).unwrap();
    b.connect(&port, &a.endpoint(&port), &o).unwrap();
    let file = memfd(c"hotverbs-dmabuf-ring", PAGE, 0);
    file.write_all_at(b"sixteen gpu byte", 0).unwrap();
    // An IOVA far from anything mapped here.
    let dm = pd
        .reg_dmabuf_mr(file.as_fd(), 0, PAGE as usize, 0x10_0000, rw())
        .unwrap();
    let rx = pd.alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    // SAFETY: rx is untouched until the receive completes.
    unsafe { b.post_recv(7, &[rx.local(0, 64).unwrap()]).unwrap() };
    let cfg = SendConfig::new(0, 8, 64).inline_bufs(false);
    let msg = Msg::send(Local::Buf(dm.local(0, 16).unwrap().into()));
    let deadline = std::time::Instant::now() + T;
    // The rings share no trait: the same steps on each.
    macro_rules! send_and_retire {
        ($poller:expr, $ring:expr) => {{
            let (mut poller, mut ring) = ($poller, $ring);
            ring.signal_next();
            // SAFETY: dm stays registered (and its bytes unchanged) until retired below.
            let seq = unsafe { ring.stage(msg) }.unwrap();
            ring.flush().unwrap();
            while !ring.is_retired(seq) {
                for c in poller.poll().unwrap() {
                    ring.on_completion(c).unwrap();
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "{kind:?}: no completion"
                );
            }
        }};
    }
    match kind {
        RingKind::Send => {
            send_and_retire!(cq_a.poller::<8>().unwrap(), a.send_ring::<8>(cfg).unwrap())
        }
        RingKind::Wr => send_and_retire!(cq_a.poller::<8>().unwrap(), a.wr_ring(cfg).unwrap()),
        RingKind::Direct => {
            let mut poller = cq_a.direct_poller::<8>().unwrap();
            let ring = a.direct_ring(&mut poller, cfg).unwrap();
            send_and_retire!(poller, ring)
        }
    }
    let wc = cq_b.wait_one(T).unwrap();
    assert_eq!((wc.wr_id(), wc.byte_len()), (7, 16), "{kind:?}: {wc:?}");
    rx.read_vec(0, 16).unwrap()
}

/// `SendConfig::inline_bufs(false)`: every ring sends a registered buffer smaller than its
/// `max_inline` by SGE, so device memory (a dmabuf MR, no address in this process) is read
/// by the device only. Without it, each ring would copy the 16 bytes inline from the IOVA.
#[test]
fn rings_send_device_memory_by_sge_with_inline_bufs_off() {
    for kind in [RingKind::Send, RingKind::Wr, RingKind::Direct] {
        assert_eq!(send_from_dmabuf(kind), b"sixteen gpu byte", "{kind:?}");
    }
}
