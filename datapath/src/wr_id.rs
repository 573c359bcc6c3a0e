//! The `wr_id` encoding shared by every ring.
//!
//! ```text
//!  63        56 55                                              0
//! +------------+-------------------------------------------------+
//! |  ring id   |  sequence (SendRing) or generation|slot (RecvRing)|
//! +------------+-------------------------------------------------+
//! ```
//!
//! One [`CqPoller`](crate::CqPoller) serves several rings: dispatch is `wr_id >> 56`
//! compared with the ring ids the application chose (up to 256 rings per CQ). A
//! [`SendRing`](crate::SendRing) puts the low 56 bits of its free-running sequence number
//! there (2^56 WRs is 22 years at 100 M WR/s; the full number is rebuilt from the ring's own
//! counters, see [`full_seq`]); a [`RecvRing`](crate::RecvRing) puts a reset generation in
//! bits 55..32 and the slot index in bits 31..0.

/// Bit position of the ring id.
pub const RING_SHIFT: u32 = 56;
/// Mask of the sequence / slot part.
pub const SEQ_MASK: u64 = (1 << RING_SHIFT) - 1;

/// `wr_id` of sequence (or slot) `seq` of ring `ring`.
#[inline(always)]
pub const fn encode(ring: u8, seq: u64) -> u64 {
    ((ring as u64) << RING_SHIFT) | (seq & SEQ_MASK)
}

/// The ring id of a `wr_id`.
#[inline(always)]
pub const fn ring_of(wr_id: u64) -> u8 {
    (wr_id >> RING_SHIFT) as u8
}

/// The sequence (or slot) part of a `wr_id`.
#[inline(always)]
pub const fn seq_of(wr_id: u64) -> u64 {
    wr_id & SEQ_MASK
}

/// Rebuilds the full sequence number of a send completion from its 56-bit part.
///
/// `posted` is the number of WRs posted so far and `retired` the number already retired;
/// the completion must be for one of the outstanding WRs `retired..posted`. Returns `None`
/// for a stale completion (a WR already retired, e.g. a flush CQE still in the CQ after
/// the ring was reset) or one that is not outstanding at all.
#[inline(always)]
pub const fn full_seq(posted: u64, retired: u64, seq56: u64) -> Option<u64> {
    // Distance back from the newest posted WR (posted - 1), in the 56-bit domain.
    let back = posted.wrapping_sub(1).wrapping_sub(seq56) & SEQ_MASK;
    if back < posted.wrapping_sub(retired) {
        Some(posted - 1 - back)
    } else {
        None
    }
}

/// Rebuilds the full sequence number of a send completion from its 56-bit part, against
/// the window `retired .. retired + depth` of WRs that may be outstanding (a ring never has
/// more than `depth`). Unlike [`full_seq`] it needs no count of posted WRs, so it works on
/// a poller thread that has not yet seen the poster's latest post. Returns `None` outside
/// the window (stale, or not a WR of this ring).
#[inline(always)]
pub const fn full_seq_in_window(retired: u64, depth: u64, seq56: u64) -> Option<u64> {
    let ahead = seq56.wrapping_sub(retired) & SEQ_MASK;
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
    fn roundtrip() {
        let id = encode(7, 0x12_3456);
        assert_eq!(ring_of(id), 7);
        assert_eq!(seq_of(id), 0x12_3456);
        assert_eq!(ring_of(encode(255, u64::MAX)), 255);
        assert_eq!(seq_of(encode(255, u64::MAX)), SEQ_MASK);
    }

    #[test]
    fn full_seq_rebuilds_and_rejects_stale() {
        // Outstanding 10..20.
        assert_eq!(full_seq(20, 10, 10), Some(10));
        assert_eq!(full_seq(20, 10, 19), Some(19));
        assert_eq!(full_seq(20, 10, 9), None);
        assert_eq!(full_seq(20, 10, 20), None);
        assert_eq!(full_seq(20, 20, 19), None);
        // Across the 56-bit wrap.
        let posted = (1u64 << 56) + 5;
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
        let r = (1u64 << 56) - 2;
        assert_eq!(full_seq_in_window(r, 8, seq_of(r + 5)), Some(r + 5));
        assert_eq!(full_seq_in_window(r, 8, seq_of(r - 1)), None);
    }
}
