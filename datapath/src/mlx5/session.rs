//! Fixed-size inline SENDs on a [`DirectRing`] at the instruction floor: a held
//! [`DirectSession`] (one BlueFlame doorbell per message) and a [`DirectWindow`] (a post
//! list: room and signal decided once for the whole list).
//!
//! # Why these exist beside `send_now` and `batch`
//! A per-call `send_now(&mut self, Msg)` keeps the ring's state in memory between calls, and
//! the `asm!` barriers of the doorbell (`sfence`) make the compiler store and reload every
//! piece of it around each post (about 16 instructions), then the message's length and kind
//! are dispatched at run time (about 13 more). A session copies what the fast path needs
//! into itself (a value the caller holds in registers: nothing takes its address, so the
//! barriers cannot touch it) and knows the message's size at compile time (`[u8; LEN]`):
//! the `ds`, the inline header and the ctrl word's constant half are constants. Its slow
//! path (the signal every `signal_every`, a full ring, the error state) is a cold function
//! that takes and returns values, so it never makes the session's state escape either.
//!
//! # The ring's promises, kept
//! Exact retirement (completions go through the ring's
//! [`on_completion`](DirectRing::on_completion)), back-pressure (`WouldBlock` when
//! `depth` WRs are outstanding), a signal every `signal_every` and on the WR that fills the
//! ring, the same SQ bytes, doorbell record and BlueFlame buffers as the ring's own lone
//! path (a test compares them), the error state (`QpError`).
//!
//! # `wrid` entries, written late
//! The session's fast path writes no `wrid` entry (a store, and two registers for the
//! table and the `wr_id` epoch: 5 instructions a message in `cargo xtask insn`). Its slow
//! path writes the entry of the WR it posts, so every signaled WR has its entry when it is
//! posted, and only a signaled WR completes successfully. The others are written by
//! [`DirectRing::write_session_ids`]: when the session closes (or the ring repairs a
//! leaked one), and before an error CQE is resolved. An error CQE (the failing WR, then the
//! flush of every later one) may name any WR; [`DirectPoller`](crate::DirectPoller) puts
//! its `wqe_counter` in the completion, and the ring reads the entry there again once the
//! entries are written. When the session closes, the table is as if every post had
//! written its own entry (the golden comparison checks it against libmlx5's).
//!
//! # Leaks (`mem::forget`)
//! While a session or window is open the ring's own `event` is 0 and `batch_open` is set,
//! so any ring call after a leak takes the slow path, which repairs the ring:
//! - a leaked window announced nothing (its WQEs are written, the doorbell is rung at
//!   `finish` or drop): the ring goes back to its posted count, as for a leaked batch;
//! - a leaked session announced every message it sent (one doorbell each), and wrote the
//!   ring's counters back at its last slow path (at most `signal_every` messages ago). Every
//!   message is one basic block, so the doorbell record, which holds the last doorbell's
//!   `cur_post`, says how many followed: the ring catches up from it
//!   ([`DirectRing::catch_up_session`]). A completion that arrives for one of those before
//!   any other call does the same.

use super::DirectRing;
use crate::cq::Completion;
use crate::error::{ConfigError, SendError, WcError};
use crate::mlx5::{opcode, Doorbell, CTRL_CQ_UPDATE, INLINE_SEG, SND_DBR};
use crate::wr_id;

/// `ds` of a one-block inline SEND of `len` bytes: the ctrl segment and the inline segment
/// (4-byte header and the bytes, in 16-byte units).
const fn inline_ds(len: usize) -> u64 {
    1 + (len as u64 + 4).div_ceil(16)
}

/// Checks that `LEN`-byte inline SENDs fit the ring's one-block path (RC / UC, BlueFlame
/// or doorbell, `1 <= LEN <= min(44, max_inline)`): one comparison (a UD ring's
/// `one_max` is 0), the error decided out of line.
#[inline(always)]
fn check_len<D: Doorbell>(ring: &DirectRing<D>, len: usize) -> Result<(), SendError> {
    let max = ring.st.f.one_max;
    if len == 0 || len > max as usize {
        return Err(len_error(len, max, ring.st.f.ud.is_some()));
    }
    Ok(())
}

/// [`check_len`]'s error (`ud`: the ring's QP is UD).
#[cold]
fn len_error(len: usize, max: u32, ud: bool) -> SendError {
    if ud {
        // A UD ring: its WQEs carry the datagram segment, never one block with 44 bytes.
        return SendError::Config(ConfigError::Fixed(
            "a UD ring's WQEs carry the datagram segment and are never one basic block: use \
             send_now or batch",
        ));
    }
    SendError::InlineTooLong {
        len,
        max: if len == 0 { 0 } else { max },
    }
}

/// What a session's fast path keeps in registers.
#[derive(Clone, Copy, Debug)]
struct Hot {
    /// `cur_post` as a 64-bit counter: `seq + cur_off` (every session WQE is one block).
    c: u64,
    /// The first `c` that takes the slow path (0 until the first post decides it).
    ev: u64,
    /// `seq = c - cur_off`.
    cur_off: u64,
    sq: *mut u8,
    /// The send counter of the doorbell record.
    dbr: *mut u32,
    /// The address of the BlueFlame buffer of the next doorbell. An address, toggled by one
    /// XOR: the register's provenance is exposed when the session opens (a pointer's
    /// `map_addr` costs a subtraction and an addition more per post).
    bf: usize,
    bf_size: usize,
    mask: u64,
    /// The ctrl word's constant half for a SEND of this size: opcode, `qpn << 8 | ds`.
    w0: u64,
    /// BlueFlame takes a block (else the 8-byte doorbell).
    bf_one: bool,
}

/// A held session of `LEN`-byte inline SENDs (1 to 44 bytes, within the ring's
/// `max_inline`), each posted at once with its own doorbell (BlueFlame where the ring
/// uses it): [`DirectRing::session`]. Completions go through
/// [`on_completion`](Self::on_completion). Dropping the session gives the ring back.
#[must_use = "a session is how its messages are sent"]
pub struct DirectSession<'r, D: Doorbell, const LEN: usize> {
    ring: &'r mut DirectRing<D>,
    h: Hot,
}

impl<D: Doorbell, const LEN: usize> core::fmt::Debug for DirectSession<'_, D, LEN> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("DirectSession")
            .field("len", &LEN)
            .field("seq", &self.h.c.wrapping_sub(self.h.cur_off))
            .finish_non_exhaustive()
    }
}

/// The start of a window or post list ([`DirectRing::open_list`]): counters as `cur_post`
/// (`c` up to `end`), `wrid` values `c + wid_off`, `seq = c - cur_off`, and the WQE's
/// constants.
#[derive(Clone, Copy)]
struct List {
    c: u64,
    end: u64,
    wid_off: u64,
    cur_off: u64,
    sq: *mut u8,
    wrid: *mut u64,
    mask: u64,
    w0: u64,
}

/// What the session's slow path decided for the WR at hand.
#[derive(Clone, Copy)]
struct Decided {
    ev: u64,
    /// The ctrl segment's second word's signal bits (`fm_ce_se << 24`).
    fm: u64,
}

impl<D: Doorbell> DirectRing<D> {
    /// Opens a [`DirectSession`] of `LEN`-byte inline SENDs: for a stream of fixed-size
    /// messages (an order, a quote) sent one doorbell each, at the fewest instructions the
    /// ring's promises allow. Anything staged is posted first.
    ///
    /// # Errors
    /// [`SendError::InlineTooLong`] unless `1 <= LEN <= min(44, max_inline)`;
    /// [`ConfigError::Fixed`] on a UD ring (its WQEs are never one block) and in split
    /// mode (the session retires its own completions).
    pub fn session<const LEN: usize>(&mut self) -> Result<DirectSession<'_, D, LEN>, SendError> {
        check_len(self, LEN)?;
        if self.is_split() {
            return Err(SendError::Config(ConfigError::Fixed(
                "a session retires its own completions, which a split ring's poller thread \
                 does: use send_now, batch or window in split mode",
            )));
        }
        if self.st.batch_open | self.st.lone_run {
            self.repair();
        }
        // Post what is staged, so that every WR from here on is one the session posts.
        self.ring_doorbell();
        let st = &self.st;
        let seq = st.f.seq;
        let cur_off = u64::from(st.f.cur.wrapping_sub(seq as u32));
        let h = Hot {
            c: seq.wrapping_add(cur_off),
            ev: 0,
            cur_off,
            sq: st.f.sq,
            // SAFETY: the QP's doorbell record has the send counter at SND_DBR (new's
            // contract).
            dbr: unsafe { st.dbrec.add(SND_DBR) },
            bf: st.bf_cur.expose_provenance(),
            bf_size: st.bf_size as usize,
            mask: u64::from(st.f.mask),
            w0: (opcode::SEND as u64) << 32 | u64::from(st.f.qpn8) | inline_ds(LEN),
            bf_one: st.bf_one,
        };
        self.st.batch_open = true;
        self.st.session_open = true;
        self.st.sess_s0 = seq;
        self.st.sess_ids = seq;
        self.st.sess_cur0 = self.st.f.cur;
        self.park_event();
        Ok(DirectSession { ring: self, h })
    }

    /// The session's slow path, before the WQE at `c` (`seq = c - cur_off`) is written:
    /// room, the signal and the next event, and this WR's `wrid` entry. On success the
    /// ring's counters are written back as they will be once this WR is posted (the session
    /// posts it right after; nothing can look at the ring in between). Takes and returns
    /// values: the session's state never escapes (see the [module docs](self)).
    #[cold]
    #[inline(never)]
    fn session_decide(&mut self, c: u64, cur_off: u64) -> Result<Decided, SendError> {
        let seq = c.wrapping_sub(cur_off);
        let st = &mut self.st;
        if !crate::split::has_room(seq, st.retired, st.limit) {
            // Counters as they are: the messages sent since the last slow path.
            st.f.seq = seq;
            st.posted = seq;
            return Err(self.blocked());
        }
        // One past the last sequence number with room (`seq < end`: room, checked above).
        let end = st.retired + st.limit;
        // Signaled: the schedule's WR, or the one that fills the ring. Decided first, so
        // that nothing but the signal bits lives on (fewer registers to save).
        let ns = st.next_signal;
        let fm = if seq >= ns || seq + 1 == end {
            u64::from(CTRL_CQ_UPDATE) << 24
        } else {
            0
        };
        let ns = if seq >= ns {
            let n = seq + st.signal_every;
            st.next_signal = n;
            n
        } else {
            ns
        };
        // The next event: the next signal, or the WR that fills the ring (`end - 1`), or
        // the next WR when this one fills it. No end of a `wr_id` epoch (as the ring's own
        // event has): the fast path writes no `wrid` entry, and every entry written (here
        // and in `write_session_ids`) is computed for its own WR.
        let ev = ns.min(end - 1).max(seq + 1).wrapping_add(cur_off);
        st.f.seq = seq + 1;
        st.posted = seq + 1;
        // This WR's `wrid` entry (the fast path writes none: see `write_session_ids`).
        // SAFETY: `c & mask` < wqe_cnt: an entry of the table; the WR has room.
        unsafe { st.write_id(c as u32, seq) };
        Ok(Decided { ev, fm })
    }

    /// Gives the ring back from a session that ended at `c` with BlueFlame buffer `bf`.
    #[inline(never)]
    fn close_session(&mut self, c: u64, cur_off: u64, bf: usize) {
        let seq = c.wrapping_sub(cur_off);
        let st = &mut self.st;
        st.f.seq = seq;
        st.posted = seq;
        st.f.cur = c as u32;
        st.bf_cur = st.bf_cur.with_addr(bf);
        self.write_session_ids();
        let st = &mut self.st;
        st.session_open = false;
        st.batch_open = false;
        self.set_event(self.event_at());
    }

    /// Writes the `wrid` entries of the session's WRs (`sess_s0` up to the ring's `seq`)
    /// that its fast path did not: those of the newest `wqe_cnt` at most, whose blocks no
    /// later WR reused (every session WQE is one block, and the session's WRs are the
    /// newest). Each is the entry the ring's own paths write (`id_bits` and the sequence
    /// number's 55 bits), so afterwards the table is as if every post had written its
    /// own. The fast path saves its store and the registers for the table and the epoch;
    /// a CQE can only need an entry the slow path did not write when it is an error CQE
    /// (only signaled WRs, whose entries the slow path writes, complete successfully), and
    /// then [`on_completion`](Self::on_completion) calls this first.
    ///
    /// Those written once are not written again (`sess_ids`): a flush of N WRs resolves N
    /// error CQEs, each after this call.
    #[cold]
    #[inline(never)]
    pub(super) fn write_session_ids(&mut self) {
        let st = &mut self.st;
        let end = st.f.seq;
        let start = st
            .sess_ids
            .max(end.saturating_sub(u64::from(st.f.mask) + 1));
        // `cur - seq`, the same for every WR of the session (each one block).
        let cur_off = st.sess_cur0.wrapping_sub(st.sess_s0 as u32);
        for seq in start..end {
            // SAFETY: an entry of a WR of this session (see above), which nothing else
            // writes.
            unsafe { st.write_id((seq as u32).wrapping_add(cur_off), seq) };
        }
        st.sess_ids = end;
    }

    /// The messages a session posted since it last wrote the ring's counters back (each
    /// one block, one doorbell): from the doorbell record's `cur_post`. 0 without a session.
    #[inline]
    pub(super) fn session_delta(&self) -> u64 {
        if !self.st.session_open && !self.st.lone_run {
            return 0;
        }
        // SAFETY: the QP's doorbell record (new's contract), which only this ring (through
        // its session) writes.
        let dbr = u32::from_be(unsafe { self.st.dbrec.add(SND_DBR).read_volatile() });
        u64::from(dbr.wrapping_sub(self.session_cur()) & 0xffff)
    }

    /// `cur_post` after the WRs the ring's counters count (`seq`), while a session is open
    /// (or leaked): every session WQE is one block. The session's slow path keeps `seq`
    /// and `posted` up to date, not `cur`, which is this until the session ends.
    #[inline]
    pub(super) fn session_cur(&self) -> u32 {
        let st = &self.st;
        st.sess_cur0
            .wrapping_add(st.f.seq.wrapping_sub(st.sess_s0) as u32)
    }

    /// Brings the ring's counters up to what an open (or leaked) session posted (and
    /// `cur_post`, which the session's slow path does not keep). Not the BlueFlame buffer:
    /// while the session is open it keeps its own, and the ring's stays where the session
    /// found it ([`end_leaked_session`](Self::end_leaked_session) sets it).
    #[cold]
    pub(super) fn catch_up_session(&mut self) {
        let d = self.session_delta();
        let st = &mut self.st;
        st.f.seq += d;
        st.posted = st.f.seq;
        self.st.f.cur = self.session_cur();
    }

    /// Takes the ring back from a leaked session: its counters and `wrid` entries
    /// ([`catch_up_session`](Self::catch_up_session),
    /// [`write_session_ids`](Self::write_session_ids)), and its BlueFlame buffer: the one
    /// the session opened with, switched once per doorbell since (one per WQE, each one
    /// block).
    #[cold]
    pub(super) fn end_leaked_session(&mut self) {
        self.catch_up_session();
        self.write_session_ids();
        let st = &mut self.st;
        let rung = st.f.cur.wrapping_sub(st.sess_cur0);
        st.bf_cur = st
            .bf_cur
            .map_addr(|a| a ^ ((rung as usize & 1) * st.bf_size as usize));
        st.session_open = false;
    }

    /// What a window and `post_list` start from: `LEN` checked, a leaked batch or session
    /// repaired, the room (at most `max`, the ring's free room and the rest of the `wr_id`
    /// epoch: every WR of the list has the same `wid_off`) and the WQE constants.
    #[inline(always)]
    fn open_list<const LEN: usize>(&mut self, max: u64) -> Result<List, SendError> {
        check_len(self, LEN)?;
        if self.st.batch_open | self.st.lone_run {
            self.repair();
        }
        let st = &self.st;
        let seq = st.f.seq;
        let cur_off = u64::from(st.f.cur.wrapping_sub(seq as u32));
        let epoch_end = (seq | wr_id::SEQ_MASK).wrapping_add(1);
        let room = (st.retired + st.limit)
            .saturating_sub(seq)
            .min(epoch_end - seq)
            .min(max);
        let id_off = st.id_bits.wrapping_sub(seq & !wr_id::SEQ_MASK);
        let c = seq.wrapping_add(cur_off);
        Ok(List {
            c,
            end: c + room,
            wid_off: id_off.wrapping_sub(cur_off),
            cur_off,
            sq: st.f.sq,
            wrid: st.f.wrid,
            mask: u64::from(st.f.mask),
            w0: (opcode::SEND as u64) << 32 | u64::from(st.f.qpn8) | inline_ds(LEN),
        })
    }

    /// Opens a [`DirectWindow`] of up to `max` `LEN`-byte inline SENDs, posted with one
    /// doorbell at [`finish`](DirectWindow::finish) (or drop) with anything already
    /// staged. Room and the signal are decided here, once: the window holds at most the
    /// ring's free room (`max` included; 0 in the error state), and its last WQE is
    /// signaled if the schedule's signal falls inside it or it fills the ring.
    ///
    /// # Errors
    /// As [`session`](Self::session) (split mode is allowed: room is decided here).
    pub fn window<const LEN: usize>(
        &mut self,
        max: usize,
    ) -> Result<DirectWindow<'_, D, LEN>, SendError> {
        let l = self.open_list::<LEN>(max as u64)?;
        self.st.batch_open = true;
        self.park_event();
        Ok(DirectWindow { ring: self, l })
    }

    /// Posts `msgs` (`LEN`-byte inline SENDs, in order) with one doorbell, as many as the
    /// ring has room for, with anything already staged: a post list whose room, signal and
    /// counters are decided once, and whose loop keeps everything in registers. Returns
    /// how many were posted (all of them unless the ring filled); the first has sequence
    /// number `next_seq` as it was.
    ///
    /// # Errors
    /// As [`session`](Self::session) for `LEN`; [`SendError::WouldBlock`] when the ring
    /// has no room at all ([`SendError::QpError`] in the error state).
    pub fn post_list<const LEN: usize>(&mut self, msgs: &[[u8; LEN]]) -> Result<usize, SendError> {
        let l = self.open_list::<LEN>(msgs.len() as u64)?;
        let room = (l.end - l.c) as usize;
        if room == 0 {
            return if msgs.is_empty() {
                Ok(0)
            } else {
                Err(self.blocked())
            };
        }
        let List {
            mut c,
            cur_off,
            wid_off,
            sq,
            wrid,
            mask,
            w0,
            ..
        } = l;
        // Two runs of consecutive blocks: up to the end of the SQ, then from its start.
        // Within a run the WQE and its `wrid` entry are pointers that step, not indices.
        // (One loop for both runs: two copies of it spill.)
        let mut rest = &msgs[..room];
        while !rest.is_empty() {
            let idx = (c & mask) as usize;
            let run = rest.len().min(mask as usize + 1 - idx);
            // SAFETY: `rest` is not empty and `idx <= mask`, so both operands of the `min`
            // are at least 1. (Said to the compiler, it drops an empty-run test per call.)
            unsafe { core::hint::assert_unchecked(run != 0) };
            let (now, later) = rest.split_at(run);
            // SAFETY: blocks idx..idx + run are in the SQ (run <= wqe_cnt - idx) and so are
            // their wrid entries; `room` WRs fit the ring (decided above), so no outstanding
            // WQE is in these blocks; LEN <= 44 (checked): one block each.
            unsafe {
                let mut ctrl = sq.add(idx << 6);
                let mut id = wrid.add(idx);
                for m in now {
                    one_block(ctrl, id, m, word0(c, w0), 0, c.wrapping_add(wid_off));
                    c += 1;
                    ctrl = ctrl.add(64);
                    id = id.add(1);
                }
            }
            rest = later;
        }
        self.close_list(c, cur_off);
        Ok(room)
    }

    /// Closes a window that wrote the one-block WQEs up to `c` (none, or some): the signal,
    /// the counters, one doorbell. Out of line: a window's drop glue stays a call on values.
    #[inline(never)]
    fn close_window(&mut self, c: u64, cur_off: u64) {
        self.st.batch_open = false;
        if c.wrapping_sub(cur_off) > self.st.f.seq {
            self.close_list(c, cur_off);
        } else {
            self.park_event();
        }
    }

    /// Posts the one-block WQEs a list wrote from the ring's `seq` up to `c` (at least
    /// one), with anything staged before them: the signal, the counters, one doorbell.
    /// Inline in [`post_list`](Self::post_list). Nothing is left staged, so the newest
    /// WQE is not recorded (only a staged one's is read).
    #[inline(always)]
    fn close_list(&mut self, c: u64, cur_off: u64) {
        let end = c.wrapping_sub(cur_off);
        let st = &mut self.st;
        let newest = end - 1;
        // The newest WQE's block (every list WQE is one block).
        let last =
            st.f.sq
                .wrapping_add(((c.wrapping_sub(1) & u64::from(st.f.mask)) as usize) << 6);
        if newest >= st.next_signal || end - st.retired == st.limit {
            // SAFETY: `last` is the ctrl segment of the list's newest WQE, in the SQ, not
            // yet announced: byte 11 is its `fm_ce_se`.
            unsafe {
                let b = last.add(11);
                b.write(b.read() | CTRL_CQ_UPDATE);
            }
            while st.next_signal <= newest {
                st.next_signal += st.signal_every;
            }
        }
        st.f.seq = end;
        st.f.cur = c as u32;
        self.list_doorbell(last);
        // The next send_now / batch / session post takes the slow path, which decides the
        // event where it is needed (a list saves the 30 instructions of deciding it).
        self.park_event();
    }
}

impl<D: Doorbell, const LEN: usize> DirectSession<'_, D, LEN> {
    /// Sends `data` (an RC / UC SEND), posted at once. Returns its sequence number.
    ///
    /// # Errors
    /// [`SendError::WouldBlock`] when `depth` WRs are outstanding (retire some through
    /// [`on_completion`](Self::on_completion)); [`SendError::QpError`] in the error state.
    #[inline(always)]
    pub fn send(&mut self, data: &[u8; LEN]) -> Result<u64, SendError> {
        self.post(data, 0, 0)
    }

    /// Sends `data` with immediate data `imm` (SEND_WITH_IMM); otherwise as
    /// [`send`](Self::send).
    #[inline(always)]
    pub fn send_imm(&mut self, data: &[u8; LEN], imm: u32) -> Result<u64, SendError> {
        self.post(
            data,
            (opcode::SEND_IMM as u64 - opcode::SEND as u64) << 32,
            u64::from(imm.to_be()) << 32,
        )
    }

    #[inline(always)]
    fn post(&mut self, data: &[u8; LEN], op_delta: u64, w1: u64) -> Result<u64, SendError> {
        let c = self.h.c;
        if c >= self.h.ev {
            return self.post_decided(data, op_delta, w1);
        }
        let h = &mut self.h;
        // SAFETY: `c < ev`: room, no signal due, BlueFlame in use (`ev` stays 0 without
        // it: every post decides).
        let ctrl = unsafe { write_wqe::<LEN>(h, data, op_delta, w1) };
        // SAFETY: the one block just written, BlueFlame in use.
        unsafe { doorbell(&mut self.ring.db, h, ctrl, true) };
        Ok(c.wrapping_sub(h.cur_off))
    }

    /// The slow path ([`DirectRing::session_decide`], which takes and returns values: the
    /// session's own state never has its address taken), then the WQE, signaled if due,
    /// and its doorbell (the 8-byte one without BlueFlame). Inline, in the caller's cold
    /// block, so that the fast path keeps its constants.
    #[inline(always)]
    fn post_decided(&mut self, data: &[u8; LEN], op_delta: u64, w1: u64) -> Result<u64, SendError> {
        let c = self.h.c;
        let d = self.ring.session_decide(c, self.h.cur_off)?;
        let h = &mut self.h;
        let bf = h.bf_one;
        h.ev = if bf { d.ev } else { 0 };
        // SAFETY: session_decide found room (and wrote the WR's `wrid` entry).
        let ctrl = unsafe { write_wqe::<LEN>(h, data, op_delta, w1 | d.fm) };
        // SAFETY: the one block just written.
        unsafe { doorbell(&mut self.ring.db, h, ctrl, bf) };
        Ok(c.wrapping_sub(h.cur_off))
    }

    /// Retires the WRs a send completion covers, as [`DirectRing::on_completion`].
    ///
    /// # Errors
    /// As `DirectRing::on_completion`; after an error completion the next send returns
    /// [`SendError::QpError`].
    #[inline(always)]
    pub fn on_completion(&mut self, c: &Completion) -> Result<u64, WcError> {
        let r = self.ring.on_completion(c);
        if r.is_err() {
            // The next send takes the slow path, which sees the error state (or the room).
            self.h.ev = 0;
        }
        r
    }

    /// WRs posted and not yet retired.
    #[inline(always)]
    pub fn outstanding(&self) -> u64 {
        self.h.c.wrapping_sub(self.h.cur_off) - self.ring.st.retired
    }

    /// The sequence number the next message gets.
    #[inline(always)]
    pub fn next_seq(&self) -> u64 {
        self.h.c.wrapping_sub(self.h.cur_off)
    }

    /// Ends the session (as dropping it does).
    #[inline(always)]
    pub fn finish(self) {}
}

/// Writes the one-block WQE of a `LEN`-byte inline SEND with counter `c` at `ctrl` and
/// its `wrid` entry at `id`: [`one_wqe`] and the entry. The writer of the window and
/// `post_list`.
///
/// # Safety
/// As [`one_wqe`]; `id` is the block's `wrid` entry.
#[inline(always)]
unsafe fn one_block<const LEN: usize>(
    ctrl: *mut u8,
    id: *mut u64,
    data: &[u8; LEN],
    word0: u64,
    w1: u64,
    wr_id: u64,
) {
    // SAFETY: the caller's contract: the block's 64 bytes and the entry are ours.
    unsafe {
        one_wqe(ctrl, data, word0, w1);
        id.write(wr_id);
    }
}

/// Writes the one-block WQE of a `LEN`-byte inline SEND at `ctrl`: inline header, the
/// bytes (a copy of a constant size: moves at fixed offsets from `data`, no length test),
/// the ctrl segment (`w0`: opcode, counter and `qpn_ds`; `w1`: signal bits and
/// immediate). The one WQE writer of the session, the window and `post_list`.
///
/// # Safety
/// `ctrl` is a basic block of the SQ no outstanding WQE uses, and `1 <= LEN <= 44`.
#[inline(always)]
unsafe fn one_wqe<const LEN: usize>(ctrl: *mut u8, data: &[u8; LEN], word0: u64, w1: u64) {
    // SAFETY: the caller's contract: the block's 64 bytes are ours.
    unsafe {
        ctrl.add(16)
            .cast::<u32>()
            .write((LEN as u32 | INLINE_SEG).to_be());
        core::ptr::copy_nonoverlapping(data.as_ptr(), ctrl.add(20), LEN);
        ctrl.cast::<u64>().write(word0);
        ctrl.add(8).cast::<u64>().write(w1);
    }
}

/// The ctrl segment's first word as stored (big-endian) for counter `c` and constant half
/// `w0` (opcode, `qpn << 8 | ds`).
#[inline(always)]
fn word0(c: u64, w0: u64) -> u64 {
    (u64::from(opaque(c as u32 & 0xffff)) << 40 | w0).swap_bytes()
}

/// `x`, which the optimiser can no longer see through (an empty `asm!` block that takes and
/// gives back the register: no instruction). For the counter's low 16 bits in [`word0`]:
/// the compiler otherwise folds the 16-bit zero extension into the shift as a 64-bit mask
/// (a shift, a 64-bit constant and an AND, with a register for the constant, instead of
/// one `movzwl`): 2 instructions per WQE of a session, a window and `post_list` (`cargo
/// xtask insn`, x86-64; elsewhere, and under miri, the identity).
#[cfg(all(target_arch = "x86_64", not(miri)))]
#[inline(always)]
pub(super) fn opaque(mut x: u32) -> u32 {
    // SAFETY: an empty template (the operand only named in a comment): no instruction, no
    // memory or stack access, flags untouched; `x` comes back as it went in.
    unsafe {
        core::arch::asm!(
            "/* {0:e} */",
            inout(reg) x,
            options(pure, nomem, nostack, preserves_flags)
        )
    };
    x
}

/// See the x86-64 version (miri does not run `asm!`).
#[cfg(not(all(target_arch = "x86_64", not(miri))))]
#[inline(always)]
pub(super) fn opaque(x: u32) -> u32 {
    x
}

/// Writes the one-block WQE of a `LEN`-byte inline SEND at `h.c` (`w1`: the ctrl
/// segment's second word: signal bits and immediate) and advances `h.c`. No `wrid` entry:
/// see [`DirectRing::write_session_ids`]. Returns its ctrl segment.
///
/// # Safety
/// The WR has room (no outstanding WQE in its block) and `1 <= LEN <= 44`.
#[inline(always)]
unsafe fn write_wqe<const LEN: usize>(
    h: &mut Hot,
    data: &[u8; LEN],
    op_delta: u64,
    w1: u64,
) -> *mut u8 {
    let c = h.c;
    let idx = (c & h.mask) as usize;
    // SAFETY: idx < wqe_cnt: the block is in the SQ; the caller's contract for the rest.
    unsafe {
        let ctrl = h.sq.add(idx << 6);
        one_wqe(ctrl, data, word0(c, h.w0 + op_delta), w1);
        h.c = c + 1;
        ctrl
    }
}

/// The doorbell of the one block at `ctrl` (`h.c` already past it): the doorbell record,
/// then the BlueFlame copy (`bf`) or the 8-byte doorbell; the next BlueFlame buffer.
///
/// # Safety
/// `ctrl` is the block just written by [`write_wqe`]; the register is the QP's.
#[inline(always)]
unsafe fn doorbell<D: Doorbell>(db: &mut D, h: &mut Hot, ctrl: *mut u8, bf: bool) {
    let dst = core::ptr::with_exposed_provenance_mut::<u64>(h.bf);
    h.bf ^= h.bf_size;
    db.to_device_barrier();
    // SAFETY: the QP's doorbell record and register (new's contract); the BlueFlame source
    // is the WQE's one block.
    unsafe {
        db.write_dbr(h.dbr, (h.c as u32 & 0xffff).to_be());
        db.wc_start();
        if bf {
            db.bf_block(dst, ctrl.cast());
        } else {
            db.write64(dst, ctrl.cast::<u64>().read());
        }
    }
    db.flush_writes();
}

impl<D: Doorbell, const LEN: usize> Drop for DirectSession<'_, D, LEN> {
    // Tiny, so the glue inlines and the session's address never escapes (see DirectBatch).
    #[inline(always)]
    fn drop(&mut self) {
        self.ring.close_session(self.h.c, self.h.cur_off, self.h.bf);
    }
}

/// A post list of up to a fixed number of `LEN`-byte inline SENDs with one doorbell:
/// [`DirectRing::window`].
#[must_use = "a window posts its messages on finish() or drop"]
pub struct DirectWindow<'r, D: Doorbell, const LEN: usize> {
    ring: &'r mut DirectRing<D>,
    l: List,
}

impl<D: Doorbell, const LEN: usize> core::fmt::Debug for DirectWindow<'_, D, LEN> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("DirectWindow")
            .field("len", &LEN)
            .field("room", &self.room())
            .finish_non_exhaustive()
    }
}

impl<D: Doorbell, const LEN: usize> DirectWindow<'_, D, LEN> {
    /// Messages the window still takes.
    #[inline(always)]
    pub fn room(&self) -> usize {
        (self.l.end - self.l.c) as usize
    }

    /// Writes `data` as the next SEND of the list. Returns its sequence number.
    ///
    /// # Errors
    /// When the window is full: [`SendError::QpError`] if the ring is in the error state,
    /// else [`SendError::WouldBlock`] (finish this window; the next one has the room
    /// completions made).
    #[inline(always)]
    pub fn push(&mut self, data: &[u8; LEN]) -> Result<u64, SendError> {
        let c = self.l.c;
        if c == self.l.end {
            return Err(self.ring.blocked());
        }
        let idx = (c & self.l.mask) as usize;
        // SAFETY: idx < wqe_cnt; `c < end` means the window's room (decided at `window`)
        // covers this WR, so no outstanding WQE is in its block; LEN <= 44 (checked).
        unsafe {
            one_block(
                self.l.sq.add(idx << 6),
                self.l.wrid.add(idx),
                data,
                word0(c, self.l.w0),
                0,
                c.wrapping_add(self.l.wid_off),
            );
        }
        self.l.c = c + 1;
        Ok(c.wrapping_sub(self.l.cur_off))
    }

    /// Posts the list (one doorbell; BlueFlame for a single WQE).
    #[inline(always)]
    pub fn finish(self) {}
}

impl<D: Doorbell, const LEN: usize> Drop for DirectWindow<'_, D, LEN> {
    #[inline(always)]
    fn drop(&mut self) {
        self.ring.close_window(self.l.c, self.l.cur_off);
    }
}
