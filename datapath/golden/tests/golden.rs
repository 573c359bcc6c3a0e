//! hotverbs' mlx5 direct path against libmlx5's own code, byte for byte.
//!
//! **Send side.** Random messages (every opcode the ring posts, inline payloads of 0 to
//! `max_inline` bytes including multi-block WQEs that wrap at the end of the SQ, inline
//! gather lists, 1 to `max_sge` data segments, chains of 1 to 64, RC and UD, thousands of
//! ring wraps) go through a [`DirectRing`] on one set of memory and, as the equivalent
//! `ibv_send_wr` chain, through libmlx5's `mlx5_post_send` on a fake QP whose SQ started
//! with the same bytes. After every chain: the whole SQ, the doorbell record, `cur_post`,
//! the BlueFlame offset, the `wrid` entries, the sequence of UAR stores (offset, size,
//! value) and the barriers (kind, doorbell record at that moment) must be equal. Every
//! fourth chain also goes through libmlx5's `ibv_wr_*` path on a third QP (equal except
//! `ctrl.imm` of opcodes without an immediate, which that path never writes).
//!
//! **Completions.** A simulated device completes the signaled WQEs of both QPs with the
//! same CQEs; [`DirectPoller`] and `mlx5_poll_cq` must report the same completions, which
//! then retire the ring's WRs. A second test writes random CQE streams (success of every
//! opcode, every error syndrome and unknown ones, flushes, the owner bit over many passes)
//! into both CQs and compares what the two pollers make of them.
//!
//! **CQ clean.** What a QP's move to RESET (or its destruction) does to its send CQ:
//! libmlx5's own `__mlx5_cq_clean` and [`DirectPoller::clean`] on identical CQs (random
//! CQEs of three QPs, random consumer indices, runs of 0 to `cqe_cnt - 1` unconsumed CQEs)
//! must leave the same bytes, consumer index and doorbell record; and libmlx5 must skip
//! the clean on a CQ marked as `mlx5dv_init_obj` marks it (why the direct poller cleans).
//!
//! **CQ arming.** [`arm_cq`](hotverbs_datapath::mlx5::arm_cq) against libmlx5's
//! `mlx5_arm_cq` for random consumer indices, arm sequence numbers, CQ numbers and both
//! commands: the same arm word in the doorbell record, UAR stores and barriers.
//!
//! **Flags, transports, CQE sizes.** One message in eight is fenced (`Msg::fence`,
//! `IBV_SEND_FENCE`) and one in eight solicited, on every shape; one shape is a UC QP
//! (libmlx5's `IBV_QPT_UC` case; SEND and RDMA WRITE only), and two shapes' send CQs have
//! 128-byte CQEs (`cq->cqe_sz = 128`: the pollers, the CQE streams and the CQ clean run on
//! both sizes).
//!
//! **Fixed-size paths.** One simple chain in four on an RC or UC QP is a chain of inline
//! SENDs of one length (1 to 44 bytes, one of `FIXED_LENS`: a const generic) without
//! flags, posted through a `DirectSession` (`send` / `send_imm`, SEND_IMMs too; libmlx5
//! posts each WR alone, as for a lone `send_now`), a `DirectWindow` (`push`, one doorbell
//! at `finish` or drop) or `post_list` (libmlx5: the chain as one list, only its last WR
//! possibly `IBV_SEND_SIGNALED`), and compared in everything the other ways are.
//!
//! **Planted bugs.** The same comparison with one wrong byte in a segment, with a
//! missing BlueFlame copy, and with the fence / solicited bits left out, must report
//! differences.
//!
//! Ends with `golden: <N> WRs and <M> CQEs compared, <D> differences (session <S>, window
//! <W>, post_list <P>)` (the WRs of each fixed-size path).

#[cfg(golden_missing)]
#[test]
fn skipped() {
    eprintln!("{}", hotverbs_mlx5_golden::SKIPPED);
}

#[cfg(not(golden_missing))]
mod real {
    use hotverbs_datapath::mlx5::{
        DirectCq, DirectSq, DirectUd, Doorbell, MmioEvent, RecordingDoorbell, CTRL_CQ_UPDATE,
    };
    use hotverbs_datapath::{
        wr_id, Completion, DirectPoller, DirectRing, Local, LocalBuf, Msg, Opcode, RemoteBuf,
        SendConfig,
    };
    use hotverbs_ffi::*;
    use hotverbs_mlx5_golden::{Barrier, Model, ModelCfg, Store, Wr};
    use hotverbs_softnic::mlx5sim::{Mlx5Sim, SimDevice};
    use std::sync::atomic::{AtomicU64, Ordering};

    const QPN: u32 = 0x0abc;
    const POISON: u8 = 0xcc;
    const RING_ID: u8 = 7;
    const DEPTH: u32 = 128;
    const SIGNAL: u32 = 16;

    static WRS: AtomicU64 = AtomicU64::new(0);
    /// WRs posted by each way (staged, `send_now` last, batch, staged), and lone `send_now`s.
    static HOW: [AtomicU64; 5] = [const { AtomicU64::new(0) }; 5];
    /// WRs posted through a `DirectSession`, a `DirectWindow` and `post_list` ([`Fixed`]).
    static FIXED: [AtomicU64; 4] = [const { AtomicU64::new(0) }; 4];
    /// `send_now`s of the lone runs that found the lone path open (`lone_ready`).
    static LONE_FAST: AtomicU64 = AtomicU64::new(0);
    static CQES: AtomicU64 = AtomicU64::new(0);
    /// WRs posted fenced, solicited, on a UC QP; completions read from 128-byte CQEs.
    static FENCED: AtomicU64 = AtomicU64::new(0);
    static SOLICITED: AtomicU64 = AtomicU64::new(0);
    static UC_WRS: AtomicU64 = AtomicU64::new(0);
    static CQE128: AtomicU64 = AtomicU64::new(0);
    static DIFFS: AtomicU64 = AtomicU64::new(0);
    /// Planted runs count their differences without printing them.
    static QUIET: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    /// What the comparison plants in our side, to prove it sees it.
    #[derive(Clone, Copy, Debug, PartialEq)]
    enum Plant {
        None,
        /// One byte of one segment of the newest WQE flipped after the ring wrote it.
        WrongByte,
        /// The BlueFlame copy replaced by the 8-byte doorbell.
        NoBlueFlame,
        /// Our messages posted without their fence / solicited flags.
        NoFlags,
    }

    /// A recording doorbell that can drop the BlueFlame copy (a planted bug).
    struct TestDoorbell {
        rec: RecordingDoorbell,
        no_bf: bool,
        in_copy: usize,
    }

    // SAFETY: forwards to RecordingDoorbell, which stores as the hardware doorbell does;
    // the planted mode only drops stores to plain memory.
    unsafe impl Doorbell for TestDoorbell {
        fn to_device_barrier(&mut self) {
            self.rec.to_device_barrier();
        }
        fn wc_start(&mut self) {
            self.in_copy = 0;
            self.rec.wc_start();
        }
        fn flush_writes(&mut self) {
            self.rec.flush_writes();
        }
        unsafe fn write_dbr(&mut self, dst: *mut u32, val: u32) {
            // SAFETY: forwarded contract.
            unsafe { self.rec.write_dbr(dst, val) }
        }
        unsafe fn write64(&mut self, dst: *mut u64, val: u64) {
            self.in_copy += 1;
            if self.no_bf && self.in_copy > 1 {
                return;
            }
            // SAFETY: forwarded contract.
            unsafe { self.rec.write64(dst, val) }
        }
    }

    /// Our side: simulated queues (same shape and initial bytes as the model's), the ring,
    /// the poller.
    struct Ours {
        sim: Box<Mlx5Sim>,
        ring: DirectRing<TestDoorbell>,
        poller: DirectPoller<64>,
    }

    struct Shape {
        ud: bool,
        /// UC (RC's WQEs; no READ, no atomics).
        uc: bool,
        wqe_cnt: u32,
        max_gs: u32,
        max_inline: u32,
        /// Bytes per CQE of the send CQ (64 or 128).
        cqe: u32,
    }

    fn model(s: &Shape) -> Model {
        Model::new(ModelCfg {
            ud: s.ud,
            uc: s.uc,
            wqe_cnt: s.wqe_cnt,
            max_gs: s.max_gs,
            max_inline: s.max_inline,
            qpn: QPN,
            cqe_cnt: 256,
            poison: POISON,
            cqe_size: s.cqe,
        })
    }

    fn ours(s: &Shape, remote: RemoteBuf, ud: Option<DirectUd>, plant: Plant) -> Ours {
        let mut sim = Box::new(Mlx5Sim::with_cqe_size(s.wqe_cnt, 256, QPN, s.cqe));
        let p = sim.ptrs();
        let sq = DirectSq {
            buf: p.sq,
            wqe_cnt: s.wqe_cnt,
            stride: 64,
            dbrec: p.qp_dbrec,
            bf_reg: p.bf_reg,
            bf_size: 256,
            bf_offset: 0,
            qp_num: QPN,
            ud: s.ud,
            uc: s.uc,
            max_inline: s.max_inline,
            max_sge: s.max_gs,
            wrid: p.wrid,
        };
        let mut cfg = SendConfig::new(RING_ID, DEPTH, s.max_inline)
            .signal_every(SIGNAL)
            .batch(DEPTH);
        if !s.ud {
            cfg = cfg.remote(remote);
        }
        let db = TestDoorbell {
            rec: RecordingDoorbell::new(p.bf_reg),
            no_bf: plant == Plant::NoBlueFlame,
            in_copy: 0,
        };
        // SAFETY: the boxed simulator outlives the ring and the poller, its only users.
        unsafe {
            let ring = DirectRing::with_doorbell(sq, cfg, ud, db).unwrap();
            let mut poller = DirectPoller::new(DirectCq {
                buf: p.cq,
                cqe_cnt: 256,
                cqe_size: s.cqe,
                dbrec: p.cq_dbrec,
                cqn: 1,
                cons_index: 0,
            })
            .unwrap();
            poller.attach(&sq).unwrap();
            Ours { sim, ring, poller }
        }
    }

    /// A message and how libmlx5 is to see it.
    struct Gen {
        msg_op: Opcode,
        imm: u32,
        remote_off: u64,
        compare_add: u64,
        swap: u64,
        kind: Payload,
        /// `Msg::fence` / `IBV_SEND_FENCE`.
        fence: bool,
        /// `Msg::solicited` / `IBV_SEND_SOLICITED`.
        solicited: bool,
    }

    enum Payload {
        Empty,
        Inline(Vec<u8>),
        InlineList(Vec<Vec<u8>>),
        Buf(LocalBuf),
        Sges(Vec<LocalBuf>),
    }

    fn gen(r: &mut Rng, s: &Shape, mem: &[u8]) -> Gen {
        let ops: &[Opcode] = if s.ud {
            &[Opcode::Send, Opcode::SendImm]
        } else if s.uc {
            &[
                Opcode::Send,
                Opcode::SendImm,
                Opcode::Write,
                Opcode::WriteImm,
            ]
        } else {
            &[
                Opcode::Send,
                Opcode::SendImm,
                Opcode::Write,
                Opcode::WriteImm,
                Opcode::Read,
                Opcode::FetchAdd,
                Opcode::CmpSwap,
            ]
        };
        let op = ops[r.below(ops.len() as u64) as usize];
        let atomic = matches!(op, Opcode::FetchAdd | Opcode::CmpSwap);
        let carries = matches!(
            op,
            Opcode::Send | Opcode::SendImm | Opcode::Write | Opcode::WriteImm
        );
        let real_buf = |r: &mut Rng, len: u32| -> LocalBuf {
            let off = r.below((mem.len() - len as usize) as u64 + 1);
            LocalBuf::new(mem.as_ptr() as u64 + off, len, r.next() as u32)
        };
        let kind = if atomic {
            Payload::Buf(LocalBuf::new(r.next() & !7, 8, r.next() as u32))
        } else if op == Opcode::Read {
            match r.below(3) {
                0 => Payload::Buf(LocalBuf::new(
                    r.next(),
                    (r.next() % 100_000) as u32 + 1,
                    r.next() as u32,
                )),
                1 => Payload::Sges(
                    (0..1 + r.below(s.max_gs as u64))
                        .map(|_| {
                            LocalBuf::new(
                                r.next(),
                                (r.next() % 5000) as u32 * (r.below(5).min(1)) as u32,
                                r.next() as u32,
                            )
                        })
                        .collect(),
                ),
                _ => Payload::Empty,
            }
        } else {
            match r.below(10) {
                0..=3 => {
                    // Small ones often (one block), up to max_inline (multi-block, wrap).
                    let max = if r.below(2) == 0 {
                        44.min(s.max_inline)
                    } else {
                        s.max_inline
                    };
                    let len = r.below(max as u64 + 1) as usize;
                    Payload::Inline((0..len).map(|_| r.next() as u8).collect())
                }
                4 => {
                    let mut left = r.below(s.max_inline as u64 + 1) as usize;
                    let n = 1 + r.below(4.min(s.max_gs as u64)) as usize;
                    let mut parts = Vec::new();
                    for i in 0..n {
                        let take = if i + 1 == n {
                            left
                        } else {
                            r.below(left as u64 + 1) as usize
                        };
                        left -= take;
                        parts.push((0..take).map(|_| r.next() as u8).collect());
                    }
                    Payload::InlineList(parts)
                }
                5 | 6 => {
                    // Registered memory: inlined by the ring when it fits max_inline.
                    let len = if r.below(2) == 0 {
                        r.below(s.max_inline as u64 + 1) as u32
                    } else {
                        r.below(4096) as u32
                    };
                    Payload::Buf(real_buf(r, len))
                }
                7 | 8 => Payload::Sges(
                    (0..1 + r.below(s.max_gs as u64))
                        .map(|_| {
                            let len = if r.below(6) == 0 {
                                0
                            } else {
                                (r.next() % 70_000) as u32
                            };
                            LocalBuf::new(r.next(), len, r.next() as u32)
                        })
                        .collect(),
                ),
                _ => Payload::Empty,
            }
        };
        let len: u64 = match &kind {
            Payload::Empty => 0,
            Payload::Inline(d) => d.len() as u64,
            Payload::InlineList(p) => p.iter().map(|x| x.len() as u64).sum(),
            Payload::Buf(b) => b.len as u64,
            Payload::Sges(l) => l.iter().map(|b| b.len as u64).sum(),
        };
        let remote_off = if atomic {
            r.below(1 << 30) & !7
        } else {
            r.below((1u64 << 40) - len)
        };
        let _ = carries;
        Gen {
            msg_op: op,
            imm: r.next() as u32,
            remote_off,
            compare_add: r.next(),
            swap: r.next(),
            kind,
            // One in eight fenced, one in eight solicited (any opcode: libmlx5 writes the
            // bits for any).
            fence: r.below(8) == 0,
            solicited: r.below(8) == 0,
        }
    }

    /// The fixed-size inline SEND paths of a ring (RC / UC, `LEN` a const generic).
    #[derive(Clone, Copy, Debug, PartialEq)]
    enum Fixed {
        /// `ring.session::<LEN>()`: each WR posted at once (`send` / `send_imm`), its own
        /// doorbell, signaled by the schedule; libmlx5 posts each WR alone.
        Session,
        /// `ring.window::<LEN>(max)`: one doorbell at `finish` / drop; only the last WQE
        /// may be signaled; libmlx5 posts the chain as one list.
        Window,
        /// `ring.post_list(&[[u8; LEN]])`: as a window.
        PostList,
        /// `ring.send_now` of each (`Msg::send` / `send_imm` of the `LEN` bytes): a lone run
        /// (the first post opens it unless one is open), each WR its own doorbell;
        /// libmlx5 posts each WR alone. The run is ended (`flush`) before the comparison:
        /// its `wrid` entries are written then.
        LoneRun,
    }

    /// The sizes the fixed-size paths are compiled for: one and two 16-byte inline units
    /// and the edges of each `ds` (2: up to 12 bytes, 3: up to 28, 4: up to 44).
    const FIXED_LENS: [usize; 9] = [1, 8, 12, 13, 16, 28, 29, 32, 44];

    /// Posts `gens` (inline SENDs, and SEND_IMMs for a session or lone run, of `LEN` bytes,
    /// no flags)
    /// through `way`; returns each WR's `cur_post` and sequence number.
    fn post_fixed<const LEN: usize>(
        ring: &mut DirectRing<TestDoorbell>,
        gens: &[Gen],
        way: Fixed,
        r: &mut Rng,
        chain_no: u64,
    ) -> (Vec<u32>, Vec<u64>) {
        let data = |g: &Gen| -> [u8; LEN] {
            match &g.kind {
                Payload::Inline(d) => d[..].try_into().expect("a LEN-byte payload"),
                _ => unreachable!("fixed chains are inline"),
            }
        };
        let fail = |e: hotverbs_datapath::SendError| -> u64 {
            panic!("chain {chain_no}: {way:?}::<{LEN}>: {e}")
        };
        let n = gens.len();
        let c0 = ring.cur_post();
        // Every WQE of these paths is one basic block.
        let curs = (0..n as u32).map(|i| c0.wrapping_add(i)).collect();
        let seqs = match way {
            Fixed::Session => {
                let mut ses = ring
                    .session::<LEN>()
                    .unwrap_or_else(|e| panic!("chain {chain_no}: session::<{LEN}>: {e}"));
                let seqs = gens
                    .iter()
                    .map(|g| {
                        if g.msg_op == Opcode::SendImm {
                            ses.send_imm(&data(g), g.imm)
                        } else {
                            ses.send(&data(g))
                        }
                        .unwrap_or_else(fail)
                    })
                    .collect();
                if r.below(2) == 0 {
                    ses.finish();
                } else {
                    drop(ses);
                }
                seqs
            }
            Fixed::Window => {
                // Sometimes more room asked for than used.
                let max = n + [0, 0, 1, 64][r.below(4) as usize];
                let mut w = ring
                    .window::<LEN>(max)
                    .unwrap_or_else(|e| panic!("chain {chain_no}: window::<{LEN}>: {e}"));
                let seqs = gens
                    .iter()
                    .map(|g| w.push(&data(g)).unwrap_or_else(fail))
                    .collect();
                if r.below(2) == 0 {
                    w.finish();
                } else {
                    drop(w);
                }
                seqs
            }
            Fixed::LoneRun => {
                let seqs = gens
                    .iter()
                    .map(|g| {
                        if ring.lone_ready() {
                            LONE_FAST.fetch_add(1, Ordering::Relaxed);
                        }
                        let d = data(g);
                        let m = if g.msg_op == Opcode::SendImm {
                            Msg::send_imm(Local::Inline(&d), g.imm)
                        } else {
                            Msg::send(Local::Inline(&d))
                        };
                        ring.send_now(m).unwrap_or_else(fail)
                    })
                    .collect();
                ring.flush().unwrap_or_else(|e| {
                    fail(e);
                });
                seqs
            }
            Fixed::PostList => {
                let seq0 = ring.posted_total();
                let msgs: Vec<[u8; LEN]> = gens.iter().map(data).collect();
                let k = ring.post_list(&msgs).unwrap_or_else(|e| {
                    fail(e);
                    0
                });
                assert_eq!(
                    k, n,
                    "chain {chain_no}: post_list::<{LEN}> posted {k} of {n}"
                );
                (0..n as u64).map(|i| seq0 + i).collect()
            }
        };
        (curs, seqs)
    }

    /// [`post_fixed`] for a `len` of [`FIXED_LENS`].
    fn post_fixed_len(
        len: usize,
        ring: &mut DirectRing<TestDoorbell>,
        gens: &[Gen],
        way: Fixed,
        r: &mut Rng,
        chain_no: u64,
    ) -> (Vec<u32>, Vec<u64>) {
        macro_rules! by_len {
            ($($l:literal)*) => {
                match len {
                    $($l => post_fixed::<$l>(ring, gens, way, r, chain_no),)*
                    _ => unreachable!("{len} is not in FIXED_LENS"),
                }
            };
        }
        by_len!(1 8 12 13 16 28 29 32 44)
    }

    /// A message `send_now` and a batch take: inline or empty, borrowing nothing.
    fn is_simple(g: &Gen) -> bool {
        matches!(g.kind, Payload::Empty | Payload::Inline(_)) && msg(g).is_borrow_free()
    }

    fn msg<'a>(g: &'a Gen) -> Msg<'a> {
        let m = plain_msg(g);
        let m = if g.fence { m.fence() } else { m };
        if g.solicited {
            m.solicited()
        } else {
            m
        }
    }

    /// [`msg`], or the message without its flags for [`Plant::NoFlags`].
    fn our_msg<'a>(g: &'a Gen, plant: Plant) -> Msg<'a> {
        if plant == Plant::NoFlags {
            plain_msg(g)
        } else {
            msg(g)
        }
    }

    fn plain_msg<'a>(g: &'a Gen) -> Msg<'a> {
        let local = match &g.kind {
            Payload::Empty | Payload::InlineList(_) | Payload::Sges(_) => Local::Empty,
            Payload::Inline(d) => Local::Inline(d),
            Payload::Buf(b) => Local::Buf(*b),
        };
        match g.msg_op {
            Opcode::Send => Msg::send(local),
            Opcode::SendImm => Msg::send_imm(local, g.imm),
            Opcode::Write => Msg::write(local, g.remote_off),
            Opcode::WriteImm => Msg::write_imm(local, g.remote_off, g.imm),
            Opcode::Read => match local {
                Local::Buf(b) => Msg::read(b, g.remote_off),
                _ => Msg::read(LocalBuf::new(0, 0, 0), g.remote_off),
            },
            Opcode::FetchAdd => match local {
                Local::Buf(b) => Msg::fetch_add(b, g.remote_off, g.compare_add),
                _ => unreachable!(),
            },
            Opcode::CmpSwap => match local {
                Local::Buf(b) => Msg::cmp_swap(b, g.remote_off, g.compare_add, g.swap),
                _ => unreachable!(),
            },
            _ => unreachable!("an opcode this test does not generate"),
        }
    }

    fn ibv_opcode(op: Opcode) -> u32 {
        match op {
            Opcode::Send => IBV_WR_SEND,
            Opcode::SendImm => IBV_WR_SEND_WITH_IMM,
            Opcode::Write => IBV_WR_RDMA_WRITE,
            Opcode::WriteImm => IBV_WR_RDMA_WRITE_WITH_IMM,
            Opcode::Read => IBV_WR_RDMA_READ,
            Opcode::FetchAdd => IBV_WR_ATOMIC_FETCH_AND_ADD,
            Opcode::CmpSwap => IBV_WR_ATOMIC_CMP_AND_SWP,
            _ => unreachable!("an opcode this test does not generate"),
        }
    }

    /// Reports a difference in full (the first few), counts every one.
    fn diff(what: &str, detail: String) {
        let n = DIFFS.fetch_add(1, Ordering::Relaxed);
        if n < 8 && !QUIET.load(Ordering::Relaxed) {
            eprintln!("golden DIFFERENCE: {what}\n{detail}");
        }
    }

    fn hex(b: &[u8]) -> String {
        b.chunks(16)
            .map(|c| {
                c.iter()
                    .map(|x| format!("{x:02x}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .collect::<Vec<_>>()
            .join("\n  ")
    }

    /// Our recorded doorbell events as libmlx5's (stores; barriers with the doorbell
    /// record at that moment), from `dbr0` (the record before the post).
    fn our_log(ev: &[MmioEvent], mut dbr: u32) -> (Vec<Store>, Vec<Barrier>) {
        let (mut st, mut ba) = (Vec::new(), Vec::new());
        for e in ev {
            match *e {
                MmioEvent::ToDeviceBarrier => ba.push(Barrier { kind: 1, dbr }),
                MmioEvent::WcStart => ba.push(Barrier { kind: 2, dbr }),
                MmioEvent::FlushWrites => ba.push(Barrier { kind: 3, dbr }),
                MmioEvent::Dbr(v) => dbr = v,
                MmioEvent::Store64 { offset, raw } => st.push(Store {
                    off: offset as i64,
                    size: 8,
                    raw,
                }),
            }
        }
        (st, ba)
    }

    fn compare_wc(what: &str, ours: &Completion, theirs: &ibv_wc) {
        let o = ours.as_raw();
        let ok = o.wr_id == theirs.wr_id
            && o.status == theirs.status
            && o.qp_num == theirs.qp_num
            && if theirs.status == IBV_WC_SUCCESS {
                o.opcode == theirs.opcode
                    && o.wc_flags == theirs.wc_flags
                    && (!matches!(
                        theirs.opcode,
                        IBV_WC_RDMA_READ | IBV_WC_COMP_SWAP | IBV_WC_FETCH_ADD
                    ) || o.byte_len == theirs.byte_len)
            } else {
                o.vendor_err == theirs.vendor_err
            };
        if !ok {
            diff(
                what,
                format!(
                    "  ours:    wr_id {:#x} status {} opcode {} wc_flags {:#x} byte_len {} qp_num {:#x} vendor_err {:#x}\n  libmlx5: wr_id {:#x} status {} opcode {} wc_flags {:#x} byte_len {} qp_num {:#x} vendor_err {:#x}",
                    o.wr_id, o.status, o.opcode, o.wc_flags, o.byte_len, o.qp_num, o.vendor_err,
                    theirs.wr_id, theirs.status, theirs.opcode, theirs.wc_flags, theirs.byte_len, theirs.qp_num, theirs.vendor_err
                ),
            );
        }
    }

    /// Runs `chains` random chains on one shape; returns WRs compared.
    fn run(seed: u64, s: &Shape, wr_target: u64, plant: Plant) -> u64 {
        let mut r = Rng(seed);
        let mem: Vec<u8> = (0..1 << 20).map(|i| (i * 7 + 3) as u8).collect();
        let remote = RemoteBuf::new(0x5500_0000_0000, 1 << 40, 0x3330_1234);
        let mut lib = model(s);
        let mut ex = model(s);
        let av: [u8; 48] = std::array::from_fn(|i| (i as u8).wrapping_mul(37) ^ 0x5a);
        let (ah, ah_ex) = if s.ud {
            (lib.new_ah(&av), ex.new_ah(&av))
        } else {
            (std::ptr::null_mut(), std::ptr::null_mut())
        };
        let (remote_qpn, qkey) = (0x00ab_cdef, 0x1111_2222);
        let ud = s.ud.then_some(DirectUd {
            av: av.as_ptr(),
            remote_qpn,
            remote_qkey: qkey,
        });
        let mut us = ours(s, remote, ud, plant);
        // The simulated device over libmlx5's memory, completing its signaled WQEs.
        // SAFETY: the model's memory lives as long as `lib`.
        let mut lib_dev = unsafe {
            SimDevice::new(
                lib.sq().as_ptr(),
                s.wqe_cnt,
                lib.qp_dbrec(),
                lib.cq_buf(),
                256,
                QPN,
            )
            .cqe_size(s.cqe)
        };
        let mut wrs = 0u64;
        let mut chain_no = 0u64;
        while wrs < wr_target {
            chain_no += 1;
            // One chain in three borrows nothing (inline or empty messages only), so that
            // the `send_now` and batch ways below get their share; half of those are one
            // message (the lone `send_now`).
            let simple_chain = r.below(3) == 0;
            let n = if r.below(if simple_chain { 2 } else { 3 }) == 0 {
                1
            } else {
                1 + r.below(64)
            } as usize;
            // One simple chain in four on an RC / UC QP is the fixed-size paths': inline
            // SENDs (and SEND_IMMs for a session) of one length in FIXED_LENS, no flags.
            let fixed = (simple_chain && !s.ud && r.below(4) == 0).then(|| {
                let way = [
                    Fixed::Session,
                    Fixed::Window,
                    Fixed::PostList,
                    Fixed::LoneRun,
                ][r.below(4) as usize];
                let len = FIXED_LENS[r.below(FIXED_LENS.len() as u64) as usize];
                (way, len)
            });
            let gens: Vec<Gen> = match fixed {
                Some((way, len)) => (0..n)
                    .map(|_| Gen {
                        msg_op: if matches!(way, Fixed::Session | Fixed::LoneRun) && r.below(4) == 0
                        {
                            Opcode::SendImm
                        } else {
                            Opcode::Send
                        },
                        imm: r.next() as u32,
                        remote_off: 0,
                        compare_add: 0,
                        swap: 0,
                        kind: Payload::Inline((0..len).map(|_| r.next() as u8).collect()),
                        fence: false,
                        solicited: false,
                    })
                    .collect(),
                None => (0..n)
                    .map(|_| loop {
                        let g = gen(&mut r, s, &mem);
                        if !simple_chain || is_simple(&g) {
                            break g;
                        }
                    })
                    .collect(),
            };
            let dbr0 = lib.dbr();
            us.ring.doorbell().rec.events.clear();
            let mut seqs = Vec::with_capacity(n);
            let mut curs = Vec::with_capacity(n);
            // How our side posts the chain (libmlx5's side is always one ibv_post_send
            // chain, and each way must give its bytes and stores): staged then `flush`;
            // or, for messages that borrow nothing, `send_now` for the last one (the lone
            // path when nothing is staged before it), or a batch (finished or dropped).
            let simple = gens.iter().all(is_simple);
            let how = match (simple, n) {
                (false, _) => 0,
                (true, 1) => [0, 1, 1, 2][r.below(4) as usize],
                (true, _) => r.below(4),
            };
            if let Some((way, len)) = fixed {
                if plant == Plant::None {
                    FIXED[way as usize].fetch_add(n as u64, Ordering::Relaxed);
                }
                (curs, seqs) = post_fixed_len(len, &mut us.ring, &gens, way, &mut r, chain_no);
            } else if plant == Plant::None {
                // The planted runs count toward no total (whichever test runs first).
                HOW[how as usize].fetch_add(n as u64, Ordering::Relaxed);
                if how == 1 && n == 1 {
                    HOW[4].fetch_add(1, Ordering::Relaxed);
                }
            }
            if fixed.is_some() {
                // Posted above.
            } else if how == 2 {
                let mut b = us.ring.batch();
                for g in &gens {
                    curs.push(b.cur_post());
                    let seq = b
                        .push(our_msg(g, plant))
                        .unwrap_or_else(|e| panic!("chain {chain_no}: {e} ({:?})", g.msg_op));
                    seqs.push(seq);
                }
                if r.below(2) == 0 {
                    b.finish().unwrap();
                } else {
                    drop(b);
                }
            } else {
                for (i, g) in gens.iter().enumerate() {
                    curs.push(us.ring.cur_post());
                    let m = our_msg(g, plant);
                    // SAFETY: registered-memory payloads point into `mem` (inlined ones) or
                    // are never dereferenced (the simulated device reads no data).
                    let seq = unsafe {
                        match &g.kind {
                            Payload::InlineList(p) => {
                                let parts: Vec<&[u8]> = p.iter().map(|x| &x[..]).collect();
                                us.ring.stage_inline_gather(m, &parts)
                            }
                            Payload::Sges(l) => us.ring.stage_gather(m, l),
                            _ if how == 1 && i + 1 == n => us.ring.send_now(m),
                            _ => us.ring.stage(m),
                        }
                    }
                    .unwrap_or_else(|e| panic!("chain {chain_no}: {e} ({:?})", g.msg_op));
                    seqs.push(seq);
                }
            }
            if plant == Plant::WrongByte && n > 0 {
                // One byte of the newest WQE's second segment (raddr, datagram or data).
                let at =
                    (curs[n - 1] & (s.wqe_cnt - 1)) as usize * 64 + 16 + (chain_no as usize % 8);
                // SAFETY: inside the simulator's SQ.
                unsafe { *us.sim.ptrs().sq.add(at) ^= 0x40 };
            }
            us.ring.flush().unwrap();
            // The same chain for libmlx5.
            let our_sq = us.sim.sq().to_vec();
            let mut sge_store: Vec<Vec<ibv_sge>> = Vec::with_capacity(n);
            let mut lib_wrs = Vec::with_capacity(n);
            for (i, g) in gens.iter().enumerate() {
                let idx = (curs[i] & (s.wqe_cnt - 1)) as usize * 64;
                // A window / post_list may signal its last WQE only (libmlx5: the same list
                // with IBV_SEND_SIGNALED on that WR alone).
                let signaled = our_sq[idx + 11] & CTRL_CQ_UPDATE != 0
                    && (i + 1 == n || !matches!(fixed, Some((Fixed::Window | Fixed::PostList, _))));
                let carries = matches!(
                    g.msg_op,
                    Opcode::Send | Opcode::SendImm | Opcode::Write | Opcode::WriteImm
                );
                let (sges, inline): (Vec<ibv_sge>, bool) = match &g.kind {
                    Payload::Empty => (vec![], false),
                    Payload::Inline(d) => (
                        vec![ibv_sge {
                            addr: d.as_ptr() as u64,
                            length: d.len() as u32,
                            lkey: 0,
                        }],
                        true,
                    ),
                    Payload::InlineList(p) => (
                        p.iter()
                            .map(|d| ibv_sge {
                                addr: d.as_ptr() as u64,
                                length: d.len() as u32,
                                lkey: 0,
                            })
                            .collect(),
                        true,
                    ),
                    Payload::Buf(b) => (
                        vec![ibv_sge {
                            addr: b.addr,
                            length: b.len,
                            lkey: b.lkey,
                        }],
                        carries && b.len <= s.max_inline,
                    ),
                    Payload::Sges(l) => (
                        l.iter()
                            .map(|b| ibv_sge {
                                addr: b.addr,
                                length: b.len,
                                lkey: b.lkey,
                            })
                            .collect(),
                        false,
                    ),
                };
                sge_store.push(sges);
                let sg = sge_store.last().unwrap();
                lib_wrs.push(Wr {
                    wr_id: wr_id::encode(RING_ID, seqs[i]),
                    opcode: ibv_opcode(g.msg_op),
                    send_flags: if inline { IBV_SEND_INLINE } else { 0 }
                        | if signaled { IBV_SEND_SIGNALED } else { 0 }
                        | if g.fence { IBV_SEND_FENCE } else { 0 }
                        | if g.solicited { IBV_SEND_SOLICITED } else { 0 },
                    imm_be: g.imm.to_be(),
                    rkey: remote.rkey,
                    remote_addr: remote.addr.wrapping_add(g.remote_off),
                    compare_add: g.compare_add,
                    swap: g.swap,
                    sges: sg.as_ptr(),
                    num_sge: sg.len() as u32,
                    remote_qpn,
                    remote_qkey: qkey,
                    pad: 0,
                    ah,
                });
            }
            let pre = lib.sq().to_vec();
            lib.record();
            // A session's WRs are posted one at a time (each with its own doorbell, as a
            // lone send_now); every other way's as one list.
            let posted = if matches!(fixed, Some((Fixed::Session | Fixed::LoneRun, _))) {
                (0..n).try_for_each(|i| {
                    // SAFETY: inline SGEs point at live vectors.
                    unsafe { lib.post_send(&lib_wrs[i..=i]) }.map_err(|(rc, _)| (rc, i as i32))
                })
            } else {
                // SAFETY: inline SGEs point at live vectors; the AH is the model's.
                unsafe { lib.post_send(&lib_wrs) }
            };
            if let Err((rc, bad)) = posted {
                let w = &lib_wrs[bad.max(0) as usize];
                // SAFETY: the WR's SGE list is live.
                let sg: Vec<(u64, u32)> =
                    unsafe { std::slice::from_raw_parts(w.sges, w.num_sge as usize) }
                        .iter()
                        .map(|g| (g.addr, g.length))
                        .collect();
                panic!(
                    "mlx5_post_send refused chain {chain_no}: errno {rc} at WR {bad}: {w:x?} {sg:?}"
                );
            }
            let (lib_st, lib_ba) = (lib.stores(), lib.barriers());
            lib.record();
            let (our_st, our_ba) = our_log(&us.ring.doorbell().rec.events, dbr0);
            // Compare.
            let their_sq = lib.sq();
            if our_sq != their_sq {
                let first = our_sq
                    .iter()
                    .zip(their_sq)
                    .position(|(a, b)| a != b)
                    .unwrap();
                let blk = first / 64 * 64;
                diff(
                    &format!("SQ bytes, chain {chain_no} (seed {seed:#x}), first at byte {first} (block {})", first / 64),
                    format!("  ours:    {}\n  libmlx5: {}", hex(&our_sq[blk..blk + 64]), hex(&their_sq[blk..blk + 64])),
                );
                // Go on from libmlx5's bytes.
                // SAFETY: the simulator's SQ has exactly this length.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        their_sq.as_ptr(),
                        us.sim.ptrs().sq,
                        their_sq.len(),
                    )
                };
            }
            if us.sim.sq_dbr() != lib.dbr() || us.ring.cur_post() != lib.cur_post() {
                diff(
                    &format!("doorbell record / cur_post, chain {chain_no}"),
                    format!(
                        "  ours {} / {}, libmlx5 {} / {}",
                        us.sim.sq_dbr(),
                        us.ring.cur_post(),
                        lib.dbr(),
                        lib.cur_post()
                    ),
                );
            }
            if us.ring.bf_offset() != lib.bf_offset() {
                diff(
                    &format!("bf offset, chain {chain_no}"),
                    format!("  ours {} libmlx5 {}", us.ring.bf_offset(), lib.bf_offset()),
                );
            }
            if our_st != lib_st {
                diff(
                    &format!("UAR stores, chain {chain_no} ({n} WRs)"),
                    format!("  ours:    {our_st:x?}\n  libmlx5: {lib_st:x?}"),
                );
            }
            if our_ba != lib_ba {
                diff(
                    &format!("barriers, chain {chain_no}"),
                    format!("  ours:    {our_ba:?}\n  libmlx5: {lib_ba:?}"),
                );
            }
            let ours_wrid: Vec<u64> = curs
                .iter()
                // SAFETY: the simulator's wrid table has wqe_cnt entries.
                .map(|c| unsafe { *us.sim.ptrs().wrid.add((c & (s.wqe_cnt - 1)) as usize) })
                .collect();
            let lib_wrid: Vec<u64> = curs
                .iter()
                .map(|c| lib.wrid()[(c & (s.wqe_cnt - 1)) as usize])
                .collect();
            if ours_wrid != lib_wrid {
                diff(
                    &format!("wrid, chain {chain_no}"),
                    format!("  ours {ours_wrid:x?}\n  libmlx5 {lib_wrid:x?}"),
                );
            }
            // The extended path on a third QP that follows the same chains: equal SQ bytes
            // and doorbell record, except `ctrl.imm` of opcodes without an immediate (that
            // path never writes it; legacy writes 0).
            if plant == Plant::None {
                let ex_wrs: Vec<Wr> = lib_wrs
                    .iter()
                    .map(|w| Wr {
                        ah: if s.ud { ah_ex } else { std::ptr::null_mut() },
                        ..*w
                    })
                    .collect();
                // The same starting bytes (stale bytes the WQEs do not cover included).
                ex.sq_mut().copy_from_slice(&pre);
                let before = ex.cur_post();
                if before != curs[0] {
                    diff(
                        &format!("ibv_wr_* cur_post, chain {chain_no}"),
                        format!("  {before} vs {}", curs[0]),
                    );
                }
                // SAFETY: as for post_send.
                unsafe { ex.post_ex(&ex_wrs) }.unwrap_or_else(|rc| panic!("ibv_wr_complete: {rc}"));
                let mut exq = ex.sq().to_vec();
                for (c, w) in curs.iter().zip(&lib_wrs) {
                    let at = (c & (s.wqe_cnt - 1)) as usize * 64;
                    if !matches!(w.opcode, IBV_WR_SEND_WITH_IMM | IBV_WR_RDMA_WRITE_WITH_IMM) {
                        exq[at + 12..at + 16].copy_from_slice(&lib.sq()[at + 12..at + 16]);
                    }
                }
                // Compare the blocks of this chain.
                let mut bad = None;
                let mut b = before;
                while b != lib.cur_post() {
                    let at = (b & (s.wqe_cnt - 1)) as usize * 64;
                    if exq[at..at + 64] != lib.sq()[at..at + 64] {
                        bad = Some(at);
                        break;
                    }
                    b = b.wrapping_add(1);
                }
                if let Some(at) = bad {
                    diff(
                        &format!(
                            "ibv_wr_* SQ bytes, chain {chain_no}, block {} (WQE starts {:?}, ops {:?})",
                            at / 64,
                            curs.iter().map(|c| c & (s.wqe_cnt - 1)).collect::<Vec<_>>(),
                            lib_wrs.iter().map(|w| w.opcode).collect::<Vec<_>>()
                        ),
                        format!("  ibv_wr_*: {}\n  legacy:   {}", hex(&exq[at..at + 64]), hex(&lib.sq()[at..at + 64])),
                    );
                }
                if ex.dbr() != lib.dbr() {
                    diff(
                        &format!("ibv_wr_* doorbell record, chain {chain_no}"),
                        format!("  {} vs {}", ex.dbr(), lib.dbr()),
                    );
                }
                ex.drain();
            }
            // Completions: the device completes both sides' signaled WQEs alike.
            let k_ours = us.sim.process();
            let k_lib = lib_dev.process();
            assert_eq!(k_ours, k_lib, "CQEs written for chain {chain_no}");
            let theirs = lib.poll_cq(64);
            let mut got = [Completion::PLACEHOLDER; 64];
            let k = us.poller.poll_into(&mut got).unwrap();
            if k != theirs.len() {
                diff(
                    &format!("completion count, chain {chain_no}"),
                    format!("  ours {k} libmlx5 {}", theirs.len()),
                );
            }
            for (o, t) in got[..k.min(theirs.len())].iter().zip(&theirs) {
                compare_wc(&format!("completion, chain {chain_no}"), o, t);
                CQES.fetch_add(1, Ordering::Relaxed);
                if s.cqe == 128 && plant == Plant::None {
                    CQE128.fetch_add(1, Ordering::Relaxed);
                }
            }
            for c in &got[..k] {
                us.ring.on_completion(c).unwrap();
            }
            lib.drain();
            wrs += n as u64;
            if plant == Plant::None {
                let count = |f: fn(&Gen) -> bool| gens.iter().filter(|g| f(g)).count() as u64;
                FENCED.fetch_add(count(|g| g.fence), Ordering::Relaxed);
                SOLICITED.fetch_add(count(|g| g.solicited), Ordering::Relaxed);
                if s.uc {
                    UC_WRS.fetch_add(n as u64, Ordering::Relaxed);
                }
            }
        }
        wrs
    }

    /// RC, UC and UD queues; the send CQ has 128-byte CQEs in two of them.
    const SHAPES: [Shape; 5] = [
        Shape {
            ud: false,
            uc: false,
            wqe_cnt: 1024,
            max_gs: 4,
            max_inline: 188,
            cqe: 64,
        },
        Shape {
            ud: false,
            uc: false,
            wqe_cnt: 512,
            max_gs: 8,
            max_inline: 60,
            cqe: 128,
        },
        Shape {
            ud: true,
            uc: false,
            wqe_cnt: 1024,
            max_gs: 2,
            max_inline: 120,
            cqe: 64,
        },
        Shape {
            ud: false,
            uc: false,
            wqe_cnt: 2048,
            max_gs: 16,
            max_inline: 412,
            cqe: 64,
        },
        Shape {
            ud: false,
            uc: true,
            wqe_cnt: 1024,
            max_gs: 4,
            max_inline: 124,
            cqe: 128,
        },
    ];

    #[test]
    fn a_million_random_wrs_equal_libmlx5s() {
        // One test at a time in this process: the C model's hooks record into one place.
        let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let per_shape = std::env::var("HOTVERBS_GOLDEN_WRS")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(1_000_000)
            / SHAPES.len() as u64;
        let mut total = 0;
        for (i, s) in SHAPES.iter().enumerate() {
            total += run(
                0x9e37_79b9_7f4a_7c15 ^ (i as u64 * 0x1234_5678_9abc),
                s,
                per_shape,
                Plant::None,
            );
        }
        WRS.fetch_add(total, Ordering::Relaxed);
        cqe_streams(100_000, 64);
        cqe_streams(100_000, 128);
        println!(
            "golden: WRs staged then flushed {}, ending with send_now {} ({} of them lone), \
             in batches {}",
            HOW[0].load(Ordering::Relaxed) + HOW[3].load(Ordering::Relaxed),
            HOW[1].load(Ordering::Relaxed),
            HOW[4].load(Ordering::Relaxed),
            HOW[2].load(Ordering::Relaxed)
        );
        println!(
            "golden: of them fenced {}, solicited {}, on a UC QP {}; completions from 128-byte \
             CQEs {}",
            FENCED.load(Ordering::Relaxed),
            SOLICITED.load(Ordering::Relaxed),
            UC_WRS.load(Ordering::Relaxed),
            CQE128.load(Ordering::Relaxed)
        );
        let (cleans, freed) = clean_streams(10_000, 64);
        let (cleans128, freed128) = clean_streams(10_000, 128);
        println!(
            "golden: {cleans} CQ cleans compared ({freed} CQEs removed), and {cleans128} of \
             128-byte CQEs ({freed128} removed)"
        );
        let arms = arm_streams(5_000);
        println!("golden: {arms} CQ arms compared");
        let (w, c, d) = (
            WRS.load(Ordering::Relaxed),
            CQES.load(Ordering::Relaxed),
            DIFFS.load(Ordering::Relaxed),
        );
        let fixed = |w: Fixed| FIXED[w as usize].load(Ordering::Relaxed);
        println!(
            "golden: {w} WRs and {c} CQEs compared, {d} differences (session {}, window {}, \
             post_list {}, lone run {}: {} on the lone path)",
            fixed(Fixed::Session),
            fixed(Fixed::Window),
            fixed(Fixed::PostList),
            fixed(Fixed::LoneRun),
            LONE_FAST.load(Ordering::Relaxed)
        );
        assert!(
            LONE_FAST.load(Ordering::Relaxed) > 1000
                || std::env::var("HOTVERBS_GOLDEN_WRS").is_ok(),
            "the lone runs took the lone path"
        );
        assert_eq!(d, 0, "golden: {d} differences (printed above)");
        assert!(
            w >= 1_000_000 || std::env::var("HOTVERBS_GOLDEN_WRS").is_ok(),
            "{w} WRs"
        );
    }

    /// Random CQE streams into both CQs (CQEs of `cqe` bytes); both pollers must agree.
    fn cqe_streams(target: u64, cqe: u32) {
        let mut r = Rng(0x5eed_cafe_f00d_0001 ^ cqe as u64);
        let s = Shape {
            ud: false,
            uc: false,
            wqe_cnt: 256,
            max_gs: 4,
            max_inline: 64,
            cqe,
        };
        let mut lib = model(&s);
        let mut sim = Box::new(Mlx5Sim::with_cqe_size(256, 256, QPN, cqe));
        let p = sim.ptrs();
        for i in 0..256 {
            let v = r.next();
            lib.wrid_mut()[i] = v;
            // SAFETY: the simulator's wrid table has 256 entries.
            unsafe { *p.wrid.add(i) = v };
        }
        // SAFETY: the simulator outlives the poller.
        let mut poller = unsafe {
            let mut q = DirectPoller::<64>::new(DirectCq {
                buf: p.cq,
                cqe_cnt: 256,
                cqe_size: cqe,
                dbrec: p.cq_dbrec,
                cqn: 1,
                cons_index: 0,
            })
            .unwrap();
            q.attach(&DirectSq {
                buf: p.sq,
                wqe_cnt: 256,
                stride: 64,
                dbrec: p.qp_dbrec,
                bf_reg: p.bf_reg,
                bf_size: 256,
                bf_offset: 0,
                qp_num: QPN,
                ud: false,
                uc: false,
                max_inline: 64,
                max_sge: 4,
                wrid: p.wrid,
            })
            .unwrap();
            q
        };
        // SAFETY: the model's CQ lives as long as `lib`.
        let mut lib_dev = unsafe {
            SimDevice::new(
                lib.sq().as_ptr(),
                256,
                lib.qp_dbrec(),
                lib.cq_buf(),
                256,
                QPN,
            )
            .cqe_size(cqe)
        };
        let syndromes = [
            0x01u8, 0x02, 0x04, 0x05, 0x06, 0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x22, 0x07,
            0x30, 0xff,
        ];
        let wqe_ops = [0x08u8, 0x09, 0x0a, 0x0b, 0x10, 0x11, 0x12];
        let mut compared = 0u64;
        let mut outstanding = 0u32;
        while compared < target {
            // Write up to the CQ's free room, never past what the pollers consumed.
            let room = 256 - outstanding;
            let k = r.below(room as u64 + 1) as u32;
            for _ in 0..k {
                let err = r.below(4) == 0;
                let op = if err { 13 } else { 0 };
                let wop = wqe_ops[r.below(wqe_ops.len() as u64) as usize];
                let ctr = r.next() as u16;
                let syn = syndromes[r.below(syndromes.len() as u64) as usize];
                let vendor = r.next() as u8;
                sim.write_cqe(op, wop, ctr, syn, vendor);
                lib_dev.write_cqe(op, wop, ctr, syn, vendor);
            }
            outstanding += k;
            // Drain in random batch sizes.
            while outstanding > 0 {
                let b = 1 + r.below(64) as usize;
                let theirs = lib.poll_cq(b);
                let mut got = [Completion::PLACEHOLDER; 64];
                let n = poller.poll_into(&mut got[..b]).unwrap();
                if n != theirs.len() {
                    diff(
                        "CQE stream: completion count",
                        format!("  ours {n} libmlx5 {}", theirs.len()),
                    );
                    return;
                }
                for (o, t) in got[..n].iter().zip(&theirs) {
                    compare_wc("CQE stream", o, t);
                }
                compared += n as u64;
                outstanding -= n as u32;
                if n == 0 {
                    break;
                }
            }
            if poller.cons_index() != lib.cons_index()
                || sim.cq_ci()
                    != u32::from_be(
                        // SAFETY: the model's CQ doorbell record.
                        unsafe { lib.cq_dbrec().read_volatile() },
                    )
            {
                diff(
                    "CQ consumer index / doorbell record",
                    format!(
                        "  ours {} libmlx5 {}",
                        poller.cons_index(),
                        lib.cons_index()
                    ),
                );
            }
        }
        CQES.fetch_add(compared, Ordering::Relaxed);
        if cqe == 128 {
            CQE128.fetch_add(compared, Ordering::Relaxed);
        }
    }

    /// libmlx5's `__mlx5_cq_clean` against [`DirectPoller::clean`] on identical CQs.
    /// Each round fills both CQ buffers with the same random bytes, then writes from a
    /// random consumer index (both owner-bit passes, the 32-bit wrap) a run of 0 to
    /// `cqe_cnt - 1` CQEs of three QPs (requester, error and other opcodes, random format
    /// bits), ended by an unwritten entry or one of the previous pass, and cleans one of
    /// the QPs on both sides. Every 64th round first checks that libmlx5 leaves a CQ
    /// marked `MLX5_CQ_FLAGS_DV_OWNED` alone. Returns (cleans compared, CQEs removed).
    fn clean_streams(rounds: u64, cqe: u32) -> (u64, u64) {
        const N: u32 = 256;
        // Bytes per CQE; the fields (owner byte, QP number) in the last 64 of each.
        let sz = cqe as usize;
        let mut r = Rng(0xc1ea_0000_5eed_0002 ^ cqe as u64);
        let mut lib = model(&Shape {
            ud: false,
            uc: false,
            wqe_cnt: 256,
            max_gs: 4,
            max_inline: 64,
            cqe,
        });
        let qpns = [QPN, QPN + 1, 0x00ab_cdef];
        let mut ours_buf = vec![0u64; N as usize * sz / 8];
        let mut ours_db = [0u32; 2];
        let mut freed_total = 0u64;
        for round in 0..rounds {
            let lib_buf = lib.cq_buf();
            for (i, slot) in ours_buf.iter_mut().enumerate() {
                let v = r.next();
                *slot = v;
                // SAFETY: the model's CQ buffer has N * sz bytes.
                unsafe { lib_buf.cast::<u64>().add(i).write_unaligned(v) };
            }
            let ours = ours_buf.as_mut_ptr().cast::<u8>();
            // Away from i32::MAX: libmlx5 compares indices as `int` differences.
            let cons =
                (r.next() as u32 & 0x3fff_ffff) ^ if r.below(2) == 0 { 0 } else { 0xc000_0000 };
            let run = r.below(N as u64) as u32;
            let put = |at: u32, op_own: u8, sop: u32| {
                let off = (at & (N - 1)) as usize * sz + sz - 64;
                for b in [ours, lib_buf] {
                    // SAFETY: inside both N * sz-byte buffers.
                    unsafe {
                        b.add(off + 63).write(op_own);
                        b.add(off + 56).cast::<u32>().write_unaligned(sop.to_be());
                    }
                }
            };
            for k in 0..run {
                let at = cons.wrapping_add(k);
                let owner = (at & N != 0) as u8;
                let opcode = match r.below(8) {
                    0..=4 => 0u8,
                    5 | 6 => 13,
                    _ => 2,
                };
                let qpn = qpns[r.below(3) as usize];
                let wop = r.next() as u32 & 0x1f;
                put(
                    at,
                    opcode << 4 | (r.next() as u8 & 0x0e) | owner,
                    wop << 24 | qpn,
                );
            }
            let end = cons.wrapping_add(run);
            let stale_owner = (end & N == 0) as u8;
            if r.below(2) == 0 {
                put(end, 0xf0 | (r.next() as u8 & 1), r.next() as u32);
            } else {
                put(end, (r.next() as u8 & 0xd0) | stale_owner, r.next() as u32);
            }
            let db0 = r.next() as u32;
            ours_db[0] = db0;
            // SAFETY: the model's CQ doorbell record.
            unsafe { lib.cq_dbrec().write_volatile(db0) };
            let qpn = qpns[r.below(3) as usize];
            if round % 64 == 0 {
                // SAFETY: reading the model's N * sz-byte buffer.
                let before =
                    unsafe { std::slice::from_raw_parts(lib_buf, N as usize * sz) }.to_vec();
                lib.cq_clean(qpn, cons, true);
                // SAFETY: as above.
                let after = unsafe { std::slice::from_raw_parts(lib_buf, N as usize * sz) };
                // SAFETY: the model's CQ doorbell record.
                let db = unsafe { lib.cq_dbrec().read_volatile() };
                if before != after || lib.cons_index() != cons || db != db0 {
                    diff(
                        "CQ clean: libmlx5 changed a CQ marked DV_OWNED",
                        format!("  round {round}, cons {cons:#x}, run {run}"),
                    );
                }
            }
            lib.cq_clean(qpn, cons, false);
            // SAFETY: a private buffer and doorbell record that outlive the poller.
            let mut p = unsafe {
                DirectPoller::<1>::new(DirectCq {
                    buf: ours,
                    cqe_cnt: N,
                    cqe_size: cqe,
                    dbrec: ours_db.as_mut_ptr(),
                    cqn: 1,
                    cons_index: cons,
                })
            }
            .unwrap();
            let freed = p.clean(qpn);
            freed_total += freed as u64;
            // SAFETY: both N * sz-byte buffers, no writer now.
            let (a, b) = unsafe {
                (
                    std::slice::from_raw_parts(ours, N as usize * sz),
                    std::slice::from_raw_parts(lib_buf, N as usize * sz),
                )
            };
            // SAFETY: the model's CQ doorbell record.
            let lib_db = unsafe { lib.cq_dbrec().read_volatile() };
            if a != b || p.cons_index() != lib.cons_index() || ours_db[0] != lib_db {
                let at = a.iter().zip(b).position(|(x, y)| x != y).unwrap_or(0) & !63;
                diff(
                    "CQ clean: ours vs libmlx5's __mlx5_cq_clean",
                    format!(
                        "  round {round}, qpn {qpn:#x}, cons {cons:#x}, run {run}, freed {freed}\n  \
                         cons_index ours {:#x} libmlx5 {:#x}; doorbell ours {:#x} libmlx5 {lib_db:#x}\n  \
                         first different CQE at byte {at}:\n  ours    {}\n  libmlx5 {}",
                        p.cons_index(),
                        lib.cons_index(),
                        ours_db[0],
                        hex(&a[at..at + 64]),
                        hex(&b[at..at + 64]),
                    ),
                );
            }
        }
        (rounds, freed_total)
    }

    /// `arm_cq` against `mlx5_arm_cq`: the arm word in the doorbell record, the UAR stores
    /// (offset, size, value) and the barrier kinds. Our consumer index comes from the
    /// doorbell record, where the direct poller keeps it; libmlx5's from its `cons_index`.
    fn arm_streams(rounds: u64) -> u64 {
        let mut r = Rng(0xa4a4_0000_5eed_0003);
        let mut lib = model(&SHAPES[0]);
        let mut uar = vec![0u64; 512];
        let base = uar.as_mut_ptr().cast::<u8>();
        let mut dbrec = [0u32; 2];
        for round in 0..rounds {
            let cons = r.next() as u32;
            let sn = r.next() as u32;
            let solicited = r.below(2) == 0;
            let cqn = r.next() as u32 & 0xff_ffff;
            lib.record();
            lib.arm_cq(cons, sn, solicited, cqn);
            let (lib_st, lib_ba) = (lib.stores(), lib.barriers());
            // SAFETY: the model's CQ doorbell record (two words).
            let lib_arm = unsafe { lib.cq_dbrec().add(1).read_volatile() };
            dbrec[0] = (cons & 0xff_ffff).to_be();
            let mut db = RecordingDoorbell::new(base);
            // SAFETY: a private doorbell record and page standing in for the CQ's.
            unsafe {
                hotverbs_datapath::mlx5::arm_cq(
                    &mut db,
                    dbrec.as_mut_ptr(),
                    base.add(0x800),
                    cqn,
                    sn,
                    solicited,
                )
            };
            let (our_st, our_ba) = our_log(&db.events, 0);
            let kinds = |b: &[Barrier]| b.iter().map(|x| x.kind).collect::<Vec<_>>();
            if our_st != lib_st || kinds(&our_ba) != kinds(&lib_ba) || dbrec[1] != lib_arm {
                diff(
                    "CQ arm: ours vs libmlx5's mlx5_arm_cq",
                    format!(
                        "  round {round}, cons {cons:#x}, sn {sn}, solicited {solicited}, cqn \
                         {cqn:#x}\n  arm word ours {:#x} libmlx5 {:#x}\n  stores ours \
                         {our_st:?}\n  libmlx5 {lib_st:?}\n  barriers ours {:?} libmlx5 {:?}",
                        u32::from_be(dbrec[1]),
                        u32::from_be(lib_arm),
                        kinds(&our_ba),
                        kinds(&lib_ba)
                    ),
                );
            }
        }
        rounds
    }

    fn planted(p: Plant) -> u64 {
        let before = DIFFS.load(Ordering::Relaxed);
        let cqes = CQES.load(Ordering::Relaxed);
        QUIET.store(true, Ordering::Relaxed);
        run(0x1111, &SHAPES[0], 5_000, p);
        QUIET.store(false, Ordering::Relaxed);
        // The planted runs count toward neither total (whichever test runs first).
        CQES.store(cqes, Ordering::Relaxed);
        DIFFS.swap(before, Ordering::Relaxed) - before
    }

    #[test]
    fn planted_bugs_are_caught() {
        // Serialised with the main run (the hooks' one log, the DIFFS counter).
        let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let wrong = planted(Plant::WrongByte);
        let no_bf = planted(Plant::NoBlueFlame);
        let no_flags = planted(Plant::NoFlags);
        println!(
            "planted bugs: one wrong byte -> {wrong} differences, no BlueFlame -> {no_bf}, \
             no fence / solicited bits -> {no_flags}"
        );
        assert!(wrong > 0, "a wrong byte in a segment went unnoticed");
        assert!(no_bf > 0, "a missing BlueFlame copy went unnoticed");
        assert!(
            no_flags > 0,
            "WQEs without their fence / solicited bits went unnoticed"
        );
    }

    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

    /// Receive WQEs (issue 30, the RQ): random chains of 1 to 8 receives of 0 to
    /// `max_gs + 1` scatter entries (zero-length ones among them) through
    /// `DirectRq::post`/`publish` and through `mlx5_post_recv` on the same fake queue,
    /// with completions retiring receives at random (wraps, a full queue): the same
    /// return value and `bad_wr`, queue bytes, receive counter, `wrid` array, `head`, and
    /// one store barrier per published chain. `HOTVERBS_GOLDEN_WRS` sets the count.
    #[test]
    fn a_million_random_receives_equal_libmlx5s() {
        let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let target = std::env::var("HOTVERBS_GOLDEN_WRS")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(1_000_000);
        let (posted, refused, wraps, diffs) = receives(target, RecvPlant::None);
        println!(
            "golden: {posted} receive WQEs compared with mlx5_post_recv ({refused} chains \
             refused, {wraps} wraps), {diffs} differences"
        );
        assert_eq!(
            diffs, 0,
            "golden receives: {diffs} differences (printed above)"
        );
        assert!(posted >= 1_000_000 || std::env::var("HOTVERBS_GOLDEN_WRS").is_ok());
    }

    /// What the receive comparison plants in our side, to prove it sees it.
    #[derive(Clone, Copy, Debug, PartialEq)]
    enum RecvPlant {
        None,
        /// One byte of the newest WQE flipped after it was written.
        WrongByte,
        /// One chain's receive counter never published.
        NoPublish,
    }

    #[test]
    fn planted_receive_bugs_are_caught() {
        let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        QUIET.store(true, Ordering::Relaxed);
        for plant in [RecvPlant::WrongByte, RecvPlant::NoPublish] {
            let (_, _, _, diffs) = receives(20_000, plant);
            assert!(diffs > 0, "{plant:?} went unseen");
            println!("planted receive bug {plant:?} -> {diffs} differences");
        }
        QUIET.store(false, Ordering::Relaxed);
    }

    /// `target` receives through both sides; (posted, chains refused, wraps, differences).
    fn receives(target: u64, plant: RecvPlant) -> (u64, u64, u64, u64) {
        use hotverbs_datapath::mlx5::rq::{DirectRq, DirectRqDesc, RqError, RCV_DBR};
        use hotverbs_datapath::LocalBuf;
        use hotverbs_mlx5_golden::RecvWr;
        let (mut posted, mut refused, mut wraps, mut diffs) = (0u64, 0u64, 0u64, 0u64);
        let mut chains = 0u64;
        for (shape, (wqe_cnt, stride)) in [(64u32, 16u32), (256, 64), (32, 128)]
            .into_iter()
            .enumerate()
        {
            let mut model = Model::new(ModelCfg {
                ud: false,
                uc: false,
                wqe_cnt: 64,
                max_gs: 1,
                max_inline: 0,
                qpn: QPN,
                cqe_cnt: 64,
                poison: POISON,
                cqe_size: 64,
            });
            model.rq_init(wqe_cnt, stride, POISON);
            let len = (wqe_cnt * stride) as usize;
            let mut buf = vec![u128::from_ne_bytes([POISON; 16]); len / 16];
            let mut dbrec = [0u32; 2];
            let mut wrid = vec![0u64; wqe_cnt as usize];
            let desc = DirectRqDesc {
                buf: buf.as_mut_ptr().cast(),
                wqe_cnt,
                stride,
                dbrec: dbrec.as_mut_ptr(),
                wrid: wrid.as_mut_ptr(),
            };
            // SAFETY: the vectors outlive the queue and nothing else touches them.
            let mut rq =
                unsafe { DirectRq::new(desc, 0, RecordingDoorbell::new(std::ptr::null_mut())) }
                    .unwrap();
            let max_gs = stride / 16;
            let mut r = Rng(0x0bad_5eed_0000_0001 ^ (shape as u64) << 32);
            let mut tail = 0u32;
            let per_shape = target / 3 + 1;
            let mut shape_posted = 0u64;
            let mut wr_id = 0u64;
            while shape_posted < per_shape {
                if r.below(3) == 0 {
                    // Completions: the oldest receives, as the CQ returns them.
                    let k = r.below(u64::from(rq.outstanding()) + 1) as u32;
                    for _ in 0..k {
                        let want = unsafe {
                            // SAFETY: the model's wrid array has wqe_cnt entries.
                            model.rq_wrid().add((tail & (wqe_cnt - 1)) as usize).read()
                        };
                        if rq.complete() != Some(want) {
                            diffs += 1;
                        }
                        tail = tail.wrapping_add(1);
                    }
                    model.rq_set_tail(tail);
                    continue;
                }
                let n = 1 + r.below(8) as usize;
                let mut sges: Vec<Vec<ibv_sge>> = Vec::with_capacity(n);
                for _ in 0..n {
                    let k = if r.below(50) == 0 {
                        max_gs as usize + 1
                    } else {
                        r.below(u64::from(max_gs) + 1) as usize
                    };
                    sges.push(
                        (0..k)
                            .map(|_| ibv_sge {
                                addr: r.next(),
                                length: if r.below(6) == 0 { 0 } else { r.next() as u32 },
                                lkey: r.next() as u32,
                            })
                            .collect(),
                    );
                }
                let wrs: Vec<RecvWr> = sges
                    .iter()
                    .map(|s| {
                        wr_id += 1;
                        RecvWr {
                            wr_id,
                            sges: s.as_ptr(),
                            num_sge: s.len() as i32,
                            pad: 0,
                        }
                    })
                    .collect();
                model.record();
                let (rc, bad) = model.post_recv(&wrs);
                let model_barriers = model.barriers().iter().filter(|b| b.kind == 1).count();
                let before = rq.doorbell().events.len();
                let (mut ours_rc, mut ours_bad) = (0, None);
                for (i, (w, s)) in wrs.iter().zip(&sges).enumerate() {
                    let segs: Vec<LocalBuf> = s
                        .iter()
                        .map(|g| LocalBuf {
                            addr: g.addr,
                            len: g.length,
                            lkey: g.lkey,
                        })
                        .collect();
                    match rq.post(w.wr_id, &segs) {
                        Ok(()) => {}
                        Err(e) => {
                            ours_rc = match e {
                                RqError::Full => 12, // ENOMEM
                                _ => 22,             // EINVAL
                            };
                            ours_bad = Some(i);
                            break;
                        }
                    }
                }
                chains += 1;
                let planted = chains == 100;
                if !(planted && plant == RecvPlant::NoPublish) {
                    rq.publish();
                }
                if planted && plant == RecvPlant::WrongByte && ours_bad != Some(0) {
                    let slot = (rq.head().wrapping_sub(1) & (wqe_cnt - 1)) as usize;
                    let w = &mut buf[slot * stride as usize / 16];
                    *w ^= 1 << 9;
                }
                let ours_barriers = rq.doorbell().events[before..]
                    .iter()
                    .filter(|e| **e == MmioEvent::ToDeviceBarrier)
                    .count();
                let done = ours_bad.unwrap_or(n);
                posted += done as u64;
                shape_posted += done as u64;
                refused += u64::from(ours_bad.is_some());
                if rq.head() / wqe_cnt != (rq.head() - done as u32) / wqe_cnt {
                    wraps += 1;
                }
                // SAFETY: the model's queue, doorbell record and wrid array are live and
                // as long as ours.
                let (mbuf, mdb, mwrid) = unsafe {
                    (
                        std::slice::from_raw_parts(model.rq_buf(), len),
                        model.qp_dbrec().add(RCV_DBR).read(),
                        std::slice::from_raw_parts(model.rq_wrid(), wqe_cnt as usize),
                    )
                };
                let ours: Vec<u8> = buf.iter().flat_map(|w| w.to_ne_bytes()).collect();
                let same = (rc, bad) == (ours_rc, ours_bad)
                    && mbuf == &ours[..]
                    && mdb == dbrec[RCV_DBR]
                    && mwrid == &wrid[..]
                    && model.rq_head() == rq.head()
                    && model_barriers == ours_barriers;
                if !same {
                    diffs += 1;
                    if diffs <= 3 && !QUIET.load(Ordering::Relaxed) {
                        eprintln!(
                            "golden receive DIFFERENCE (shape {shape}, wr {wr_id}): libmlx5 \
                             ({rc}, {bad:?}) head {} dbr {:#x} barriers {model_barriers}; \
                             ours ({ours_rc}, {ours_bad:?}) head {} dbr {:#x} barriers \
                             {ours_barriers}; queue bytes equal {}, wrid equal {}",
                            model.rq_head(),
                            u32::from_be(mdb),
                            rq.head(),
                            u32::from_be(dbrec[RCV_DBR]),
                            mbuf == &ours[..],
                            mwrid == &wrid[..]
                        );
                    }
                }
            }
        }
        (posted, refused, wraps, diffs)
    }

    /// SRQ WQEs (issue 30): libmlx5 lays out an SRQ with its own `mlx5_alloc_srq_buf`
    /// (the linked list, with and without a wait queue); our `DirectSrq` starts from a copy
    /// of that memory and its `head` / `tail`. Random chains of 1 to 8 receives of 0 to
    /// `max_gs + 1` entries go through `DirectSrq::post`/`publish` and
    /// `mlx5_post_srq_recv`, and random outstanding WQEs are freed out of order through
    /// `DirectSrq::free` and `mlx5_free_srq_wqe` (what a completion does): the same return
    /// value and `bad_wr`, queue bytes (links renumbered by the free-list search included),
    /// `wrid`, free bitmap, post counter in the doorbell record, `head`, `tail`, and one
    /// store barrier per published chain. `HOTVERBS_GOLDEN_WRS` sets the count.
    #[test]
    fn a_million_random_srq_receives_equal_libmlx5s() {
        let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let target = std::env::var("HOTVERBS_GOLDEN_WRS")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(1_000_000);
        let (posted, refused, freed, diffs) = srq_receives(target, RecvPlant::None);
        println!(
            "golden: {posted} SRQ receive WQEs compared with mlx5_post_srq_recv ({refused} \
             chains refused, {freed} WQEs freed out of order), {diffs} differences"
        );
        assert_eq!(diffs, 0, "golden SRQ: {diffs} differences (printed above)");
        assert!(posted >= 1_000_000 || std::env::var("HOTVERBS_GOLDEN_WRS").is_ok());
    }

    #[test]
    fn planted_srq_bugs_are_caught() {
        let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        QUIET.store(true, Ordering::Relaxed);
        for plant in [RecvPlant::WrongByte, RecvPlant::NoPublish] {
            let (_, _, _, diffs) = srq_receives(20_000, plant);
            assert!(diffs > 0, "{plant:?} went unseen");
            println!("planted SRQ bug {plant:?} -> {diffs} differences");
        }
        QUIET.store(false, Ordering::Relaxed);
    }

    /// `target` SRQ receives through both sides; (posted, chains refused, WQEs freed,
    /// differences).
    fn srq_receives(target: u64, plant: RecvPlant) -> (u64, u64, u64, u64) {
        use hotverbs_datapath::mlx5::{DirectSrq, DirectSrqDesc, SrqError};
        use hotverbs_datapath::LocalBuf;
        use hotverbs_mlx5_golden::RecvWr;
        let (mut posted, mut refused, mut freed, mut diffs) = (0u64, 0u64, 0u64, 0u64);
        let mut chains = 0u64;
        let shapes = [
            (63u32, 1i32, true),
            (100, 3, false),
            (15, 6, true),
            (7, 2, false),
        ];
        for (shape, (max_wr, max_gs, have_wq)) in shapes.into_iter().enumerate() {
            let mut model = Model::new(ModelCfg {
                ud: false,
                uc: false,
                wqe_cnt: 64,
                max_gs: 1,
                max_inline: 0,
                qpn: QPN,
                cqe_cnt: 64,
                poison: POISON,
                cqe_size: 64,
            });
            let mut m = model.srq_new(max_wr, max_gs, have_wq);
            let st = m.state();
            let stride = 1u32 << st.wqe_shift;
            let nwqes = st.nwqes as u32;
            let len = st.max as usize * stride as usize;
            let mut buf = vec![0u128; len / 16];
            // SAFETY: libmlx5's SRQ buffer of `len` bytes, live.
            let start = unsafe { std::slice::from_raw_parts(m.buf(), len) };
            for (w, c) in buf.iter_mut().zip(start.chunks(16)) {
                *w = u128::from_ne_bytes(c.try_into().unwrap());
            }
            let words = (nwqes as usize).div_ceil(64);
            // libmlx5's wrid array comes from malloc, unwritten: start from its bytes too.
            // SAFETY: `nwqes` entries of libmlx5's live array.
            let mut wrid = unsafe { std::slice::from_raw_parts(m.wrid(), nwqes as usize) }.to_vec();
            let mut free = vec![0u64; words];
            let mut dbrec = [0u32; 2];
            let desc = DirectSrqDesc {
                buf: buf.as_mut_ptr().cast(),
                stride,
                nwqes,
                dbrec: dbrec.as_mut_ptr(),
                wrid: wrid.as_mut_ptr(),
                free: free.as_mut_ptr(),
            };
            // SAFETY: the vectors outlive the queue and nothing else touches them.
            let mut q = unsafe {
                DirectSrq::new(
                    desc,
                    st.head as u32,
                    st.tail as u32,
                    0,
                    RecordingDoorbell::new(std::ptr::null_mut()),
                )
            }
            .unwrap();
            assert_eq!(
                q.max_segs() as i32,
                st.max_gs,
                "shape {shape}: the same max_gs"
            );
            let gs = q.max_segs();
            let mut r = Rng(0x5ca1_ab1e_0000_0001 ^ (shape as u64) << 32);
            let mut outstanding: Vec<u32> = Vec::new();
            let per_shape = target / shapes.len() as u64 + 1;
            let mut shape_posted = 0u64;
            let mut wr_id = 0u64;
            while shape_posted < per_shape {
                if r.below(3) == 0 && !outstanding.is_empty() {
                    // Completions, in any order: each frees its WQE on both sides.
                    let k = 1 + r.below(outstanding.len() as u64) as usize;
                    for _ in 0..k {
                        let at = r.below(outstanding.len() as u64) as usize;
                        let idx = outstanding.swap_remove(at);
                        m.free_wqe(idx);
                        q.free(idx);
                        freed += 1;
                    }
                    continue;
                }
                let n = 1 + r.below(8) as usize;
                let sges: Vec<Vec<ibv_sge>> = (0..n)
                    .map(|_| {
                        let k = if r.below(50) == 0 {
                            gs as usize + 1
                        } else {
                            r.below(u64::from(gs) + 1) as usize
                        };
                        (0..k)
                            .map(|_| ibv_sge {
                                addr: r.next(),
                                length: if r.below(6) == 0 { 0 } else { r.next() as u32 },
                                lkey: r.next() as u32,
                            })
                            .collect()
                    })
                    .collect();
                let wrs: Vec<RecvWr> = sges
                    .iter()
                    .map(|s| {
                        wr_id += 1;
                        RecvWr {
                            wr_id,
                            sges: s.as_ptr(),
                            num_sge: s.len() as i32,
                            pad: 0,
                        }
                    })
                    .collect();
                model.record();
                let (rc, bad) = m.post(&wrs);
                let model_barriers = model.barriers().iter().filter(|b| b.kind == 1).count();
                let before = q.doorbell().events.len();
                let (mut ours_rc, mut ours_bad) = (0, None);
                let mut last = None;
                for (i, (w, s)) in wrs.iter().zip(&sges).enumerate() {
                    let segs: Vec<LocalBuf> = s
                        .iter()
                        .map(|g| LocalBuf {
                            addr: g.addr,
                            len: g.length,
                            lkey: g.lkey,
                        })
                        .collect();
                    match q.post(w.wr_id, &segs) {
                        Ok(idx) => {
                            outstanding.push(idx);
                            last = Some(idx);
                        }
                        Err(e) => {
                            ours_rc = match e {
                                SrqError::Full => 12, // ENOMEM
                                _ => 22,              // EINVAL
                            };
                            ours_bad = Some(i);
                            break;
                        }
                    }
                }
                chains += 1;
                let planted = chains == 100;
                if !(planted && plant == RecvPlant::NoPublish) {
                    q.publish();
                }
                if let (true, RecvPlant::WrongByte, Some(idx)) = (planted, plant, last) {
                    buf[(idx * stride / 16) as usize + 1] ^= 1 << 9;
                }
                let ours_barriers = q.doorbell().events[before..]
                    .iter()
                    .filter(|e| **e == MmioEvent::ToDeviceBarrier)
                    .count();
                let done = ours_bad.unwrap_or(n);
                posted += done as u64;
                shape_posted += done as u64;
                refused += u64::from(ours_bad.is_some());
                let ms = m.state();
                // SAFETY: libmlx5's buffer, wrid array and bitmap are live.
                let (mbuf, mwrid, mfree) = unsafe {
                    (
                        std::slice::from_raw_parts(m.buf(), len),
                        std::slice::from_raw_parts(m.wrid(), nwqes as usize),
                        std::slice::from_raw_parts(m.bitmap(), words),
                    )
                };
                let mask = |w: &[u64]| -> Vec<u64> {
                    w.iter()
                        .enumerate()
                        .map(|(i, &x)| {
                            let bits = (nwqes as usize).saturating_sub(i * 64).min(64);
                            if bits == 64 {
                                x
                            } else {
                                x & ((1u64 << bits) - 1)
                            }
                        })
                        .collect()
                };
                let ours: Vec<u8> = buf.iter().flat_map(|w| w.to_ne_bytes()).collect();
                let same = (rc, bad) == (ours_rc, ours_bad)
                    && mbuf == &ours[..]
                    && m.db() == dbrec[0]
                    && mwrid == &wrid[..]
                    && mask(mfree) == mask(&free)
                    && (ms.head, ms.tail) == (q.head() as i32, q.tail() as i32)
                    && ms.counter == i32::from(q.counter())
                    && model_barriers == ours_barriers;
                if !same {
                    diffs += 1;
                    if diffs <= 3 && !QUIET.load(Ordering::Relaxed) {
                        eprintln!(
                            "golden SRQ DIFFERENCE (shape {shape}, wr {wr_id}): libmlx5 \
                             ({rc}, {bad:?}) head {} tail {} db {:#x} barriers \
                             {model_barriers}; ours ({ours_rc}, {ours_bad:?}) head {} tail {} \
                             db {:#x} barriers {ours_barriers}; bytes equal {}, wrid equal {}, \
                             bitmap equal {}",
                            ms.head,
                            ms.tail,
                            u32::from_be(m.db()),
                            q.head(),
                            q.tail(),
                            u32::from_be(dbrec[0]),
                            mbuf == &ours[..],
                            mwrid == &wrid[..],
                            mask(mfree) == mask(&free)
                        );
                    }
                }
            }
        }
        (posted, refused, freed, diffs)
    }

    /// SRQ responder CQEs (issue 30): random receive completions of an SRQ's outstanding
    /// WQEs, in any order (every responder opcode, scatter-to-CQE of 0 to 32 / 64 bytes,
    /// the GRH flag, error syndromes), written into the model's CQ and ours: libmlx5's
    /// `mlx5_poll_cq` (finding the SRQ by number, `mlx5_free_srq_wqe`,
    /// `mlx5_copy_to_recv_srq`) and our `DirectPoller` with the SRQ attached give the same
    /// completions, the same bytes in the receive buffers and the same free bitmap; the
    /// freed WQEs are then reposted through both, as equal.
    #[test]
    fn random_srq_responder_cqes_equal_libmlx5s() {
        let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let mut total = 0;
        for cqe in [64u32, 128] {
            let (n, d) = srq_responder_stream(50_000, cqe);
            assert_eq!(d, 0, "SRQ responder CQEs of {cqe} bytes: {d} differences");
            total += n;
        }
        println!("golden: {total} SRQ responder CQEs compared with mlx5_poll_cq, 0 differences");
    }

    /// `target` SRQ responder CQEs of `cqe` bytes through both pollers: (compared,
    /// differences).
    fn srq_responder_stream(target: u64, cqe: u32) -> (u64, u64) {
        use hotverbs_datapath::mlx5::{DirectSrq, DirectSrqDesc};
        use hotverbs_datapath::LocalBuf;
        use hotverbs_mlx5_golden::RecvWr;
        const NCQE: u32 = 128;
        const SRQN: u32 = 0x2a5;
        const SLOT: usize = 256;
        let mut r = Rng(0x5e5e_0dd5_0000_0007 ^ u64::from(cqe));
        let mut model = Model::new(ModelCfg {
            ud: false,
            uc: false,
            wqe_cnt: 64,
            max_gs: 1,
            max_inline: 0,
            qpn: QPN,
            cqe_cnt: NCQE,
            poison: POISON,
            cqe_size: cqe,
        });
        let mut m = model.srq_new(31, 3, true);
        m.store(SRQN);
        let st = m.state();
        let stride = 1u32 << st.wqe_shift;
        let nwqes = st.nwqes as u32;
        let len = st.max as usize * stride as usize;
        let mut buf = vec![0u128; len / 16];
        // SAFETY: libmlx5's SRQ buffer and wrid array, live.
        let (start, mwrid0) = unsafe {
            (
                std::slice::from_raw_parts(m.buf(), len),
                std::slice::from_raw_parts(m.wrid(), nwqes as usize),
            )
        };
        for (w, c) in buf.iter_mut().zip(start.chunks(16)) {
            *w = u128::from_ne_bytes(c.try_into().unwrap());
        }
        let words = (nwqes as usize).div_ceil(64);
        let mut wrid = mwrid0.to_vec();
        let mut free = vec![0u64; words];
        let mut dbrec = [0u32; 2];
        let desc = DirectSrqDesc {
            buf: buf.as_mut_ptr().cast(),
            stride,
            nwqes,
            dbrec: dbrec.as_mut_ptr(),
            wrid: wrid.as_mut_ptr(),
            free: free.as_mut_ptr(),
        };
        // SAFETY: the vectors outlive the queue and the poller.
        let mut q = unsafe {
            DirectSrq::new(
                desc,
                st.head as u32,
                st.tail as u32,
                0,
                RecordingDoorbell::new(std::ptr::null_mut()),
            )
        }
        .unwrap();
        let mut our_cq = vec![0u128; (NCQE * cqe / 16) as usize];
        let mut our_cq_db = [0u32; 2];
        // SAFETY: our CQ and SRQ outlive the poller; the SRQ is not posted to during a poll.
        let mut poller = unsafe {
            let mut p = DirectPoller::<4>::new(DirectCq {
                buf: our_cq.as_mut_ptr().cast(),
                cqe_cnt: NCQE,
                cqe_size: cqe,
                dbrec: our_cq_db.as_mut_ptr(),
                cqn: 1,
                cons_index: 0,
            })
            .unwrap();
            p.attach_srq(SRQN, &desc).unwrap();
            p
        };
        // Receive buffers, a slot per WQE index (a WQE's slot is free once it completed).
        let mut theirs = vec![0u8; nwqes as usize * SLOT];
        let mut ours = vec![0u8; nwqes as usize * SLOT];
        let mut cap = vec![0u32; nwqes as usize];
        let mut outstanding: Vec<u32> = Vec::new();
        let (mut compared, mut diffs, mut cons, mut wr_id) = (0u64, 0u64, 0u32, 0u64);
        let opcodes = [1u8, 2, 3, 4, 14];
        let syndromes = [0x01u8, 0x02, 0x04, 0x05, 0x10, 0x11, 0x12, 0x13, 0x14, 0x22];
        while compared < target {
            // Keep the SRQ full: each post on both sides, into the slot of the WQE it takes
            // (the head, once relinked; checked equal on both sides).
            loop {
                let nseg = 1 + r.below(3) as usize;
                let lens: Vec<u32> = (0..nseg)
                    .map(|_| {
                        if r.below(5) == 0 {
                            0
                        } else {
                            1 + r.below(40) as u32
                        }
                    })
                    .collect();
                let mk = |base: &mut Vec<u8>, idx: u32| -> Vec<(u64, u32)> {
                    let mut off = 0usize;
                    lens.iter()
                        .map(|&l| {
                            let a = base[idx as usize * SLOT + off..].as_mut_ptr() as u64;
                            off += l as usize;
                            (a, l)
                        })
                        .collect()
                };
                wr_id += 1;
                let lkey = 1 + r.below(0xffff) as u32;
                // Ours first, with placeholder segments: the index it returns is where both
                // sides' buffers go, so our segments are rewritten with that slot's
                // addresses, and libmlx5's WR is built with them (both take the same index:
                // head and tail are compared after each post).
                let Ok(idx) = q.post(
                    wr_id,
                    &vec![
                        LocalBuf {
                            addr: 0,
                            len: 0,
                            lkey: 0
                        };
                        nseg
                    ],
                ) else {
                    break;
                };
                // Rewrite our WQE's segments for the slot of `idx`.
                let sg_o = mk(&mut ours, idx);
                for (j, (a, l)) in sg_o.iter().enumerate() {
                    let w = &mut buf[(idx * stride / 16) as usize + 1 + j];
                    let mut b = [0u8; 16];
                    b[0..4].copy_from_slice(&l.to_be_bytes());
                    b[4..8].copy_from_slice(&lkey.to_be_bytes());
                    b[8..16].copy_from_slice(&a.to_be_bytes());
                    *w = u128::from_ne_bytes(b);
                }
                let sg_t: Vec<ibv_sge> = mk(&mut theirs, idx)
                    .into_iter()
                    .map(|(addr, length)| ibv_sge { addr, length, lkey })
                    .collect();
                let w = [RecvWr {
                    wr_id,
                    sges: sg_t.as_ptr(),
                    num_sge: nseg as i32,
                    pad: 0,
                }];
                let (rc, _) = m.post(&w);
                let ms = m.state();
                if rc != 0 || (ms.head, ms.tail) != (q.head() as i32, q.tail() as i32) {
                    diffs += 1;
                    eprintln!("golden SRQ responder DIFFERENCE: the post of wr {wr_id} ({rc})");
                }
                cap[idx as usize] = lens.iter().sum();
                outstanding.push(idx);
            }
            q.publish();
            // One CQE for a random outstanding WQE.
            let at = r.below(outstanding.len() as u64) as usize;
            let idx = outstanding.swap_remove(at);
            let entry = (cons % NCQE) as usize * cqe as usize;
            // SAFETY: the model's CQ buffer holds NCQE entries of `cqe` bytes.
            let e =
                unsafe { std::slice::from_raw_parts_mut(model.cq_buf().add(entry), cqe as usize) };
            for b in e.iter_mut() {
                *b = r.next() as u8;
            }
            let c64 = cqe as usize - 64;
            let op = opcodes[r.below(opcodes.len() as u64) as usize];
            let mut format = 0u8;
            if op != 14 && r.below(2) == 0 {
                format = if cqe == 128 && r.below(2) == 0 {
                    0x8
                } else {
                    0x4
                };
            }
            let max_inline = if format == 0x8 { 64 } else { 32 };
            let byte_cnt = if format != 0 {
                r.below(u64::from(cap[idx as usize].min(max_inline)) + 1) as u32
            } else {
                r.next() as u32
            };
            let owner = ((cons / NCQE) & 1) as u8;
            e[c64 + 63] = op << 4 | format | owner;
            e[c64 + 56..c64 + 60]
                .copy_from_slice(&((r.next() as u32 & 0xff00_0000) | QPN).to_be_bytes());
            e[c64 + 32..c64 + 36]
                .copy_from_slice(&((r.next() as u32 & 0xff00_0000) | SRQN).to_be_bytes());
            e[c64 + 60..c64 + 62].copy_from_slice(&(idx as u16).to_be_bytes());
            e[c64 + 44..c64 + 48].copy_from_slice(&byte_cnt.to_be_bytes());
            if op == 14 {
                e[c64 + 55] = syndromes[r.below(syndromes.len() as u64) as usize];
                if e[c64 + 55] == 0x22 && e[c64 + 54] == 0x93 {
                    // An ODP page fault, which libmlx5 handles inside the poll (reposting
                    // the WQE through its wait queue) and the direct poller refuses (its
                    // own test below): not part of the stream.
                    e[c64 + 54] = 0x92;
                }
            }
            let bytes = e.to_vec();
            let got = model.poll_cq(1);
            // SAFETY: our CQ holds NCQE entries; the poller reads it only below.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    bytes.as_ptr(),
                    our_cq.as_mut_ptr().cast::<u8>().add(entry),
                    cqe as usize,
                )
            };
            cons = cons.wrapping_add(1);
            let mut pc = [Completion::PLACEHOLDER; 1];
            let polled = poller.poll_into(&mut pc);
            compared += 1;
            let (Some(t), Ok(1)) = (got.first(), polled) else {
                diffs += 1;
                eprintln!(
                    "golden SRQ responder DIFFERENCE: op {op}: libmlx5 {} completions, ours \
                     {polled:?}",
                    got.len()
                );
                continue;
            };
            let o = pc[0].as_raw();
            // SAFETY: plain integers of the union.
            let (t_imm, o_imm) =
                unsafe { (t.__bindgen_anon_1.imm_data, o.__bindgen_anon_1.imm_data) };
            // SAFETY: libmlx5's bitmap, live.
            let mfree = unsafe { std::slice::from_raw_parts(m.bitmap(), words) };
            let same = t.wr_id == o.wr_id
                && t.status == o.status
                && t.qp_num == o.qp_num
                && if t.status == IBV_WC_SUCCESS {
                    t.opcode == o.opcode
                        && t.byte_len == o.byte_len
                        && t.wc_flags == o.wc_flags
                        && (t.wc_flags & (IBV_WC_WITH_IMM | IBV_WC_WITH_INV) == 0 || t_imm == o_imm)
                        && t.src_qp == o.src_qp
                        && t.slid == o.slid
                        && t.sl == o.sl
                        && t.dlid_path_bits == o.dlid_path_bits
                        && t.pkey_index == o.pkey_index
                } else {
                    t.vendor_err == o.vendor_err
                }
                && theirs == ours
                && mfree[..words - 1] == free[..words - 1]
                && (mfree[words - 1] ^ free[words - 1]) & (u64::MAX >> (64 * words as u32 - nwqes))
                    == 0;
            if !same {
                diffs += 1;
                if diffs <= 3 {
                    eprintln!(
                        "golden SRQ responder DIFFERENCE (op {op}, format {format}, WQE {idx}): \
                         libmlx5 wr_id {} status {} len {} flags {:#x}; ours wr_id {} status {} \
                         len {} flags {:#x}; buffers equal {}",
                        t.wr_id,
                        t.status,
                        t.byte_len,
                        t.wc_flags,
                        o.wr_id,
                        o.status,
                        o.byte_len,
                        o.wc_flags,
                        theirs == ours
                    );
                }
            }
        }
        (compared, diffs)
    }

    /// Responder CQEs (issue 30): random receive completions written into the model's CQ
    /// (every responder opcode, scatter-to-CQE of 0 to 32 bytes in 64-byte CQEs and 0 to 64
    /// in 128-byte ones, the GRH flag, receive error syndromes, owner-bit passes), polled by
    /// `mlx5_poll_cq` and decoded by `RecvCqe::decode` with `DirectRq::complete_at` and
    /// `scatter` on the same receive queue: the same `ibv_wc` fields and the same bytes in
    /// the receive buffers.
    #[test]
    fn random_responder_cqes_equal_libmlx5s() {
        let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let (mut total, mut kinds) = (0, [0u64; 4]);
        for cqe in [64u32, 128] {
            let (n, d, k) = responder_stream(100_000, cqe, 0);
            assert_eq!(d, 0, "responder CQEs of {cqe} bytes: {d} differences");
            total += n;
            for (a, b) in kinds.iter_mut().zip(k) {
                *a += b;
            }
        }
        println!(
            "golden: {total} responder CQEs compared with mlx5_poll_cq (scatter-to-CQE 32 {}, \
             64 {}, with GRH {}, errors {}), 0 differences",
            kinds[0], kinds[1], kinds[2], kinds[3]
        );
    }

    /// The responder comparison sees a wrong byte scattered and a field read from the
    /// wrong place.
    #[test]
    fn planted_responder_bugs_are_caught() {
        let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        QUIET.store(true, Ordering::Relaxed);
        for plant in [1, 2] {
            let (_, d, _) = responder_stream(5_000, 128, plant);
            assert!(d > 0, "planted responder bug {plant} went unseen");
            println!("planted responder bug {plant} -> {d} differences");
        }
        QUIET.store(false, Ordering::Relaxed);
    }

    /// `target` responder CQEs of `cqe` bytes through both pollers: (compared,
    /// differences, [scatter 32, scatter 64, GRH, errors]). Our side is both the decoder
    /// (`RecvCqe::decode`, `DirectRq::complete_at`) and a `DirectPoller` serving our queue
    /// (which scatters into our buffers). `plant` 1: one scattered byte wrong on our side;
    /// 2: our decoder fed a CQE whose SLID byte differs.
    fn responder_stream(target: u64, cqe: u32, plant: u8) -> (u64, u64, [u64; 4]) {
        use hotverbs_datapath::mlx5::rq::{DirectRq, DirectRqDesc, InlineScatter, RecvCqe};
        use hotverbs_datapath::LocalBuf;
        use hotverbs_mlx5_golden::RecvWr;
        const WQES: u32 = 64;
        const STRIDE: u32 = 64; // 4 segments
        const NCQE: u32 = 128;
        const SLOT: usize = 256; // receive buffer bytes per WQE slot
        let mut r = Rng(0x7e5b_0dd5_0000_0003 ^ u64::from(cqe));
        let mut model = Model::new(ModelCfg {
            ud: false,
            uc: false,
            wqe_cnt: 64,
            max_gs: 1,
            max_inline: 0,
            qpn: QPN,
            cqe_cnt: NCQE,
            poison: POISON,
            cqe_size: cqe,
        });
        model.rq_init(WQES, STRIDE, POISON);
        let mut buf = vec![u128::from_ne_bytes([POISON; 16]); (WQES * STRIDE / 16) as usize];
        let mut dbrec = [0u32; 2];
        let mut wrid = vec![0u64; WQES as usize];
        // SAFETY: the vectors outlive the queue and nothing else touches them.
        let mut rq = unsafe {
            DirectRq::new(
                DirectRqDesc {
                    buf: buf.as_mut_ptr().cast(),
                    wqe_cnt: WQES,
                    stride: STRIDE,
                    dbrec: dbrec.as_mut_ptr(),
                    wrid: wrid.as_mut_ptr(),
                },
                0,
                RecordingDoorbell::new(std::ptr::null_mut()),
            )
        }
        .unwrap();
        // Our own CQ, given the same CQEs, read by a DirectPoller serving our queue: the
        // poller's completions (wr_id from our table, scatter into our buffers) against
        // libmlx5's too.
        let mut our_cq = vec![0u128; (NCQE * cqe / 16) as usize];
        let mut our_cq_db = [0u32; 2];
        // SAFETY: our CQ and queue outlive the poller.
        let mut poller = unsafe {
            let mut p = DirectPoller::<4>::new(DirectCq {
                buf: our_cq.as_mut_ptr().cast(),
                cqe_cnt: NCQE,
                cqe_size: cqe,
                dbrec: our_cq_db.as_mut_ptr(),
                cqn: 1,
                cons_index: 0,
            })
            .unwrap();
            p.attach_rq(
                QPN,
                &DirectRqDesc {
                    buf: buf.as_mut_ptr().cast(),
                    wqe_cnt: WQES,
                    stride: STRIDE,
                    dbrec: dbrec.as_mut_ptr(),
                    wrid: wrid.as_mut_ptr(),
                },
            )
            .unwrap();
            p
        };
        // The receive buffers: libmlx5's and ours, the same offsets.
        let mut theirs = vec![0u8; WQES as usize * SLOT];
        let mut ours = vec![0u8; WQES as usize * SLOT];
        // Capacity (bytes) of each slot's receive, as posted.
        let mut cap = vec![0u32; WQES as usize];
        let (mut compared, mut diffs, mut cons, mut posted, mut wr_id) =
            (0u64, 0u64, 0u32, 0u32, 0u64);
        let mut kinds = [0u64; 4];
        let opcodes = [1u8, 2, 3, 4, 14];
        let syndromes = [
            0x01u8, 0x02, 0x04, 0x05, 0x10, 0x11, 0x12, 0x13, 0x14, 0x22, 0x30,
        ];
        while compared < target {
            // Keep receives posted, the same WR on both sides (their buffers, ours).
            while posted.wrapping_sub(cons) < WQES {
                let slot = (posted % WQES) as usize;
                let nseg = 1 + r.below(4) as usize;
                let mut lens = [0u32; 4];
                for l in lens.iter_mut().take(nseg) {
                    *l = if r.below(5) == 0 {
                        0
                    } else {
                        1 + r.below(40) as u32
                    };
                }
                let mut off = 0usize;
                let mut sg_t = Vec::new();
                let mut sg_o = Vec::new();
                for &l in &lens[..nseg] {
                    let lkey = 1 + r.below(0xffff) as u32;
                    sg_t.push(ibv_sge {
                        addr: theirs[slot * SLOT + off..].as_mut_ptr() as u64,
                        length: l,
                        lkey,
                    });
                    sg_o.push(LocalBuf {
                        addr: ours[slot * SLOT + off..].as_mut_ptr() as u64,
                        len: l,
                        lkey,
                    });
                    off += l as usize;
                }
                cap[slot] = off as u32;
                wr_id += 1;
                let w = [RecvWr {
                    wr_id,
                    sges: sg_t.as_ptr(),
                    num_sge: nseg as i32,
                    pad: 0,
                }];
                let (rc, _) = model.post_recv(&w);
                assert_eq!(rc, 0);
                rq.post(wr_id, &sg_o).unwrap();
                rq.publish();
                posted = posted.wrapping_add(1);
            }
            // One CQE at the consumer index, the owner bit of its pass.
            let slot = (cons % WQES) as usize;
            let entry = (cons % NCQE) as usize * cqe as usize;
            // SAFETY: the model's CQ buffer holds NCQE entries of `cqe` bytes.
            let e =
                unsafe { std::slice::from_raw_parts_mut(model.cq_buf().add(entry), cqe as usize) };
            for b in e.iter_mut() {
                *b = r.next() as u8;
            }
            let c64 = cqe as usize - 64;
            let op = opcodes[r.below(opcodes.len() as u64) as usize];
            let mut format = 0u8;
            if op != 14 && r.below(2) == 0 {
                format = if cqe == 128 && r.below(2) == 0 {
                    0x8
                } else {
                    0x4
                };
            }
            let max_inline = if format == 0x8 { 64 } else { 32 };
            let byte_cnt = if format != 0 {
                r.below(u64::from(cap[slot].min(max_inline)) + 1) as u32
            } else {
                r.next() as u32
            };
            let owner = ((cons / NCQE) & 1) as u8;
            e[c64 + 63] = op << 4 | format | owner;
            e[c64 + 56..c64 + 60]
                .copy_from_slice(&((r.next() as u32 & 0xff00_0000) | QPN).to_be_bytes());
            e[c64 + 32..c64 + 36].copy_from_slice(&(r.next() as u32 & 0xff00_0000).to_be_bytes());
            e[c64 + 60..c64 + 62].copy_from_slice(&(cons as u16).to_be_bytes());
            e[c64 + 44..c64 + 48].copy_from_slice(&byte_cnt.to_be_bytes());
            if op == 14 {
                e[c64 + 55] = syndromes[r.below(syndromes.len() as u64) as usize];
            }
            let bytes: Vec<u8> = e.to_vec();
            let got = model.poll_cq(1);
            cons = cons.wrapping_add(1);
            // Ours, on the same bytes.
            let mut mine: [u8; 64] = bytes[c64..].try_into().unwrap();
            if plant == 2 && compared == 100 {
                mine[23] ^= 1;
            }
            let Some(c) = RecvCqe::decode(&mine) else {
                diffs += 1;
                eprintln!("golden responder DIFFERENCE: op {op} format {format}: not decoded");
                continue;
            };
            let o_wr = rq.complete_at(c.wqe_counter);
            // The poller on our copy of the CQE: it scatters into `ours`.
            let at = (cons.wrapping_sub(1) % NCQE) as usize * cqe as usize;
            // SAFETY: our CQ holds NCQE entries of `cqe` bytes; the poller reads it only
            // in `poll_into` below.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    bytes.as_ptr(),
                    our_cq.as_mut_ptr().cast::<u8>().add(at),
                    cqe as usize,
                )
            };
            let mut pc = [Completion::PLACEHOLDER; 1];
            let polled = poller.poll_into(&mut pc);
            let mut o_status = c.status;
            if c.status == IBV_WC_SUCCESS && c.inline != InlineScatter::No {
                kinds[usize::from(c.inline == InlineScatter::In64)] += 1;
            }
            if plant == 1 && c.inline != InlineScatter::No && kinds[0] + kinds[1] == 50 {
                ours[(c.wqe_counter as usize % WQES as usize) * SLOT] ^= 0x40;
            }
            if polled.as_ref().ok() == Some(&1) && pc[0].as_raw().status != c.status {
                o_status = pc[0].as_raw().status;
            }
            if c.status != IBV_WC_SUCCESS {
                kinds[3] += 1;
            } else if c.wc_flags & IBV_WC_GRH != 0 {
                kinds[2] += 1;
            }
            let Some(t) = got.first() else {
                diffs += 1;
                eprintln!("golden responder DIFFERENCE: op {op}: libmlx5 polled nothing");
                continue;
            };
            // SAFETY: plain integers of the union.
            let t_imm = unsafe { t.__bindgen_anon_1.imm_data };
            let same = Some(t.wr_id) == o_wr
                && t.status == o_status
                && t.qp_num == c.qpn
                && if t.status == IBV_WC_SUCCESS {
                    t.opcode == c.opcode
                        && t.byte_len == c.byte_len
                        && t.wc_flags == c.wc_flags
                        && (c.wc_flags & (IBV_WC_WITH_IMM | IBV_WC_WITH_INV) == 0
                            || t_imm == c.imm_raw
                            || (c.wc_flags & IBV_WC_WITH_INV != 0
                                && t_imm == u32::from_be(c.imm_raw)))
                        && t.src_qp == c.src_qp
                        && t.slid == c.slid
                        && t.sl == c.sl
                        && t.dlid_path_bits == c.dlid_path_bits
                        && t.pkey_index == c.pkey_index
                } else if op == 14 {
                    t.vendor_err == c.vendor_err
                } else {
                    true
                }
                && theirs == ours;
            let pw = pc[0].as_raw();
            // SAFETY: plain integers of the union.
            let p_imm = unsafe { pw.__bindgen_anon_1.imm_data };
            let by_poller = polled.as_ref().ok() == Some(&1)
                && pw.wr_id == t.wr_id
                && pw.status == t.status
                && pw.qp_num == t.qp_num
                && if t.status == IBV_WC_SUCCESS {
                    pw.opcode == t.opcode
                        && pw.byte_len == t.byte_len
                        && pw.wc_flags == t.wc_flags
                        && (t.wc_flags & (IBV_WC_WITH_IMM | IBV_WC_WITH_INV) == 0 || p_imm == t_imm)
                        && pw.src_qp == t.src_qp
                        && pw.slid == t.slid
                        && pw.sl == t.sl
                        && pw.dlid_path_bits == t.dlid_path_bits
                        && pw.pkey_index == t.pkey_index
                } else {
                    op != 14 || pw.vendor_err == t.vendor_err
                };
            let same = same && by_poller;
            compared += 1;
            if !same {
                diffs += 1;
                if diffs <= 3 && !QUIET.load(Ordering::Relaxed) {
                    eprintln!(
                        "golden responder DIFFERENCE (cqe {cqe}, op {op}, format {format:#x}, \
                         byte_cnt {byte_cnt}): libmlx5 wr_id {} status {} opcode {} len {} \
                         flags {:#x} src_qp {:#x} slid {} sl {} path {} pkey {} imm {:#x}; ours \
                         {o_wr:?} {o_status} {c:?}; poller {polled:?} {:?}; buffers equal {}",
                        t.wr_id,
                        t.status,
                        t.opcode,
                        t.byte_len,
                        t.wc_flags,
                        t.src_qp,
                        t.slid,
                        t.sl,
                        t.dlid_path_bits,
                        t.pkey_index,
                        t_imm,
                        pc[0],
                        theirs == ours
                    );
                }
            }
        }
        (compared, diffs, kinds)
    }
}
