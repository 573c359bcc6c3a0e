//! The mlx5 personality's doorbell registers: which QPs share one, and what was written
//! to it.
//!
//! **Sharing, as libmlx5 assigns registers** (rdma-core `providers/mlx5/verbs.c`): a QP
//! created in a thread domain uses the thread domain's own register (`mlx5_alloc_td` ->
//! `mlx5_attach_dedicated_uar`); the other QPs of a context share one register page here
//! (libmlx5 gives the first few a dedicated register and the rest shared ones under a
//! lock, and mlx5dv does not say which: sharing is the case a ring must survive). With
//! [`Config::mlx5_shut_up_bf`](crate::Config::mlx5_shut_up_bf), the context's shared
//! register has no BlueFlame (`bf.size` 0: libmlx5's `ctx->nc_uar`); a thread domain's
//! keeps its buffers (libmlx5 ignores the variable there).
//!
//! **What was written** ([`RegisterWrite`], read by
//! [`crate::mlx5sim::register_writes`]): at every step of the device, and before each
//! libmlx5 post is logged, both 256-byte buffers of every register are read. A buffer whose
//! first 8 bytes are not zero was written since: the ctrl segment there names the QP and
//! WQE counter (every doorbell carries them), a WQE's bytes past its first 16 mean a
//! BlueFlame copy (compared with the WQE in that QP's send queue), and the buffer is
//! cleared, as the device consumes it. A post through softnic's verbs (standing for
//! libmlx5) is logged as libmlx5's `post_send_db` would ring: at the register's own offset,
//! which it then toggles, BlueFlame for one inline WR of more than one 16-byte unit that
//! fits a buffer unless shut up. The device executes WQEs from the doorbell record, as
//! before; the register is only observed.
//!
//! Not modelled: two writes to one buffer between two steps (the second hides the first:
//! tests step after each post), libmlx5's reuse of a freed thread domain's register with
//! its offset (a new thread domain gets a fresh register here).

use std::sync::{Arc, Mutex};

use hotverbs_ffi::*;

use super::{BB, BF_OFFSET, BF_SIZE};
use crate::fabric::Fabric;
use crate::mlx5sim::{Region, RegisterWrite};

/// One register page: BlueFlame buffers at `+0x800` and `+0x900`.
pub(crate) struct DvReg {
    page: Region,
    /// `bf.size` as mlx5dv reports it (0: no BlueFlame).
    pub(crate) bf_size: u32,
    st: Mutex<RegState>,
}

// SAFETY: the page is plain memory the ring writes from its thread and the device reads
// under the fabric lock (see the memory-ordering note of the parent module); the state is
// behind its mutex.
unsafe impl Sync for DvReg {}

#[derive(Default)]
struct RegState {
    /// libmlx5's `bf->offset` for this register (the simulated provider's posts).
    lib_offset: u32,
    log: Vec<RegisterWrite>,
}

impl DvReg {
    pub(crate) fn new(bf_size: u32) -> DvReg {
        DvReg {
            page: Region::new(4096, 0),
            bf_size,
            st: Mutex::new(RegState::default()),
        }
    }

    /// `bf.reg`: the first BlueFlame buffer.
    pub(crate) fn reg(&self) -> *mut u8 {
        self.page.ptr.wrapping_add(BF_OFFSET)
    }

    fn state(&self) -> std::sync::MutexGuard<'_, RegState> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes the writes logged so far.
    pub(crate) fn take_log(&self) -> Vec<RegisterWrite> {
        std::mem::take(&mut self.state().log)
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Owner {
    /// The shared register of context `i`, made for the context at this address.
    Ctx(u32, usize),
    /// The register of thread domain `i`, made for the thread domain at this address.
    Td(u32, usize),
}

/// Every register made, with its owner (an entry whose owner's index now holds another
/// object is replaced when that index asks again: its QPs are gone, their `Arc`s with them).
static REGS: Mutex<Vec<(Owner, Arc<DvReg>)>> = Mutex::new(Vec::new());

fn regs() -> std::sync::MutexGuard<'static, Vec<(Owner, Arc<DvReg>)>> {
    REGS.lock().unwrap_or_else(|e| e.into_inner())
}

impl Fabric {
    /// The register QP `qi` rings: its thread domain's, or its context's shared one.
    pub(crate) fn dv_reg(&self, qi: usize) -> Arc<DvReg> {
        let q = self.qps[qi].as_ref().expect("live QP index");
        let td = match self.pds.get(q.pd as usize) {
            Some(Some(pd)) => pd.parent.flatten(),
            _ => None,
        };
        let owner = match td.and_then(|t| self.tds.get(t as usize)?.as_ref().map(|d| (t, d))) {
            Some((t, d)) => Owner::Td(t, d.ptr.0 as usize),
            None => {
                let addr = match self.ctxs.get(q.ctx as usize) {
                    Some(Some(c)) => c.ptr.0 as usize,
                    _ => 0,
                };
                Owner::Ctx(q.ctx, addr)
            }
        };
        let mut all = regs();
        if let Some((_, r)) = all.iter().find(|(o, _)| *o == owner) {
            return r.clone();
        }
        let same_slot = |o: &Owner| match (o, owner) {
            (Owner::Ctx(a, _), Owner::Ctx(b, _)) | (Owner::Td(a, _), Owner::Td(b, _)) => *a == b,
            _ => false,
        };
        all.retain(|(o, _)| !same_slot(o));
        let cfg = self.cfg(q.ctx);
        let bf_size = if cfg.mlx5_shut_up_bf && matches!(owner, Owner::Ctx(..)) {
            0
        } else {
            BF_SIZE
        };
        let r = Arc::new(DvReg::new(bf_size));
        all.push((owner, r.clone()));
        r
    }

    /// Reads what was written to every register since the last look (see the module docs).
    pub(crate) fn dv_scan_regs(&self) {
        let all: Vec<Arc<DvReg>> = regs().iter().map(|(_, r)| r.clone()).collect();
        for r in all {
            self.dv_scan(&r);
        }
    }

    fn dv_scan(&self, r: &DvReg) {
        for buffer in [0u32, BF_SIZE] {
            let p = r.reg().wrapping_add(buffer as usize);
            let mut b = [0u8; BF_SIZE as usize];
            // SAFETY: both buffers lie inside the 4 KiB page (0x800 + 2 * 256 <= 4096).
            unsafe {
                for (i, x) in b.iter_mut().enumerate() {
                    *x = p.add(i).read_volatile();
                }
            }
            if b[..8] == [0; 8] {
                continue;
            }
            let be32 = |o: usize| u32::from_be_bytes(b[o..o + 4].try_into().unwrap());
            let qp_num = be32(4) >> 8;
            let ds = (be32(4) & 0x3f) as usize;
            let wqe_counter = (be32(0) >> 8) as u16;
            let blueflame = b[16..64].iter().any(|&x| x != 0);
            let qi = self.qp_idx_by_qpn(qp_num);
            let dv = qi.and_then(|i| self.qps[i].as_ref()?.dv.as_deref());
            let own = dv.is_some_and(|d| std::ptr::eq(Arc::as_ptr(&d.reg), r));
            let copy_matches = blueflame
                && own
                && dv.is_some_and(|d| {
                    let n = (ds * 16).min(BF_SIZE as usize);
                    let mut w = vec![0u8; n];
                    d.read((wqe_counter as u32 & (d.wqe_cnt - 1)) as usize * BB, &mut w);
                    w[..] == b[..n]
                });
            // SAFETY: as above; the device consumed the buffer.
            unsafe { p.write_bytes(0, BF_SIZE as usize) };
            r.state().log.push(RegisterWrite {
                offset: buffer,
                qp_num,
                wqe_counter,
                blueflame,
                copy_matches,
                qp_of_register: own,
                by_libmlx5: false,
            });
        }
    }

    /// A post through softnic's verbs on a QP of the mlx5 personality, as libmlx5's
    /// `post_send_db` would ring its register: nothing when no WR was taken (`nreq` 0),
    /// else one write at the register's offset, which then toggles.
    ///
    /// # Safety
    /// `wr` is the chain just posted (valid), `bad` what the post wrote (readable).
    pub(crate) unsafe fn dv_libmlx5_post(
        &mut self,
        qi: usize,
        wr: *const ibv_send_wr,
        bad: *mut *mut ibv_send_wr,
        rc: i32,
    ) {
        let stop = if rc == 0 || bad.is_null() {
            std::ptr::null()
        } else {
            // SAFETY: readable (caller); NULL when nothing was refused by name.
            unsafe { *bad }.cast_const()
        };
        if rc != 0 && stop.is_null() {
            return; // refused unnamed (before RTS): nothing announced
        }
        let (mut nreq, mut first) = (0u32, None);
        let mut w = wr;
        while !w.is_null() && w != stop {
            // SAFETY: a valid chain (caller).
            let x = unsafe { &*w };
            first.get_or_insert(x);
            nreq += 1;
            w = x.next;
        }
        let Some(first) = first else {
            return;
        };
        let r = self.dv_reg(qi);
        // Earlier ring writes first, so the log keeps the order of the register's writes.
        self.dv_scan(&r);
        // libmlx5's test: one WR, inline, more than the ctrl segment, within a buffer.
        let len: u32 = if first.num_sge > 0 && !first.sg_list.is_null() {
            // SAFETY: num_sge entries (a valid WR).
            unsafe { std::slice::from_raw_parts(first.sg_list, first.num_sge as usize) }
                .iter()
                .map(|s| s.length)
                .sum()
        } else {
            0
        };
        let raddr = matches!(
            first.opcode,
            IBV_WR_RDMA_WRITE | IBV_WR_RDMA_WRITE_WITH_IMM | IBV_WR_RDMA_READ
        );
        let ds = 1 + raddr as u32 + if len > 0 { (len + 4).div_ceil(16) } else { 0 };
        let inline = first.send_flags & IBV_SEND_INLINE != 0;
        let ctx = self.qp(qi).ctx;
        let shut_up = self.cfg(ctx).mlx5_shut_up_bf;
        let blueflame = !shut_up && nreq == 1 && inline && ds > 1 && ds <= r.bf_size / 16;
        let mut st = r.state();
        let offset = st.lib_offset;
        st.lib_offset ^= r.bf_size;
        st.log.push(RegisterWrite {
            offset,
            qp_num: crate::fabric::Qp::qpn(qi),
            wqe_counter: 0,
            blueflame,
            copy_matches: blueflame,
            qp_of_register: true,
            by_libmlx5: true,
        });
    }
}
