//! Credit-based flow control for SEND/RECV, so a sender never makes a receiver RNR.
//!
//! The receiver starts the sender with as many credits as it has receives posted. Each
//! SEND (or WRITE_WITH_IMM, which also consumes a receive) costs one credit. The receiver
//! counts slots it has re-posted and returns them, either in the immediate data of a
//! message it sends anyway (piggyback: [`encode_imm`]) or in a dedicated zero-byte
//! WRITE_WITH_IMM / SEND_WITH_IMM when [`CreditReturn::take`] says enough have built up.
//! Credits are only returned for receives already re-posted, so a receive is always
//! waiting when a credit is spent.

/// Sender side: the credits it may spend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Credits {
    available: u32,
}

impl Credits {
    /// Starts with `initial` credits (the receiver's posted receive count).
    pub const fn new(initial: u32) -> Self {
        Self { available: initial }
    }

    /// Takes one credit if there is one.
    #[inline(always)]
    pub fn try_take(&mut self) -> bool {
        if self.available == 0 {
            return false;
        }
        self.available -= 1;
        true
    }

    /// Adds credits returned by the receiver (saturating: a bogus grant cannot wrap the
    /// count around to a small number, or panic).
    #[inline(always)]
    pub fn grant(&mut self, n: u32) {
        self.available = self.available.saturating_add(n);
    }

    /// Credits left.
    #[inline(always)]
    pub fn available(&self) -> u32 {
        self.available
    }
}

/// Receiver side: re-posted receives not yet returned to the sender.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CreditReturn {
    owed: u32,
    threshold: u32,
}

impl CreditReturn {
    /// Returns credits in groups of at least `threshold` (use half the receive depth).
    pub const fn new(threshold: u32) -> Self {
        Self { owed: 0, threshold }
    }

    /// `n` receives were re-posted (after [`RecvRing::repost`](crate::RecvRing::repost) or
    /// a release that re-posted).
    #[inline(always)]
    pub fn reposted(&mut self, n: u32) {
        self.owed += n;
    }

    /// The credits to send now, if at least `threshold` are owed (then they count as sent).
    #[inline(always)]
    pub fn take(&mut self) -> Option<u32> {
        if self.owed >= self.threshold {
            let n = self.owed;
            self.owed = 0;
            Some(n)
        } else {
            None
        }
    }

    /// Everything owed, for piggybacking on a message sent anyway.
    #[inline(always)]
    pub fn take_all(&mut self) -> u32 {
        core::mem::take(&mut self.owed)
    }

    /// Credits owed and not yet returned.
    #[inline(always)]
    pub fn owed(&self) -> u32 {
        self.owed
    }
}

/// Bit 31 of an immediate marks a credit return; the low 31 bits carry the count.
pub const CREDIT_IMM_FLAG: u32 = 1 << 31;

/// An immediate value returning `n` credits (`n < 2^31`).
#[inline(always)]
pub const fn encode_imm(n: u32) -> u32 {
    CREDIT_IMM_FLAG | (n & !CREDIT_IMM_FLAG)
}

/// The credits an immediate returns, or `None` if it is not a credit return.
#[inline(always)]
pub const fn decode_imm(imm: u32) -> Option<u32> {
    if imm & CREDIT_IMM_FLAG != 0 {
        Some(imm & !CREDIT_IMM_FLAG)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credits_never_go_negative() {
        let mut c = Credits::new(2);
        assert!(c.try_take());
        assert!(c.try_take());
        assert!(!c.try_take());
        c.grant(1);
        assert!(c.try_take());
        assert_eq!(c.available(), 0);
    }

    #[test]
    fn returns_in_groups() {
        let mut r = CreditReturn::new(4);
        r.reposted(3);
        assert_eq!(r.take(), None);
        r.reposted(2);
        assert_eq!(r.take(), Some(5));
        assert_eq!(r.owed(), 0);
        r.reposted(1);
        assert_eq!(r.take_all(), 1);
        assert_eq!(decode_imm(encode_imm(17)), Some(17));
        assert_eq!(decode_imm(17), None);
    }
}
