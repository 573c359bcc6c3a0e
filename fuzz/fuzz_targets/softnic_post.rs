//! softnic's `post_send` / `post_recv` on arbitrary work-request chains: raw
//! `ibv_send_wr` / `ibv_recv_wr` structs built from the fuzzer's bytes, with arbitrary
//! opcodes (valid, unsupported and undefined values), flags, `num_sge` (negative and beyond
//! the cap), keys (the QPs' own MRs, a read-only MR, an MR of another PD, random values),
//! addresses and lengths (inside, across and outside the MRs), remote addresses and keys,
//! sent from QP A to QP B (both RC, or both UC: the input's first byte chooses), whose
//! receives are just as arbitrary. On UC the responder's failures are silent drops and
//! READ/atomics are unsupported opcodes, so the same oracle runs with different outcomes.
//!
//! The oracle is softnic's documented behaviour (`hotverbs_softnic`'s crate docs: posting,
//! execution and completions), re-stated as a small model with shadow memory.
//!
//! Invariants checked after every step:
//! - every post returns 0 or the errno the man pages and the docs prescribe (ENOMEM for a
//!   full queue, EINVAL for `num_sge`, inline size and atomic alignment), with `*bad_wr`
//!   pointing at the first rejected WR of the chain;
//! - every completion at A and B is the predicted one (wr_id, status, opcode, byte_len,
//!   imm/flags, QP numbers), in order, none missing, none extra;
//! - memory: the whole arena (four registered regions and the unregistered guards between
//!   them) equals the shadow copy, so nothing was written outside an MR range the request
//!   was entitled to, nor missed; AddressSanitizer watches everything else;
//! - softnic's SQ occupancy equals the model's.
//!
//! Inline SGEs are the one place softnic reads caller memory without an MR: the harness
//! keeps their addresses inside the arena whenever their length is not zero (as
//! `ibv_post_send(3)` requires of the caller).
//!
//! Planted bug (`--features planted-bug`): the oracle rejects `num_sge == max_send_sge`
//! (an off-by-one `>=` in the cap check).
#![no_main]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

use std::collections::VecDeque;
use std::ptr;
use std::sync::Mutex;

use arbitrary::Arbitrary;
use hotverbs_ffi::*;
use hotverbs_fuzz::{Pair, PairConfig, ALL_ACCESS};
use libfuzzer_sys::fuzz_target;

const SQ_CAP: u32 = 8;
const RQ_CAP: u32 = 8;
const MAX_SGE: u32 = 4;
const MAX_INLINE: u32 = 64;
const G: usize = 64;
const R: usize = 2048;
const TAIL: usize = 256;
/// Four regions, each after a guard, and a larger guard at the end.
const ARENA: usize = 4 * (G + R) + TAIL;
const MAX_STEPS: usize = 48;
/// Finding 1 (see fuzz/README.md, fixed in softnic): softnic built a slice from an inline
/// SGE's address even when its length was 0, undefined behaviour for address 0. `true`
/// steers the harness around address 0 (as it did until the fix).
const AVOID_NULL_INLINE: bool = false;
/// Finding 2 (see fuzz/README.md, fixed in softnic): `IBV_SEND_INLINE` means the payload is
/// captured at post time, so an inline WRITE or SEND whose destination overlaps its own
/// later source SGEs delivers the bytes as they were when posted (the model's snapshot).
/// softnic's zero-copy inline path read the sources piece by piece while writing the
/// destination; `false` models that behaviour (how the target ran green until the fix).
const INLINE_SNAPSHOT: bool = true;

#[derive(Clone, Copy, Debug)]
struct MrInfo {
    key: u32,
    pd: u32,
    access: u32,
    /// Offset in the arena.
    off: usize,
}

struct Rig {
    pair: Pair,
    arena: &'static mut [u8],
    /// rw (pd 1, all access), ro (pd 1, no access bits), b (pd 1, all access), x (pd 2).
    mrs: [MrInfo; 4],
}

/// One rig per QP type (RC, UC), built on first use.
static RIGS: Mutex<[Option<Rig>; 2]> = Mutex::new([None, None]);

fn region(i: usize) -> usize {
    i * (G + R) + G
}

fn rig(qp_type: ibv_qp_type) -> Rig {
    let pair = Pair::new(PairConfig {
        sq_depth: SQ_CAP,
        rq_depth: RQ_CAP,
        max_sge: MAX_SGE,
        max_inline: MAX_INLINE,
        cq_size: 4096,
        rnr_retry_a: 0,
        qp_type,
    });
    let arena: &'static mut [u8] = Box::leak(vec![0u8; ARENA].into_boxed_slice());
    let base = arena.as_mut_ptr();
    let mut mrs = [MrInfo {
        key: 0,
        pd: 0,
        access: 0,
        off: 0,
    }; 4];
    for (i, (pd, pdn, access)) in [
        (pair.pd, 1, ALL_ACCESS),
        (pair.pd, 1, 0),
        (pair.pd, 1, ALL_ACCESS),
        (pair.pd2, 2, ALL_ACCESS),
    ]
    .into_iter()
    .enumerate()
    {
        // SAFETY: the leaked arena lives for the rest of the process; region i is inside.
        let mr = unsafe { pair.reg(pd, base.add(region(i)), R, access) };
        // SAFETY: non-NULL MR from ibv_reg_mr.
        let (lkey, rkey) = unsafe { ((*mr).lkey, (*mr).rkey) };
        assert_eq!(lkey, rkey, "softnic documents lkey == rkey");
        mrs[i] = MrInfo {
            key: lkey,
            pd: pdn,
            access,
            off: region(i),
        };
    }
    Rig { pair, arena, mrs }
}

#[derive(Arbitrary, Debug, Clone, Copy)]
struct SgeSpec {
    key: u8,
    raw_key: u32,
    region: u8,
    off: u16,
    len: u16,
    raw: u64,
}

#[derive(Arbitrary, Debug, Clone)]
struct SendSpec {
    wr_id: u16,
    opcode: u8,
    raw_opcode: u32,
    flags: u8,
    num_sge: u8,
    sges: [SgeSpec; 6],
    remote: SgeSpec,
    imm: u32,
    compare_add: u64,
    swap: u64,
    /// Below 64: the remote address is this many bytes after the first SGE's, so a WRITE
    /// or READ overlaps its own local buffers (a case random addresses rarely hit).
    near: u8,
    /// Lay the SGEs out back to back from the first one's address (one buffer cut in
    /// pieces), instead of each at its own address.
    contiguous: bool,
}

#[derive(Arbitrary, Debug, Clone)]
struct RecvSpec {
    wr_id: u16,
    num_sge: u8,
    sges: [SgeSpec; 6],
}

#[derive(Arbitrary, Debug)]
enum Step {
    Send(Vec<SendSpec>),
    Recv(Vec<RecvSpec>),
    Poll,
    Reset,
}

fn num_sge(sel: u8) -> i32 {
    (sel % 9) as i32 - 2 // -2..=6 around the cap of 4
}

fn key(rig: &Rig, s: &SgeSpec) -> u32 {
    match s.key % 6 {
        k @ 0..=3 => rig.mrs[k as usize].key,
        4 => s.raw_key,
        _ => 0,
    }
}

/// An address: in or around one of the four regions, at the arena's start, or raw.
fn addr(rig: &Rig, s: &SgeSpec) -> u64 {
    let base = rig.arena.as_ptr() as u64;
    match s.region % 6 {
        r @ 0..=3 => {
            base + region(r as usize) as u64 - G as u64 + (s.off as u64 % (R + 2 * G) as u64)
        }
        4 => base + (s.off as u64 % (ARENA - TAIL) as u64),
        _ => s.raw,
    }
}

/// A length: half of them small (inline sizes, around the 64-byte cap), most others up to
/// a little more than a region, a few anything at all.
fn len(s: &SgeSpec) -> u32 {
    match s.len >> 14 {
        0 | 1 => (s.len % 72) as u32,
        2 => (s.len as usize % (R + 2 * G)) as u32,
        _ => (s.raw >> 32) as u32,
    }
}

/// Shadow memory and the expected state of both QPs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct ExpWc {
    wr_id: u64,
    status: u32,
    opcode: u32,
    byte_len: u32,
    imm: Option<u32>,
    qp_num: u32,
    src_qp: u32,
}

#[derive(Clone, Copy, Debug)]
struct SendCqe {
    wc: ExpWc,
    dseq: u64,
    epoch: u32,
}

struct Model {
    shadow: Vec<u8>,
    base: u64,
    mrs: [MrInfo; 4],
    a_err: bool,
    b_err: bool,
    b_rq: VecDeque<(u64, Vec<ibv_sge>)>,
    occ_posted: u64,
    occ_released: u64,
    epoch: u32,
    a_cq: VecDeque<SendCqe>,
    b_cq: VecDeque<ExpWc>,
    qpn_a: u32,
    qpn_b: u32,
    /// The WR being executed moves B to ERR after A's completion (a responder error).
    pending_b_err: bool,
    /// RC (errors are reported to the requester) or UC (the message is silently dropped).
    reliable: bool,
}

/// A resolved range: (arena offset, length).
type Seg = (usize, usize);

enum Src<'a> {
    Arena(&'a [Seg]),
    Bytes(&'a [u8]),
}

impl Model {
    fn resolve(&self, key: u32, pd: u32, addr: u64, len: u64, need: u32) -> Option<usize> {
        let mr = self.mrs.iter().find(|m| m.key == key)?;
        if mr.pd != pd || mr.access & need != need {
            return None;
        }
        let iova = self.base + mr.off as u64;
        let off = addr.checked_sub(iova)?;
        if off.checked_add(len)? > R as u64 {
            return None;
        }
        Some(mr.off + off as usize)
    }

    fn resolve_sges(&self, sges: &[ibv_sge], need: u32) -> Option<Vec<Seg>> {
        let mut out = Vec::new();
        for s in sges {
            if s.length == 0 {
                continue;
            }
            out.push((
                self.resolve(s.lkey, 1, s.addr, s.length as u64, need)?,
                s.length as usize,
            ));
        }
        Some(out)
    }

    /// Copies `len` bytes piece by piece (memmove per piece), as a gather/scatter engine does.
    fn scatter(&mut self, dst: &[Seg], src: Src<'_>, len: usize) {
        let one;
        let src_segs: &[Seg] = match &src {
            Src::Arena(s) => s,
            Src::Bytes(b) => {
                one = [(0usize, b.len())];
                &one
            }
        };
        let (mut di, mut doff, mut si, mut soff) = (0, 0, 0, 0);
        let mut left = len;
        while left > 0 {
            while doff == dst[di].1 {
                di += 1;
                doff = 0;
            }
            while soff == src_segs[si].1 {
                si += 1;
                soff = 0;
            }
            let n = left.min(dst[di].1 - doff).min(src_segs[si].1 - soff);
            let d = dst[di].0 + doff;
            match &src {
                Src::Arena(_) => {
                    let s = src_segs[si].0 + soff;
                    self.shadow.copy_within(s..s + n, d);
                }
                Src::Bytes(b) => self.shadow[d..d + n].copy_from_slice(&b[soff..soff + n]),
            }
            doff += n;
            soff += n;
            left -= n;
        }
    }

    fn send_cqe(&mut self, wr: &ibv_send_wr, dseq: u64, status: u32, byte_len: u32) {
        let op = wr.opcode;
        stats::count(op.min(15) as usize * 32 + status.min(31) as usize);
        let opcode = match op {
            IBV_WR_RDMA_WRITE | IBV_WR_RDMA_WRITE_WITH_IMM => IBV_WC_RDMA_WRITE,
            IBV_WR_RDMA_READ => IBV_WC_RDMA_READ,
            IBV_WR_ATOMIC_CMP_AND_SWP => IBV_WC_COMP_SWAP,
            IBV_WR_ATOMIC_FETCH_AND_ADD => IBV_WC_FETCH_ADD,
            _ => IBV_WC_SEND,
        };
        let ok = status == IBV_WC_SUCCESS;
        // The sender's completion of a *_WITH_IMM WR carries the WITH_IMM flag and
        // imm_data 0 (rxe G5; ibv_poll_cq(3) defines imm_data for receives only).
        let imm =
            (ok && (op == IBV_WR_SEND_WITH_IMM || op == IBV_WR_RDMA_WRITE_WITH_IMM)).then_some(0);
        self.a_cq.push_back(SendCqe {
            wc: ExpWc {
                wr_id: wr.wr_id,
                status,
                opcode,
                byte_len: if ok { byte_len } else { 0 },
                imm,
                qp_num: self.qpn_a,
                src_qp: 0,
            },
            dseq,
            epoch: self.epoch,
        });
    }

    fn recv_cqe(
        &mut self,
        wr_id: u64,
        status: u32,
        opcode: u32,
        byte_len: u32,
        imm: Option<u32>,
        src_qp: u32,
    ) {
        let ok = status == IBV_WC_SUCCESS;
        self.b_cq.push_back(ExpWc {
            wr_id,
            status,
            opcode,
            byte_len: if ok { byte_len } else { 0 },
            imm: if ok { imm } else { None },
            qp_num: self.qpn_b,
            src_qp,
        });
    }

    fn b_to_err(&mut self) {
        if self.b_err {
            return;
        }
        self.b_err = true;
        while let Some((id, _)) = self.b_rq.pop_front() {
            self.recv_cqe(id, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV, 0, None, 0);
        }
    }

    /// The errno `post_send` returns for `wr`, or None if it is accepted.
    fn check_send(&self, wr: &ibv_send_wr, sges: &[ibv_sge]) -> Option<i32> {
        if self.occ_posted - self.occ_released >= SQ_CAP as u64 {
            return Some(libc::ENOMEM);
        }
        let too_many = if cfg!(feature = "planted-bug") {
            wr.num_sge as i64 >= MAX_SGE as i64
        } else {
            wr.num_sge as i64 > MAX_SGE as i64
        };
        if wr.num_sge < 0 || too_many {
            return Some(libc::EINVAL);
        }
        let op = wr.opcode;
        let total: u64 = sges.iter().map(|s| s.length as u64).sum();
        if is_inline(wr) && total > MAX_INLINE as u64 {
            return Some(libc::EINVAL);
        }
        if op == IBV_WR_ATOMIC_CMP_AND_SWP || op == IBV_WR_ATOMIC_FETCH_AND_ADD {
            // SAFETY: plain-data union; atomic is the member for these opcodes.
            let raddr = unsafe { wr.wr.atomic.remote_addr };
            if raddr % 8 != 0 || sges.len() != 1 || sges[0].length < 8 {
                return Some(libc::EINVAL);
            }
        }
        None
    }

    /// Execution of an accepted WR at A (QP A in RTS).
    fn execute(&mut self, wr: &ibv_send_wr, sges: &[ibv_sge], data: Option<Vec<u8>>) -> u32 {
        let op = wr.opcode;
        let uc_ops = matches!(
            op,
            IBV_WR_SEND | IBV_WR_SEND_WITH_IMM | IBV_WR_RDMA_WRITE | IBV_WR_RDMA_WRITE_WITH_IMM
        );
        let rc_only = matches!(
            op,
            IBV_WR_RDMA_READ | IBV_WR_ATOMIC_CMP_AND_SWP | IBV_WR_ATOMIC_FETCH_AND_ADD
        );
        let valid = uc_ops || (self.reliable && rc_only);
        if !valid {
            return IBV_WC_LOC_QP_OP_ERR;
        }
        let local_write = matches!(
            op,
            IBV_WR_RDMA_READ | IBV_WR_ATOMIC_CMP_AND_SWP | IBV_WR_ATOMIC_FETCH_AND_ADD
        );
        let local = match &data {
            Some(_) => Vec::new(),
            None => match self.resolve_sges(
                sges,
                if local_write {
                    IBV_ACCESS_LOCAL_WRITE
                } else {
                    0
                },
            ) {
                Some(l) => l,
                None => return IBV_WC_LOC_PROT_ERR,
            },
        };
        let total: usize = match &data {
            Some(d) => d.len(),
            None => local.iter().map(|s| s.1).sum(),
        };
        // On UC every failure the responder would report is a silent drop.
        let rc = self.reliable;
        let or_drop = |s: u32| if rc { s } else { IBV_WC_SUCCESS };
        if self.b_err {
            return or_drop(IBV_WC_RETRY_EXC_ERR);
        }
        let (d, l) = if INLINE_SNAPSHOT || data.is_none() {
            (data, local)
        } else {
            // Today's softnic: inline bytes read from the SGEs while executing.
            let segs = sges
                .iter()
                .filter(|s| s.length > 0)
                .map(|s| ((s.addr - self.base) as usize, s.length as usize))
                .collect();
            (None, segs)
        };
        // SAFETY: plain-data unions; the member read matches the opcode family.
        let (raddr, rkey) = unsafe {
            if op == IBV_WR_ATOMIC_CMP_AND_SWP || op == IBV_WR_ATOMIC_FETCH_AND_ADD {
                (wr.wr.atomic.remote_addr, wr.wr.atomic.rkey)
            } else {
                (wr.wr.rdma.remote_addr, wr.wr.rdma.rkey)
            }
        };
        // SAFETY: plain u32 union.
        let imm = unsafe { wr.__bindgen_anon_1.imm_data };
        match op {
            IBV_WR_SEND | IBV_WR_SEND_WITH_IMM => {
                let Some((id, rsges)) = self.b_rq.pop_front() else {
                    return or_drop(IBV_WC_RNR_RETRY_EXC_ERR);
                };
                let imm = (op == IBV_WR_SEND_WITH_IMM).then_some(imm);
                let Some(dst) = self.resolve_sges(&rsges, IBV_ACCESS_LOCAL_WRITE) else {
                    self.recv_cqe(id, IBV_WC_LOC_PROT_ERR, IBV_WC_RECV, 0, None, self.qpn_a);
                    self.pending_b_err = true;
                    return or_drop(IBV_WC_REM_OP_ERR);
                };
                let room: usize = dst.iter().map(|s| s.1).sum();
                if total > room {
                    self.recv_cqe(id, IBV_WC_LOC_LEN_ERR, IBV_WC_RECV, 0, None, self.qpn_a);
                    self.pending_b_err = true;
                    return or_drop(IBV_WC_REM_INV_REQ_ERR);
                }
                match &d {
                    Some(bytes) => self.scatter(&dst, Src::Bytes(bytes), total),
                    None => self.scatter(&dst, Src::Arena(&l), total),
                }
                self.recv_cqe(
                    id,
                    IBV_WC_SUCCESS,
                    IBV_WC_RECV,
                    total as u32,
                    imm,
                    self.qpn_a,
                );
                IBV_WC_SUCCESS
            }
            IBV_WR_RDMA_WRITE | IBV_WR_RDMA_WRITE_WITH_IMM => {
                let dst = if total > 0 {
                    match self.resolve(rkey, 1, raddr, total as u64, IBV_ACCESS_REMOTE_WRITE) {
                        Some(p) => Some(p),
                        None => {
                            self.pending_b_err = rc;
                            return or_drop(IBV_WC_REM_ACCESS_ERR);
                        }
                    }
                } else {
                    None
                };
                if op == IBV_WR_RDMA_WRITE_WITH_IMM && self.b_rq.is_empty() {
                    return or_drop(IBV_WC_RNR_RETRY_EXC_ERR);
                }
                if let Some(p) = dst {
                    match &d {
                        Some(bytes) => self.scatter(&[(p, total)], Src::Bytes(bytes), total),
                        None => self.scatter(&[(p, total)], Src::Arena(&l), total),
                    }
                }
                if op == IBV_WR_RDMA_WRITE_WITH_IMM {
                    let (id, _) = self.b_rq.pop_front().unwrap();
                    self.recv_cqe(
                        id,
                        IBV_WC_SUCCESS,
                        IBV_WC_RECV_RDMA_WITH_IMM,
                        total as u32,
                        Some(imm),
                        self.qpn_a,
                    );
                }
                IBV_WC_SUCCESS
            }
            IBV_WR_RDMA_READ => {
                if total > 0 {
                    let Some(p) =
                        self.resolve(rkey, 1, raddr, total as u64, IBV_ACCESS_REMOTE_READ)
                    else {
                        self.pending_b_err = true;
                        return IBV_WC_REM_ACCESS_ERR;
                    };
                    self.scatter(&l, Src::Arena(&[(p, total)]), total);
                }
                IBV_WC_SUCCESS
            }
            _ => {
                let Some(p) = self.resolve(rkey, 1, raddr, 8, IBV_ACCESS_REMOTE_ATOMIC) else {
                    self.pending_b_err = true;
                    return IBV_WC_REM_ACCESS_ERR;
                };
                if (self.base as usize + p) % 8 != 0 {
                    self.pending_b_err = true;
                    return IBV_WC_REM_ACCESS_ERR;
                }
                let orig = u64::from_ne_bytes(self.shadow[p..p + 8].try_into().unwrap());
                let new = if op == IBV_WR_ATOMIC_CMP_AND_SWP {
                    // SAFETY: plain-data union, atomic member for atomics.
                    let (cmp, swap) = unsafe { (wr.wr.atomic.compare_add, wr.wr.atomic.swap) };
                    if orig == cmp {
                        swap
                    } else {
                        orig
                    }
                } else {
                    // SAFETY: as above.
                    orig.wrapping_add(unsafe { wr.wr.atomic.compare_add })
                };
                self.shadow[p..p + 8].copy_from_slice(&new.to_ne_bytes());
                self.scatter(&l, Src::Bytes(&orig.to_ne_bytes()), 8);
                IBV_WC_SUCCESS
            }
        }
    }
}

fn is_inline(wr: &ibv_send_wr) -> bool {
    wr.send_flags & IBV_SEND_INLINE != 0
        && matches!(
            wr.opcode,
            IBV_WR_SEND | IBV_WR_SEND_WITH_IMM | IBV_WR_RDMA_WRITE | IBV_WR_RDMA_WRITE_WITH_IMM
        )
}

fn listed(sges: &[ibv_sge], n: i32) -> &[ibv_sge] {
    &sges[..(n.max(0) as usize).min(sges.len())]
}

impl Model {
    /// `post_send` at A: (return value, index of `*bad_wr`).
    fn post_send(&mut self, chain: &[ibv_send_wr], sges: &[Vec<ibv_sge>]) -> (i32, Option<usize>) {
        for (j, wr) in chain.iter().enumerate() {
            let sg = listed(&sges[j], wr.num_sge);
            if let Some(e) = self.check_send(wr, sg) {
                return (e, Some(j));
            }
            let dseq = self.occ_posted;
            self.occ_posted += 1;
            let data = is_inline(wr).then(|| {
                let mut v = Vec::new();
                for s in sg.iter().filter(|s| s.length > 0) {
                    let off = (s.addr - self.base) as usize;
                    v.extend_from_slice(&self.shadow[off..off + s.length as usize]);
                }
                v
            });
            let byte_len = match &data {
                Some(d) => d.len() as u32,
                None => sg.iter().fold(0u32, |a, s| a.wrapping_add(s.length)),
            };
            if self.a_err {
                self.send_cqe(wr, dseq, IBV_WC_WR_FLUSH_ERR, 0);
                continue;
            }
            let status = self.execute(wr, sg, data);
            if status != IBV_WC_SUCCESS || wr.send_flags & IBV_SEND_SIGNALED != 0 {
                self.send_cqe(wr, dseq, status, byte_len);
            }
            if status != IBV_WC_SUCCESS {
                self.a_err = true;
            }
            if self.pending_b_err {
                self.pending_b_err = false;
                self.b_to_err();
            }
        }
        (0, None)
    }

    /// `post_recv` at B.
    fn post_recv(&mut self, chain: &[ibv_recv_wr], sges: &[Vec<ibv_sge>]) -> (i32, Option<usize>) {
        let mut rc = (0, None);
        let mut posted = false;
        for (j, wr) in chain.iter().enumerate() {
            if wr.num_sge < 0 || wr.num_sge as u32 > MAX_SGE {
                rc = (libc::EINVAL, Some(j));
                break;
            }
            if self.b_rq.len() >= RQ_CAP as usize {
                rc = (libc::ENOMEM, Some(j));
                break;
            }
            self.b_rq
                .push_back((wr.wr_id, listed(&sges[j], wr.num_sge).to_vec()));
            posted = true;
        }
        if posted && self.b_err {
            while let Some((id, _)) = self.b_rq.pop_front() {
                self.recv_cqe(id, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV, 0, None, 0);
            }
        }
        rc
    }

    fn reset(&mut self) {
        self.a_err = false;
        self.b_err = false;
        self.b_rq.clear();
        self.occ_posted = 0;
        self.occ_released = 0;
        self.epoch += 1;
    }
}

fn sge(rig: &Rig, s: &SgeSpec) -> ibv_sge {
    ibv_sge {
        addr: addr(rig, s),
        length: len(s),
        lkey: key(rig, s),
    }
}

/// Keeps the addresses of inline SGEs that softnic will read inside the arena.
fn fix_inline(rig: &Rig, wr: &ibv_send_wr, sges: &mut [ibv_sge]) {
    let n = (wr.num_sge.max(0) as usize).min(sges.len());
    let total: u64 = sges[..n].iter().map(|s| s.length as u64).sum();
    if !is_inline(wr) || wr.num_sge as u32 > MAX_SGE || total > MAX_INLINE as u64 {
        return;
    }
    let base = rig.arena.as_ptr() as u64;
    if AVOID_NULL_INLINE {
        for s in sges[..n]
            .iter_mut()
            .filter(|s| s.length == 0 && s.addr == 0)
        {
            s.addr = base;
        }
    }
    for s in sges[..n].iter_mut().filter(|s| s.length > 0) {
        let end = s.addr.checked_add(s.length as u64);
        if s.addr < base || end.is_none_or(|e| e > base + ARENA as u64) {
            s.addr = base + s.addr % (ARENA - MAX_INLINE as usize) as u64;
        }
    }
}

fn rc_name(rc: i32) -> &'static str {
    if rc == 0 {
        "0 (success)"
    } else {
        errno_name(rc)
    }
}

fn check_wc(got: &ibv_wc, want: &ExpWc, side: &str) {
    assert_eq!(
        got.wc_flags & !IBV_WC_WITH_IMM,
        0,
        "{side}: unexpected wc_flags {:#x}",
        got.wc_flags
    );
    let g = ExpWc {
        wr_id: got.wr_id,
        status: got.status,
        opcode: got.opcode,
        byte_len: got.byte_len,
        // SAFETY: plain u32 union.
        imm: (got.wc_flags & IBV_WC_WITH_IMM != 0)
            .then_some(unsafe { got.__bindgen_anon_1.imm_data }),
        qp_num: got.qp_num,
        src_qp: got.src_qp,
    };
    assert_eq!(
        g,
        *want,
        "{side} completion: got {}, want {}",
        wc_status_name(g.status),
        wc_status_name(want.status)
    );
}

fn step(rig: &mut Rig, m: &mut Model, st: &Step) {
    match st {
        Step::Send(specs) => {
            let specs = &specs[..specs.len().min(8)];
            if specs.is_empty() {
                return;
            }
            let mut sges: Vec<Vec<ibv_sge>> = Vec::new();
            let mut chain: Vec<ibv_send_wr> = Vec::new();
            for sp in specs {
                let n = num_sge(sp.num_sge);
                // SAFETY: ibv_send_wr is plain data; all-zero is valid.
                let mut wr: ibv_send_wr = unsafe { core::mem::zeroed() };
                wr.wr_id = sp.wr_id as u64;
                wr.opcode = if sp.opcode >= 0xf0 {
                    sp.raw_opcode
                } else {
                    sp.opcode as u32 % 16
                };
                wr.send_flags = sp.flags as u32;
                wr.num_sge = n;
                wr.__bindgen_anon_1.imm_data = sp.imm;
                let mut raddr = addr(rig, &sp.remote);
                let rkey = key(rig, &sp.remote);
                if sp.near < 64 && n > 0 {
                    raddr = addr(rig, &sp.sges[0]).wrapping_add(sp.near as u64);
                }
                if wr.opcode == IBV_WR_ATOMIC_CMP_AND_SWP
                    || wr.opcode == IBV_WR_ATOMIC_FETCH_AND_ADD
                {
                    wr.wr.atomic = ibv_send_wr__bindgen_ty_2__bindgen_ty_2 {
                        remote_addr: raddr,
                        compare_add: sp.compare_add,
                        swap: sp.swap,
                        rkey,
                    };
                } else {
                    wr.wr.rdma = ibv_send_wr__bindgen_ty_2__bindgen_ty_1 {
                        remote_addr: raddr,
                        rkey,
                    };
                }
                let mut list: Vec<ibv_sge> = sp.sges[..n.max(0) as usize]
                    .iter()
                    .map(|s| sge(rig, s))
                    .collect();
                if sp.contiguous {
                    for k in 1..list.len() {
                        list[k].addr = list[k - 1].addr.wrapping_add(list[k - 1].length as u64);
                    }
                }
                fix_inline(rig, &wr, &mut list);
                sges.push(list);
                chain.push(wr);
            }
            let k = chain.len();
            let p = chain.as_mut_ptr();
            for (j, list) in sges.iter_mut().enumerate() {
                // SAFETY: j and j + 1 index `chain`, which is not resized from here on; each
                // sg_list holds exactly num_sge entries (none when num_sge <= 0).
                unsafe {
                    (*p.add(j)).sg_list = list.as_mut_ptr();
                    (*p.add(j)).next = if j + 1 < k {
                        p.add(j + 1)
                    } else {
                        ptr::null_mut()
                    };
                }
            }
            let mut bad: *mut ibv_send_wr = ptr::null_mut();
            // SAFETY: a well-formed chain on a live softnic QP; inline SGEs point into the
            // arena (fix_inline) or have length 0.
            let rc = unsafe { inline::ibv_post_send(rig.pair.a.qp, p, &mut bad) };
            let (want_rc, want_bad) = m.post_send(&chain, &sges);
            assert_eq!(
                rc,
                want_rc,
                "post_send: got {}, want {}",
                rc_name(rc),
                rc_name(want_rc)
            );
            if let Some(j) = want_bad {
                assert_eq!(bad, p.wrapping_add(j), "bad_wr is not WR {j} of the chain");
            }
        }
        Step::Recv(specs) => {
            let specs = &specs[..specs.len().min(8)];
            if specs.is_empty() {
                return;
            }
            let mut sges: Vec<Vec<ibv_sge>> = Vec::new();
            let mut chain: Vec<ibv_recv_wr> = Vec::new();
            for sp in specs {
                let n = num_sge(sp.num_sge);
                sges.push(
                    sp.sges[..n.max(0) as usize]
                        .iter()
                        .map(|s| sge(rig, s))
                        .collect(),
                );
                chain.push(ibv_recv_wr {
                    wr_id: sp.wr_id as u64 | 1 << 32,
                    next: ptr::null_mut(),
                    sg_list: ptr::null_mut(),
                    num_sge: n,
                });
            }
            let k = chain.len();
            let p = chain.as_mut_ptr();
            for (j, list) in sges.iter_mut().enumerate() {
                // SAFETY: as for the send chain.
                unsafe {
                    (*p.add(j)).sg_list = list.as_mut_ptr();
                    (*p.add(j)).next = if j + 1 < k {
                        p.add(j + 1)
                    } else {
                        ptr::null_mut()
                    };
                }
            }
            let mut bad: *mut ibv_recv_wr = ptr::null_mut();
            // SAFETY: a well-formed chain on a live softnic QP; receive buffers are only
            // written through MR lookups.
            let rc = unsafe { inline::ibv_post_recv(rig.pair.b.qp, p, &mut bad) };
            let (want_rc, want_bad) = m.post_recv(&chain, &sges);
            assert_eq!(
                rc,
                want_rc,
                "post_recv: got {}, want {}",
                rc_name(rc),
                rc_name(want_rc)
            );
            if let Some(j) = want_bad {
                assert_eq!(bad, p.wrapping_add(j), "bad_wr is not WR {j} of the chain");
            }
        }
        Step::Poll => {
            for wc in rig.pair.a.poll_all() {
                let want = m.a_cq.pop_front().unwrap_or_else(|| {
                    panic!(
                        "extra completion at A: wr_id {} {}",
                        wc.wr_id,
                        wc_status_name(wc.status)
                    )
                });
                check_wc(&wc, &want.wc, "A");
                if want.epoch == m.epoch {
                    m.occ_released = m.occ_released.max(want.dseq + 1);
                }
            }
            assert!(m.a_cq.is_empty(), "completions missing at A: {:?}", m.a_cq);
            for wc in rig.pair.b.poll_all() {
                let want = m.b_cq.pop_front().unwrap_or_else(|| {
                    panic!(
                        "extra completion at B: wr_id {} {}",
                        wc.wr_id,
                        wc_status_name(wc.status)
                    )
                });
                check_wc(&wc, &want, "B");
            }
            assert!(m.b_cq.is_empty(), "completions missing at B: {:?}", m.b_cq);
        }
        Step::Reset => {
            rig.pair.reconnect_both();
            m.reset();
        }
    }
    // Memory: exactly the writes the model made, nothing else.
    if rig.arena[..] != m.shadow[..] {
        let i = (0..ARENA).find(|&i| rig.arena[i] != m.shadow[i]).unwrap();
        panic!(
            "memory differs at arena offset {i} (region {}, offset {} in it): {:#04x}, model {:#04x}",
            i / (G + R),
            (i % (G + R)) as isize - G as isize,
            rig.arena[i],
            m.shadow[i]
        );
    }
    // SAFETY: live softnic QP.
    let occ = unsafe { hotverbs_softnic::sq_outstanding(rig.pair.a.qp) } as u64;
    assert_eq!(occ, m.occ_posted - m.occ_released, "SQ occupancy");
}

/// `HOTVERBS_FUZZ_STATS=1`: prints, every 50 000 inputs, how often each (opcode, status)
/// send completion was predicted — a quick check that the interesting outcomes are reached.
mod stats {
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    static COUNTS: [AtomicU64; 16 * 32] = [const { AtomicU64::new(0) }; 16 * 32];
    static INPUTS: AtomicU64 = AtomicU64::new(0);

    pub fn count(i: usize) {
        COUNTS[i].fetch_add(1, Relaxed);
    }

    pub fn input_done() {
        if INPUTS.fetch_add(1, Relaxed) % 50_000 == 49_999
            && std::env::var_os("HOTVERBS_FUZZ_STATS").is_some()
        {
            for (i, c) in COUNTS.iter().enumerate() {
                let c = c.load(Relaxed);
                if c > 0 {
                    eprintln!(
                        "opcode {:2} {:28} {c}",
                        i / 32,
                        hotverbs_ffi::wc_status_name((i % 32) as u32)
                    );
                }
            }
        }
    }
}

#[derive(Arbitrary, Debug)]
struct Input {
    /// UC instead of RC.
    uc: bool,
    steps: Vec<Step>,
}

fuzz_target!(|input: Input| {
    let mut guard = RIGS.lock().unwrap_or_else(|p| p.into_inner());
    let qp_type = if input.uc { IBV_QPT_UC } else { IBV_QPT_RC };
    let rig = guard[input.uc as usize].get_or_insert_with(|| rig(qp_type));
    rig.pair.restart();
    for (i, b) in rig.arena.iter_mut().enumerate() {
        *b = (i * 7 + 3) as u8;
    }
    let mut m = Model {
        shadow: rig.arena.to_vec(),
        base: rig.arena.as_ptr() as u64,
        mrs: rig.mrs,
        a_err: false,
        b_err: false,
        b_rq: VecDeque::new(),
        occ_posted: 0,
        occ_released: 0,
        epoch: 0,
        a_cq: VecDeque::new(),
        b_cq: VecDeque::new(),
        qpn_a: rig.pair.a.qpn(),
        qpn_b: rig.pair.b.qpn(),
        pending_b_err: false,
        reliable: !input.uc,
    };
    for st in input.steps.iter().take(MAX_STEPS) {
        step(rig, &mut m, st);
    }
    stats::input_done();
});
