//! The direct path's fixed-size loops: `send_lat` through a held
//! [`DirectSession`](hotverbs_datapath::DirectSession) of `LEN`-byte inline SENDs (one
//! doorbell each, BlueFlame where the ring uses it), `send_bw` through
//! [`DirectRing::post_list`](hotverbs_datapath::DirectRing::post_list) (`-l` messages per
//! list, one doorbell each). `LEN` is a const generic: a run's size reaches them through
//! `with_fixed_len!` over [`FIXED_LENS`], the sizes perftest runs most (its default, 2,
//! and `-a`'s powers of two up to the fixed path's 44-byte limit, and 44 itself); any other
//! size takes the engine's generic loops on the same ring (`send_now`, staged batches).
//!
//! While a session is open it owns the ring: send completions of QP 0 go to its
//! `on_completion` (the loops here poll the reaper themselves), receives to the QP's
//! receive ring as [`route`](super::route) would. Closing it (at the end of a size) gives
//! the ring back with its counters up to date. On the direct path (`--direct`: a receive
//! CQ of its own, read directly) `send_lat`'s receives go through a
//! [`RecvSession`] of QP 0's direct receive ring
//! (issue 30): each message taken where the device put it and its slot posted again at the
//! next receive, the send CQ polled on its own.

use std::time::Instant;

use hotverbs_datapath::mlx5::{Polled, RecvSession, RecvSessionError};
use hotverbs_datapath::{Completion, DirectPoller, Local, Msg, SendError};

use super::path::DirectSplit;
use super::{
    latency_loop, on_recv, unknown_ring, Hot, Lane, Measured, PostPath, Reap, Watchdog, LAST,
    SEND_RING,
};
use crate::cli::{Connection, Params, TestKind};
use crate::error::PerfError;
use crate::progress::Counter;

/// The message sizes the fixed-size loops are compiled for (the same list as
/// `with_fixed_len!`'s; a test checks they agree).
pub const FIXED_LENS: [u32; 6] = [2, 4, 8, 16, 32, 44];

/// `$body` with `$len` a `const usize` equal to `$size`, one of [`FIXED_LENS`] (the caller
/// checked: [`direct_path`]).
macro_rules! with_fixed_len {
    ($size:expr, $len:ident => $body:expr) => {
        with_fixed_len!(@ $size, $len, $body, [2, 4, 8, 16, 32, 44])
    };
    (@ $size:expr, $len:ident, $body:expr, [$($n:literal),*]) => {
        match $size {
            $($n => {
                const $len: usize = $n;
                $body
            })*
            s => Err(PerfError::Internal(format!(
                "size {s} has no fixed-size direct loop"
            ))),
        }
    };
}

/// Which of the direct path's APIs posts `test`'s messages of `size` bytes on a ring of
/// `max_inline` inline bytes: `"direct session"` (`send_lat`) and `"direct post_list"`
/// (`send_bw`) for a size of [`FIXED_LENS`] within `max_inline` over RC or UC, else
/// `"direct send_now"` (latency tests) or `"direct batch"` (bandwidth tests: staged WRs,
/// posted `-l` at a time).
pub fn direct_path(
    test: TestKind,
    connection: Connection,
    size: u32,
    max_inline: u32,
) -> &'static str {
    let fixed = FIXED_LENS.contains(&size) && size <= max_inline && connection != Connection::Ud;
    match test {
        TestKind::SendLat if fixed => "direct session",
        TestKind::SendBw if fixed => "direct post_list",
        t if t.is_latency() => "direct send_now",
        _ => "direct batch",
    }
}

impl<R: PostPath, C: Reap> Hot<R, C> {
    /// Does a fixed-size loop run `test` at `size` on this engine (the direct path, no
    /// `--events`)?
    #[inline(always)]
    pub(super) fn fixed_applies(&self, test: TestKind, size: u32) -> bool {
        R::DIRECT
            && self.events.is_none()
            && matches!(
                direct_path(test, self.side_conn, size, self.side.max_inline),
                "direct session" | "direct post_list"
            )
    }

    /// `send_lat`'s active side through a session on QP 0: each iteration one SEND (the
    /// last with immediate [`LAST`]) and the wait for the peer's.
    pub(super) fn ping_session<const LEN: usize>(
        &mut self,
        p: &Params,
        counter: &Counter,
        wd: &mut Watchdog<'_>,
    ) -> Result<Measured, PerfError> {
        let data = prefix::<LEN>(&self.payload)?;
        let clock = self.clock;
        let Hot {
            lanes,
            reaper,
            tally,
            ..
        } = self;
        let (mut s, recv) = open_session::<R, LEN>(&mut lanes[0])?;
        // The iteration, with `poll` one poll of everything (send completions to the
        // session, receives counted).
        let mut round = |last: bool,
                         s: &mut Session<'_, LEN>,
                         tally: &mut super::Tally,
                         poll: &mut PollFn<'_, LEN>|
         -> Result<Option<u64>, PerfError> {
            let want = tally.received + 1;
            loop {
                let r = if last {
                    s.send_imm(&data, LAST as u32)
                } else {
                    s.send(&data)
                };
                match r {
                    Ok(_) => break,
                    Err(SendError::WouldBlock) => {
                        if poll(s, tally)? == 0 {
                            wd.idle(mark(s, tally), "a send completion")?;
                        }
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            while tally.received < want {
                if poll(s, tally)? == 0 {
                    wd.idle(mark(s, tally), "a message from the peer")?;
                }
            }
            Ok(None)
        };
        with_poll(reaper, recv, |poll| {
            latency_loop(clock, None, p, counter, true, |_, last| {
                round(last, &mut s, tally, poll)
            })
        })
    }

    /// `send_lat`'s passive side through a session on QP 0: answers each SEND with one,
    /// until the one marked [`LAST`]. Returns the pings answered.
    pub(super) fn pong_session<const LEN: usize>(
        &mut self,
        wd: &mut Watchdog<'_>,
    ) -> Result<u64, PerfError> {
        let data = prefix::<LEN>(&self.payload)?;
        let Hot {
            lanes,
            reaper,
            tally,
            ..
        } = self;
        let (mut s, recv) = open_session::<R, LEN>(&mut lanes[0])?;
        let mut answer = |s: &mut Session<'_, LEN>,
                          tally: &mut super::Tally,
                          poll: &mut PollFn<'_, LEN>|
         -> Result<u64, PerfError> {
            let mut n = 0u64;
            loop {
                let want = tally.received + 1;
                tally.last_imm = None;
                while tally.received < want {
                    if poll(s, tally)? == 0 {
                        wd.idle(mark(s, tally), "a message from the peer")?;
                    }
                }
                let last = tally.last_imm == Some(LAST as u32);
                loop {
                    match s.send(&data) {
                        Ok(_) => break,
                        Err(SendError::WouldBlock) => {
                            if poll(s, tally)? == 0 {
                                wd.idle(mark(s, tally), "a send completion")?;
                            }
                        }
                        Err(e) => return Err(e.into()),
                    }
                }
                n += 1;
                if last {
                    return Ok(n);
                }
            }
        };
        with_poll(reaper, recv, |poll| answer(&mut s, tally, poll))
    }

    /// `send_bw`'s stream as [`stream_phase`](Hot::stream_phase) runs it, through post
    /// lists: round-robin over the QPs, each taking a list of up to `-l` messages (as many
    /// as it has room for, one doorbell); the final round, one signaled SEND per QP (with
    /// [`LAST`] if `mark_last`), through `send_now`. Returns the number of messages.
    pub(super) fn stream_list<const LEN: usize>(
        &mut self,
        size: u32,
        n: Option<u64>,
        until: Option<Instant>,
        mark_last: bool,
        counter: Option<&Counter>,
        wd: &mut Watchdog<'_>,
    ) -> Result<u64, PerfError> {
        let list = vec![prefix::<LEN>(&self.payload)?; self.batch.max(1) as usize];
        let qps = self.lanes.len();
        let mut posted = 0u64;
        let mut end = n;
        let mut k = 0usize;
        loop {
            if end.is_none() {
                if let Some(t) = until {
                    if Instant::now() >= t {
                        end = Some(posted + qps as u64);
                    }
                }
            }
            let target = end.unwrap_or(u64::MAX);
            let final_round = target.saturating_sub(qps as u64);
            let mut full = 0usize;
            while posted < target {
                let lane = &mut self.lanes[k];
                if posted >= final_round {
                    // Each QP's last message: its own turn, signaled, marked.
                    if lane.send.free() == 0 {
                        break;
                    }
                    lane.send.signal_next();
                    let l = Local::Inline(&self.payload[..size as usize]);
                    lane.send.send_now(if mark_last {
                        Msg::send_imm(l, LAST as u32)
                    } else {
                        Msg::send(l)
                    })?;
                    posted += 1;
                } else {
                    let want = (final_round - posted).min(list.len() as u64) as usize;
                    let ring = lane.send.as_direct().ok_or_else(not_direct)?;
                    match ring.post_list(&list[..want]) {
                        Ok(m) => {
                            posted += m as u64;
                            full = 0;
                        }
                        Err(SendError::WouldBlock) => {
                            full += 1;
                            if full == qps {
                                break;
                            }
                        }
                        Err(e) => return Err(e.into()),
                    }
                }
                k = if k + 1 == qps { 0 } else { k + 1 };
            }
            if let Some(c) = counter {
                c.set(posted);
            }
            if posted == target {
                break;
            }
            if self.poll()? == 0 {
                self.idle(wd, "send completions")?;
            }
        }
        while self.outstanding_wrs() > 0 {
            if self.poll()? == 0 {
                self.idle(wd, "the last send completions")?;
            }
        }
        Ok(posted)
    }
}

/// The first `LEN` bytes of the payload, as the fixed-size APIs take them.
fn prefix<const LEN: usize>(payload: &[u8]) -> Result<[u8; LEN], PerfError> {
    payload
        .get(..LEN)
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| PerfError::Internal(format!("a payload shorter than {LEN} bytes")))
}

#[cold]
fn not_direct() -> PerfError {
    PerfError::Internal("a fixed-size direct loop on a ring of another post path".into())
}

type Session<'r, const LEN: usize> =
    hotverbs_datapath::DirectSession<'r, hotverbs_datapath::mlx5::Mmio, LEN>;

type Recv = hotverbs_datapath::RecvRing<{ super::RING_N }>;

/// A session of `LEN`-byte SENDs on `lane`'s ring (QP 0's), and its receive ring.
fn open_session<R: PostPath, const LEN: usize>(
    lane: &mut Lane<R>,
) -> Result<(Session<'_, LEN>, &mut Recv), PerfError> {
    let Lane { send, recv } = lane;
    let recv = recv
        .as_deref_mut()
        .ok_or_else(|| PerfError::Internal("send_lat without a receive ring".into()))?;
    let ring = send.as_direct().ok_or_else(not_direct)?;
    Ok((ring.session::<LEN>()?, recv))
}

/// Progress for the watchdog: WRs the session retired and messages received.
fn mark<const LEN: usize>(s: &Session<'_, LEN>, tally: &super::Tally) -> u64 {
    (s.next_seq() - s.outstanding()) + tally.received
}

/// One poll of the reaper while a session owns QP 0's ring: its send completions to the
/// session, receives to the receive ring. Returns the number of completions.
#[inline(always)]
fn reap<C: Reap, const LEN: usize>(
    reaper: &mut C,
    s: &mut Session<'_, LEN>,
    recv: &mut Recv,
    tally: &mut super::Tally,
) -> Result<usize, PerfError> {
    reaper.reap(|c: &mut Completion, _| {
        if c.ring() == SEND_RING {
            s.on_completion(c)
                .map(|_| ())
                .map_err(|error| PerfError::Completion {
                    queue: "send queue",
                    error,
                })
        } else if c.ring() == super::recv_ring_id(0) {
            on_recv(recv, tally, c)
        } else {
            Err(unknown_ring(c))
        }
    })
}

/// One poll of everything while a session owns QP 0's ring.
type PollFn<'a, const LEN: usize> =
    dyn for<'s> FnMut(&mut Session<'s, LEN>, &mut super::Tally) -> Result<usize, PerfError> + 'a;

/// Runs `body` with the fixed loops' poll: on the direct path (`--direct`: the receive CQ
/// read directly) a [`RecvSession`] of QP 0's receive ring held for the whole loop and
/// [`reap_split`]; elsewhere [`reap`] of the reaper and the ring.
fn with_poll<C: Reap, const LEN: usize, T>(
    reaper: &mut C,
    recv: &mut Recv,
    body: impl FnOnce(&mut PollFn<'_, LEN>) -> Result<T, PerfError>,
) -> Result<T, PerfError> {
    if let Some(DirectSplit {
        send,
        recv: rp,
        sim,
    }) = reaper.direct_split()
    {
        // The direct receive side (issue 30): QP 0's receives through a session.
        let mut rs = recv.session(rp).map_err(session_error)?;
        return body(&mut |s, t| reap_split(send, sim, s, &mut rs, t));
    }
    body(&mut |s, t| reap(reaper, s, recv, t))
}

/// One poll while a session owns QP 0's ring and a [`RecvSession`] its receive ring (the
/// direct path's two CQs): send completions from the send CQ to the session, then every
/// message waiting, each given back at the next receive. Returns the number of
/// completions and messages.
#[inline(always)]
fn reap_split<const LEN: usize>(
    send: &mut DirectPoller<{ super::POLL_BURST }>,
    sim: bool,
    s: &mut Session<'_, LEN>,
    rs: &mut RecvSession<'_, { super::RING_N }, { super::POLL_BURST }>,
    tally: &mut super::Tally,
) -> Result<usize, PerfError> {
    if sim {
        hotverbs_softnic::mlx5_step();
    }
    let batch = send
        .poll()
        .map_err(|e| PerfError::Internal(format!("polling the send CQ directly: {e}")))?;
    let mut n = batch.len();
    for c in batch {
        if c.ring() != SEND_RING {
            return Err(unknown_ring(c));
        }
        s.on_completion(c).map_err(|error| PerfError::Completion {
            queue: "send queue",
            error,
        })?;
    }
    loop {
        match rs.recv().map_err(session_error)? {
            Polled::Msg(m) => {
                if let Some(imm) = m.imm() {
                    tally.last_imm = Some(imm);
                    if imm == LAST as u32 {
                        tally.lasts += 1;
                    }
                }
                tally.received += 1;
                n += 1;
            }
            Polled::Empty => return Ok(n),
            Polled::Other(c) => return Err(unknown_ring(&c)),
        }
    }
}

/// A receive session's error as the engine reports errors.
#[cold]
fn session_error(e: RecvSessionError) -> PerfError {
    match e {
        RecvSessionError::Recv(hotverbs_datapath::RecvError::Completion { error, .. }) => {
            PerfError::Completion {
                queue: "receive queue",
                error,
            }
        }
        e => PerfError::Internal(format!("the direct receive session: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `with_fixed_len!` has an arm for every size of [`FIXED_LENS`], with `LEN` equal to it,
    /// and refuses any other.
    #[test]
    fn with_fixed_len_covers_exactly_fixed_lens() {
        for size in FIXED_LENS {
            let got: Result<usize, PerfError> = with_fixed_len!(size, L => Ok(L));
            assert_eq!(got.unwrap(), size as usize);
        }
        for size in [0u32, 1, 3, 33, 45, 64] {
            let got: Result<usize, PerfError> = with_fixed_len!(size, L => Ok(L));
            assert!(got.is_err(), "{size}");
        }
    }
}
