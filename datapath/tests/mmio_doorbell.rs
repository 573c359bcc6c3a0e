//! The hardware doorbell ([`Mmio`]) on plain memory, against the recording one the golden
//! test compares with libmlx5 ([`RecordingDoorbell`]).
//!
//! `cargo xtask golden` proves the *recorded* stores equal to libmlx5's; what reaches a
//! ConnectX is what `Mmio` stores. Here two [`DirectRing`]s, one on each doorbell, post
//! the same stream to two identical simulated send queues (softnic's `Mlx5Sim`: a heap SQ,
//! a `u32` doorbell record, a page-aligned heap page standing for the BlueFlame register),
//! and after every doorbell the SQ bytes, the doorbell record and both BlueFlame buffers
//! must be equal: `Mmio`'s memory against the recorder's stores replayed into a page of
//! the same size. The stream covers every copy width the ring uses (lone inline posts of
//! every size, so BlueFlame copies of one to `bf_size / 64` blocks, wrapping at the end of
//! the SQ; lone posts too big for BlueFlame; batches; data segments), each BlueFlame size
//! from none (`bf_size: 0`, doorbells only) to 512, starting at either buffer.
//!
//! On x86-64 this checks the 16-byte SSE copy, on arm64 (run under `qemu-aarch64`) the
//! `ld4` / `st4` copy, on riscv64 the 8-byte one; under miri, the portable fallback.
//! What a device makes of the stores (one 64-byte write or several) plain memory cannot
//! show: that is the real-device test's.

#![cfg(any(
    target_arch = "x86_64",
    target_arch = "aarch64",
    target_arch = "riscv64"
))]

use hotverbs_datapath::mlx5::{
    DirectSq, Doorbell, Mmio, MmioEvent, RecordingDoorbell, SEND_WQE_BB,
};
use hotverbs_datapath::{
    DirectPoller, DirectRing, Local, LocalBuf, Msg, RemoteBuf, SendConfig, SendError,
};
use hotverbs_softnic::mlx5sim::Mlx5Sim;

mod common;

const QPN: u32 = 0x5a5;
/// Basic blocks per SQ: small enough that the stream wraps it many times (smaller under
/// miri, which compares every byte of it after every step).
const WQE_CNT: u32 = if cfg!(miri) { 64 } else { 256 };
/// Ring depth: `DEPTH` WQEs of the largest size (6 blocks) fit the SQ.
const DEPTH: u32 = WQE_CNT / 8;
/// Inline sizes up to here: past the largest BlueFlame copy of a 256-byte buffer.
const MAX_INLINE: u32 = 300;
/// Bytes of the simulated register page (`Mlx5Sim::bf_page`).
const BF_PAGE: usize = 4096;

fn sq_of(sim: &mut Mlx5Sim, bf_size: u32, bf_offset: u32) -> DirectSq {
    DirectSq {
        bf_size,
        bf_offset,
        ..common::mlx5::sim_sq(sim, QPN, MAX_INLINE, 2)
    }
}

/// One side of the comparison: a simulated QP, its ring on doorbell `D`, its poller.
struct Side<D: Doorbell> {
    sim: Mlx5Sim,
    ring: DirectRing<D>,
    poller: DirectPoller<16>,
}

impl<D: Doorbell> Side<D> {
    fn new(bf_size: u32, bf_offset: u32, db: impl FnOnce(*mut u8) -> D) -> Side<D> {
        let mut sim = Mlx5Sim::new(WQE_CNT, 64, QPN);
        let sq = sq_of(&mut sim, bf_size, bf_offset);
        let cq = common::mlx5::sim_cq(&mut sim, 0x33);
        let cfg = SendConfig::new(1, DEPTH, MAX_INLINE)
            .signal_every(4)
            .batch(4)
            .remote(RemoteBuf::new(0x7700_0000, 1 << 20, 0x4321));
        // SAFETY: the simulator's heap memory (moved with `sim`, never reallocated)
        // outlives the ring and the poller, its only users; nothing else posts.
        let (ring, poller) = unsafe {
            let ring = DirectRing::with_doorbell(sq, cfg, None, db(sq.bf_reg)).unwrap();
            let mut poller = DirectPoller::<16>::new(cq).unwrap();
            poller.attach(&sq).unwrap();
            (ring, poller)
        };
        Side { sim, ring, poller }
    }

    /// The device reads what was announced; completions go back to the ring.
    fn complete(&mut self) {
        self.sim.process();
        for c in self.poller.poll().unwrap().iter() {
            self.ring.on_completion(c).unwrap();
        }
    }
}

/// One step of the stream, posted identically on both sides.
#[derive(Clone, Copy, Debug)]
enum Step {
    /// A lone inline SEND of `len` bytes (`send_now`).
    Send(usize),
    /// A lone inline RDMA WRITE of `len` bytes (a 16-byte remote-address segment more).
    Write(usize),
    /// A batch of inline SENDs of these sizes (one doorbell, never BlueFlame).
    Batch([usize; 3]),
    /// A lone SEND from a registered buffer (a data segment: not inline, no BlueFlame).
    Buf(u32),
}

fn post<D: Doorbell>(r: &mut DirectRing<D>, step: Step, data: &[u8]) -> Result<u64, SendError> {
    match step {
        Step::Send(len) => r.send_now(Msg::send(Local::Inline(&data[..len]))),
        Step::Write(len) => r.send_now(Msg::write(Local::Inline(&data[..len]), 64)),
        Step::Batch(lens) => {
            let mut b = r.batch();
            let mut first = None;
            for len in lens {
                let s = b.push(Msg::send(Local::Inline(&data[..len])))?;
                first.get_or_insert(s);
            }
            b.finish()?;
            Ok(first.unwrap())
        }
        Step::Buf(len) => {
            // SAFETY: the simulated device never reads local buffers: the address is only
            // written into the WQE.
            unsafe { r.stage(Msg::send(Local::Buf(LocalBuf::new(0x1_2340, len, 0x99)))) }
                .and_then(|s| r.flush().map(|()| s))
        }
    }
}

/// The WQE's `ds` (16-byte units) for an inline post of `len` bytes after `addr` bytes of
/// address segments.
fn inline_ds(addr: usize, len: usize) -> usize {
    1 + addr / 16 + if len == 0 { 0 } else { (4 + len).div_ceil(16) }
}

/// The stream: every inline size for both opcodes (all under miri would take minutes:
/// there, each size where the WQE's basic blocks change, and its neighbours), then
/// batches and data segments.
fn stream() -> Vec<Step> {
    let sizes: Vec<usize> = if cfg!(miri) {
        let mut v = vec![0, 1, MAX_INLINE as usize];
        for bbs in 1..=5usize {
            // The largest SEND of `bbs` blocks and the one after it.
            let top = bbs * SEND_WQE_BB - 16 - 4;
            v.extend([top, top + 1]);
        }
        v.retain(|&l| l <= MAX_INLINE as usize);
        v
    } else {
        (0..=MAX_INLINE as usize).collect()
    };
    let mut s: Vec<Step> = sizes.iter().map(|&l| Step::Send(l)).collect();
    s.extend(
        sizes
            .iter()
            .filter(|&&l| l <= MAX_INLINE as usize)
            .map(|&l| Step::Write(l)),
    );
    s.extend([
        Step::Batch([8, 200, 0]),
        Step::Batch([100, 1, 44]),
        Step::Buf(4096),
        Step::Buf(0),
        Step::Send(44),
        Step::Batch([300, 300, 300]),
        Step::Send(236),
    ]);
    s
}

/// A lone inline post whose WQE takes `b` basic blocks (1 to 6).
fn of_blocks(b: u32) -> Step {
    let b = b as usize;
    match b {
        // ctrl (16) + inline header (4) + data: 4 * b units of 16 bytes.
        1..=5 => Step::Send(b * SEND_WQE_BB - 16 - 4),
        // ctrl + remote address + inline header + 300 bytes: 21 units, 6 blocks.
        _ => Step::Write(MAX_INLINE as usize),
    }
}

/// What one configuration's run exercised, for the coverage assertions.
#[derive(Default)]
struct Seen {
    /// `by_blocks[k]`: doorbells that copied `k` 64-byte blocks through BlueFlame (`k` = 0:
    /// the 8-byte doorbell).
    by_blocks: [usize; 9],
    /// BlueFlame copies whose source wrapped at the end of the SQ.
    wrapped: usize,
    /// Doorbells that used the buffer at `bf_offset` 0 / `bf_size`.
    buffers: [usize; 2],
}

/// Runs the stream on a `Mmio` ring and a recording ring with this BlueFlame geometry and
/// compares them after every step.
fn compare(bf_size: u32, bf_offset: u32) -> Seen {
    let mut hw = Side::new(bf_size, bf_offset, |_| Mmio);
    let mut rec = Side::new(bf_size, bf_offset, RecordingDoorbell::new);
    let data: Vec<u8> = (0..MAX_INLINE as usize)
        .map(|i| (i as u8).wrapping_mul(37) ^ 0x5c)
        .collect();
    let mut replayed = vec![0u8; BF_PAGE];
    let mut seen = Seen::default();
    let fixed = stream();
    // Then one WQE of each size from 2 to 6 blocks starting at the SQ's last block, so its
    // BlueFlame copy (where it fits the buffer) wraps: filler posts of up to 4 blocks
    // first.
    let mut wraps = 2..=6u32;
    let mut wrap_next = wraps.next();
    for i in 0.. {
        let step = if i < fixed.len() {
            fixed[i]
        } else {
            let Some(b) = wrap_next else { break };
            let gap = WQE_CNT - 1 - rec.ring.cur_post() % WQE_CNT;
            if gap == 0 {
                wrap_next = wraps.next();
                of_blocks(b)
            } else {
                of_blocks(gap.min(4))
            }
        };
        let ctx = || format!("bf_size {bf_size}, bf_offset {bf_offset}, step {i}: {step:?}");
        let (cur, offset) = (rec.ring.cur_post(), rec.ring.bf_offset());
        let a = post(&mut hw.ring, step, &data);
        let b = post(&mut rec.ring, step, &data);
        assert_eq!(a, b, "{}", ctx());
        a.unwrap_or_else(|e| panic!("{}: {e}", ctx()));
        // The recorder holds this step's events only (cleared below): replaying them onto
        // the page of the earlier steps' is replaying them all.
        rec.ring.doorbell().replay(&mut replayed);

        assert_eq!(hw.sim.sq(), rec.sim.sq(), "SQ bytes, {}", ctx());
        assert_eq!(
            hw.sim.sq_dbr(),
            rec.sim.sq_dbr(),
            "doorbell record, {}",
            ctx()
        );
        assert_eq!(
            hw.sim.sq_dbr(),
            hw.ring.cur_post() & 0xffff,
            "the record is cur_post, {}",
            ctx()
        );
        assert!(
            hw.sim.bf_page() == &replayed[..],
            "BlueFlame register: Mmio stored {:02x?}, the recorded stores {:02x?}, {}",
            &hw.sim.bf_page()[..2 * bf_size.max(64) as usize],
            &replayed[..2 * bf_size.max(64) as usize],
            ctx()
        );
        assert_eq!(
            rec.sim.bf_page(),
            &replayed[..],
            "the recorder stores what it records, {}",
            ctx()
        );
        assert_eq!(hw.ring.bf_offset(), rec.ring.bf_offset(), "{}", ctx());

        // What this doorbell was: its stores, all in the buffer it started at.
        let ev = &rec.ring.doorbell().events[..];
        let stores: Vec<(usize, u64)> = ev
            .iter()
            .filter_map(|e| match *e {
                MmioEvent::Store64 { offset, raw } => Some((offset, raw)),
                _ => None,
            })
            .collect();
        assert_eq!(
            ev.iter().filter(|e| matches!(e, MmioEvent::Dbr(_))).count(),
            1,
            "one doorbell per step, {}",
            ctx()
        );
        let blocks = if stores.len() == 1 {
            0
        } else {
            stores.len() / 8
        };
        assert!(
            stores.len() == 1 || stores.len() == blocks * 8 && blocks >= 1,
            "{} stores, {}",
            stores.len(),
            ctx()
        );
        for (k, &(off, _)) in stores.iter().enumerate() {
            assert_eq!(off, offset as usize + 8 * k, "store {k}, {}", ctx());
        }
        if let Step::Send(len) = step {
            // libmlx5's rule: BlueFlame for a lone inline WQE of 1 < ds <= bf_size / 16.
            let ds = inline_ds(0, len);
            let bf = ds > 1 && ds <= bf_size as usize / 16;
            let want = if bf { ds.div_ceil(4) } else { 0 };
            assert_eq!(blocks, want, "BlueFlame blocks of a lone send, {}", ctx());
        }
        seen.by_blocks[blocks] += 1;
        if blocks > 0 && cur % WQE_CNT + blocks as u32 > WQE_CNT {
            seen.wrapped += 1;
        }
        seen.buffers[(offset != 0) as usize] += 1;
        rec.ring.doorbell().events.clear();

        hw.complete();
        rec.complete();
    }
    assert_eq!(hw.ring.retired_total(), rec.ring.retired_total());
    seen
}

#[test]
fn mmio_stores_what_the_recording_doorbell_records_for_every_copy_width() {
    // Under miri (minutes per configuration): no BlueFlame, and ConnectX's 256 bytes.
    let sizes: &[u32] = if cfg!(miri) {
        &[0, 256]
    } else {
        &[0, 64, 128, 256, 512]
    };
    for &bf_size in sizes {
        let offsets: &[u32] = if bf_size == 0 { &[0] } else { &[0, bf_size] };
        for &bf_offset in offsets {
            let seen = compare(bf_size, bf_offset);
            let max_blocks = (bf_size as usize / 64).min(
                // The largest inline WQE: a WRITE of MAX_INLINE bytes.
                (inline_ds(16, MAX_INLINE as usize) * 16).div_ceil(64),
            );
            for k in 0..=max_blocks {
                assert!(
                    seen.by_blocks[k] > 0,
                    "bf_size {bf_size}, bf_offset {bf_offset}: no doorbell copied {k} blocks \
                     ({:?})",
                    seen.by_blocks
                );
            }
            assert!(
                seen.by_blocks[max_blocks + 1..].iter().all(|&n| n == 0),
                "bf_size {bf_size}: a copy beyond the buffer ({:?})",
                seen.by_blocks
            );
            if bf_size > 64 {
                assert!(
                    seen.wrapped > 0,
                    "bf_size {bf_size}: no BlueFlame copy wrapped at the end of the SQ"
                );
            }
            assert!(
                seen.buffers[0] > 0 && (bf_size == 0 || seen.buffers[1] > 0),
                "bf_size {bf_size}: both buffers alternate ({:?})",
                seen.buffers
            );
        }
    }
}

/// A 64-byte block of distinct bytes, then `Mmio::bf_block` and the trait's default
/// (eight 8-byte stores, what the recorder runs) into two 64-byte aligned blocks: the same
/// bytes in the same places, from a source only 8-aligned (as `bf_block` allows), and
/// nothing stored outside the block. On arm64 this is the check of the `ld4` / `st4` order.
#[test]
fn one_bf_block_lands_byte_for_byte() {
    #[repr(C, align(64))]
    struct Reg([u8; 192]);
    #[repr(C, align(64))]
    struct Src([u64; 10]);
    let mut src = Src([0; 10]);
    // Bytes 8..72 of the source: an 8-aligned, not 16-aligned, block.
    for (i, w) in src.0[1..9].iter_mut().enumerate() {
        *w = u64::from_ne_bytes(core::array::from_fn(|b| (i * 8 + b) as u8 ^ 0xa0));
    }
    let all = bytes_of(&src.0);
    let block = &all[8..72];
    let (mut hw, mut dflt) = (Reg([0xee; 192]), Reg([0xee; 192]));
    let mut rec = RecordingDoorbell::new(dflt.0.as_mut_ptr());
    // SAFETY: 64-byte aligned destinations (`Reg` is aligned, 64 is a multiple of 64) with
    // 64 writable bytes; 64 readable 8-aligned source bytes.
    unsafe {
        Mmio.bf_block(hw.0.as_mut_ptr().add(64).cast(), src.0.as_ptr().add(1));
        rec.bf_block(dflt.0.as_mut_ptr().add(64).cast(), src.0.as_ptr().add(1));
    }
    assert_eq!(&hw.0[64..128], block, "Mmio's copy");
    assert_eq!(&dflt.0[64..128], block, "the default copy");
    assert!(
        hw.0[..64].iter().chain(&hw.0[128..]).all(|&b| b == 0xee),
        "nothing outside the block"
    );
    let offsets: Vec<usize> = rec.stores().iter().map(|s| s.0).collect();
    assert_eq!(offsets, (0..8).map(|i| 64 + 8 * i).collect::<Vec<_>>());

    // The doorbell record and the 8-byte doorbell: one store each, the bytes as given.
    let mut dbr = 0u32;
    let mut db = 0u64;
    // SAFETY: aligned locals.
    unsafe {
        Mmio.write_dbr(&mut dbr, 0x1234_5678u32.to_be());
        Mmio.write64(&mut db, u64::from_ne_bytes(*b"ctrlword"));
    }
    assert_eq!(dbr.to_ne_bytes(), [0x12, 0x34, 0x56, 0x78]);
    assert_eq!(&db.to_ne_bytes(), b"ctrlword");
    // The barriers run (on the host's instructions) and store nothing.
    Mmio.to_device_barrier();
    Mmio.wc_start();
    Mmio.flush_writes();
}

fn bytes_of(w: &[u64]) -> Vec<u8> {
    w.iter().flat_map(|x| x.to_ne_bytes()).collect()
}
