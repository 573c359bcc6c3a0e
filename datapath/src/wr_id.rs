//! The `wr_id` encoding shared by every ring.
//!
//! ```text
//!  63        56 55  54                                           0
//! +------------+---+---------------------------------------------+
//! |  ring id   | R | sequence (SendRing), R = 0                  |
//! |  ring id   | R | generation 54..32 | slot 31..0 (RecvRing), R = 1 |
//! +------------+---+---------------------------------------------+
//! ```
//!
//! One [`CqPoller`](crate::CqPoller) serves several rings: dispatch is `wr_id >> 56`
//! compared with the ring ids the application chose (up to 256 rings per CQ). Bit 55
//! ([`RECV_BIT`]) says which kind of ring posted the WR, so a send ring never takes a
//! receive completion for its own and a receive ring never takes a send completion, even
//! when the two share a ring id (ids need only be unique per CQ, and a completion polled
//! from the wrong CQ is a mistake the rings must survive: a receive slot turned HELD while
//! the NIC still owns it would hand out a view the NIC writes).
//! A [`SendRing`](crate::SendRing) puts the low 55 bits of its free-running sequence number
//! there (2^55 WRs is 11 years at 100 M WR/s; the full number is rebuilt from the ring's own
//! counters, see [`full_seq`]); a [`RecvRing`](crate::RecvRing) puts a generation in bits
//! 54..32 and the slot index in bits 31..0.

/// Bit position of the ring id.
pub const RING_SHIFT: u32 = 56;
/// Set in the `wr_id` of every receive a [`RecvRing`](crate::RecvRing) posts, clear in
/// every send WR.
pub const RECV_BIT: u64 = 1 << 55;
/// Bit position of the kind bit: `(a ^ b) >> KIND_SHIFT == 0` compares ring id and kind.
pub const KIND_SHIFT: u32 = 55;
/// Mask of the sequence / slot part.
pub const SEQ_MASK: u64 = RECV_BIT - 1;

/// `wr_id` of sequence `seq` of send ring `ring`.
#[inline(always)]
pub const fn encode(ring: u8, seq: u64) -> u64 {
    ((ring as u64) << RING_SHIFT) | (seq & SEQ_MASK)
}

/// `wr_id` of a receive of ring `ring` with the given generation (23 bits) and slot.
#[inline(always)]
pub const fn encode_recv(ring: u8, generation: u32, slot: u32) -> u64 {
    ((ring as u64) << RING_SHIFT)
        | RECV_BIT
        | (((generation as u64) & ((1 << 23) - 1)) << 32)
        | slot as u64
}

/// The ring id of a `wr_id`.
#[inline(always)]
pub const fn ring_of(wr_id: u64) -> u8 {
    (wr_id >> RING_SHIFT) as u8
}

/// True if a receive ring posted the WR of this `wr_id`.
#[inline(always)]
pub const fn is_recv(wr_id: u64) -> bool {
    wr_id & RECV_BIT != 0
}

/// The sequence (or generation and slot) part of a `wr_id`.
#[inline(always)]
pub const fn seq_of(wr_id: u64) -> u64 {
    wr_id & SEQ_MASK
}

/// Rebuilds the full sequence number of a send completion from its 55-bit part.
///
/// `posted` is the number of WRs posted so far and `retired` the number already retired;
/// the completion must be for one of the outstanding WRs `retired..posted`. Returns `None`
/// for a stale completion (a WR already retired, e.g. a flush CQE still in the CQ after
/// the ring was reset) or one that is not outstanding at all.
#[inline(always)]
pub const fn full_seq(posted: u64, retired: u64, seq55: u64) -> Option<u64> {
    // Distance back from the newest posted WR (posted - 1), in the 55-bit domain.
    let back = posted.wrapping_sub(1).wrapping_sub(seq55) & SEQ_MASK;
    if back < posted.wrapping_sub(retired) {
        Some(posted - 1 - back)
    } else {
        None
    }
}

/// True if the completion of `wr_id` on QP `qp_num` is not a send WR of the ring with id
/// and kind bits `id_bits` on QP `my_qp`: another ring's, a receive, another QP's. One
/// branch for all three (two branches to the rings' cold exits cost the callers' inlined
/// post loops a register: `cargo xtask insn`, softnic batch 1).
#[inline(always)]
pub const fn foreign(wr_id: u64, qp_num: u32, id_bits: u64, my_qp: u32) -> bool {
    ((wr_id ^ id_bits) >> KIND_SHIFT | (qp_num ^ my_qp) as u64) != 0
}

/// A send ring's fast test of a completion: the full sequence number of `wr_id` if it is
/// a WR of the ring with id and kind bits `id_bits` on QP `my_qp` (`qp_num` the
/// completion's), outstanding (`retired..posted`) and staged in the epoch of sequence
/// numbers whose `wr_id - seq` is `id_off`; `None` for anything else (another ring's, a
/// stale one, one of another epoch), which [`full_seq`] and the ring decide out of line.
/// No 64-bit mask constant (a caller's inlined poll loop would hold it in a register across
/// its post loop: `cargo xtask insn`, the lone `send_now` row), and one branch for all of it
/// (as [`foreign`]).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub const fn outstanding_in_epoch(
    wr_id: u64,
    qp_num: u32,
    id_bits: u64,
    my_qp: u32,
    id_off: u64,
    posted: u64,
    retired: u64,
) -> Option<u64> {
    let s = wr_id.wrapping_sub(id_off);
    let back = posted.wrapping_sub(1).wrapping_sub(s);
    if foreign(wr_id, qp_num, id_bits, my_qp) | (back >= posted.wrapping_sub(retired)) {
        None
    } else {
        Some(s)
    }
}

/// Rebuilds the full sequence number of a send completion from its 55-bit part, against
/// the window `retired .. retired + depth` of WRs that may be outstanding (a ring never has
/// more than `depth`). Unlike [`full_seq`] it needs no count of posted WRs, so it works on
/// a poller thread that has not yet seen the poster's latest post. Returns `None` outside
/// the window (stale, or not a WR of this ring).
#[inline(always)]
pub const fn full_seq_in_window(retired: u64, depth: u64, seq55: u64) -> Option<u64> {
    let ahead = seq55.wrapping_sub(retired) & SEQ_MASK;
    if ahead < depth {
        Some(retired + ahead)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outstanding_in_epoch_takes_only_this_epochs_outstanding_wrs() {
        let bits = encode(7, 0);
        let epoch = SEQ_MASK + 1;
        // Ring 7 on QP 9, WRs 10..20 outstanding in the first epoch (id_off = bits).
        let f = |wr_id, qp| outstanding_in_epoch(wr_id, qp, bits, 9, bits, 20, 10);
        assert_eq!(f(encode(7, 10), 9), Some(10));
        assert_eq!(f(encode(7, 19), 9), Some(19));
        assert_eq!(f(encode(7, 9), 9), None, "retired");
        assert_eq!(f(encode(7, 20), 9), None, "not posted");
        assert_eq!(f(encode(6, 12), 9), None, "another ring");
        assert_eq!(f(encode(7, 12) | RECV_BIT, 9), None, "a receive");
        assert_eq!(f(encode(7, 12), 8), None, "another QP");
        // Outstanding across the epoch end: the fast test knows one epoch, `full_seq` both.
        let (posted, retired) = (epoch + 2, epoch - 2);
        let last = encode(7, epoch - 1);
        assert_eq!(
            outstanding_in_epoch(last, 9, bits, 9, bits, posted, retired),
            Some(epoch - 1)
        );
        let next_off = bits.wrapping_sub(epoch);
        assert_eq!(
            outstanding_in_epoch(last, 9, bits, 9, next_off, posted, retired),
            None
        );
        assert_eq!(full_seq(posted, retired, seq_of(last)), Some(epoch - 1));
        let first = encode(7, epoch);
        assert_eq!(
            outstanding_in_epoch(first, 9, bits, 9, next_off, posted, retired),
            Some(epoch)
        );
    }

    #[test]
    fn roundtrip() {
        let id = encode(7, 0x12_3456);
        assert_eq!(ring_of(id), 7);
        assert_eq!(seq_of(id), 0x12_3456);
        assert_eq!(ring_of(encode(255, u64::MAX)), 255);
        assert_eq!(seq_of(encode(255, u64::MAX)), SEQ_MASK);
        assert!(
            !is_recv(encode(255, u64::MAX)),
            "a send wr_id never has the receive bit"
        );
        let r = encode_recv(7, 3, 9);
        assert_eq!((ring_of(r), is_recv(r), r & 0xFFFF_FFFF), (7, true, 9));
        assert_eq!((r >> 32) & ((1 << 23) - 1), 3);
        assert_eq!(ring_of(encode_recv(7, u32::MAX, u32::MAX)), 7);
    }

    #[test]
    fn full_seq_rebuilds_and_rejects_stale() {
        // Outstanding 10..20.
        assert_eq!(full_seq(20, 10, 10), Some(10));
        assert_eq!(full_seq(20, 10, 19), Some(19));
        assert_eq!(full_seq(20, 10, 9), None);
        assert_eq!(full_seq(20, 10, 20), None);
        assert_eq!(full_seq(20, 20, 19), None);
        // Across the 55-bit wrap.
        let posted = (1u64 << 55) + 5;
        assert_eq!(
            full_seq(posted, posted - 8, seq_of(posted - 8)),
            Some(posted - 8)
        );
        assert_eq!(
            full_seq(posted, posted - 8, seq_of(posted - 1)),
            Some(posted - 1)
        );
        assert_eq!(full_seq(posted, posted - 8, seq_of(posted - 9)), None);
    }

    #[test]
    fn window_rebuilds_without_posted() {
        assert_eq!(full_seq_in_window(10, 4, 10), Some(10));
        assert_eq!(full_seq_in_window(10, 4, 13), Some(13));
        assert_eq!(full_seq_in_window(10, 4, 14), None);
        assert_eq!(full_seq_in_window(10, 4, 9), None, "stale");
        let r = (1u64 << 55) - 2;
        assert_eq!(full_seq_in_window(r, 8, seq_of(r + 5)), Some(r + 5));
        assert_eq!(full_seq_in_window(r, 8, seq_of(r - 1)), None);
    }
}
