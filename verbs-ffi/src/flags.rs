//! Typed flag sets over the verbs' bit masks (`bitflags`), convertible to the raw C values.
//!
//! Each type's bits are the generated constants, so a change in the headers shows up as a
//! compile error here rather than a silent mismatch.

use crate::generated::types::*;

bitflags::bitflags! {
    /// Memory-region / QP access flags (`enum ibv_access_flags`, `ibv_reg_mr(3)`).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct AccessFlags: u32 {
        /// The HCA may write local memory (required for receives, READ/atomic responses).
        const LOCAL_WRITE = IBV_ACCESS_LOCAL_WRITE;
        /// Peers may RDMA WRITE into this memory.
        const REMOTE_WRITE = IBV_ACCESS_REMOTE_WRITE;
        /// Peers may RDMA READ this memory.
        const REMOTE_READ = IBV_ACCESS_REMOTE_READ;
        /// Peers may perform atomics on this memory.
        const REMOTE_ATOMIC = IBV_ACCESS_REMOTE_ATOMIC;
        /// Memory windows may be bound to this MR.
        const MW_BIND = IBV_ACCESS_MW_BIND;
        /// Remote addresses are offsets from the start of the MR.
        const ZERO_BASED = IBV_ACCESS_ZERO_BASED;
        /// On-demand paging.
        const ON_DEMAND = IBV_ACCESS_ON_DEMAND;
        /// The memory is backed by huge pages.
        const HUGETLB = IBV_ACCESS_HUGETLB;
        /// Relaxed PCI ordering is allowed.
        const RELAXED_ORDERING = IBV_ACCESS_RELAXED_ORDERING;
    }

    /// Send work-request flags (`enum ibv_send_flags`, `ibv_post_send(3)`).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct SendFlags: u32 {
        /// Wait for earlier READ/atomic WRs to complete before this one.
        const FENCE = IBV_SEND_FENCE;
        /// Generate a completion for this WR (QPs with `sq_sig_all = 0`).
        const SIGNALED = IBV_SEND_SIGNALED;
        /// Set the solicited-event bit at the receiver.
        const SOLICITED = IBV_SEND_SOLICITED;
        /// Copy the payload into the WQE at post time; the buffer is free on return.
        const INLINE = IBV_SEND_INLINE;
        /// Offload IP checksum (raw packet QPs).
        const IP_CSUM = IBV_SEND_IP_CSUM;
    }

    /// `ibv_modify_qp(3)` / `ibv_query_qp(3)` attribute mask (`enum ibv_qp_attr_mask`).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct QpAttrMask: u32 {
        /// `qp_state`.
        const STATE = IBV_QP_STATE;
        /// `cur_qp_state`.
        const CUR_STATE = IBV_QP_CUR_STATE;
        /// `en_sqd_async_notify`.
        const EN_SQD_ASYNC_NOTIFY = IBV_QP_EN_SQD_ASYNC_NOTIFY;
        /// `qp_access_flags`.
        const ACCESS_FLAGS = IBV_QP_ACCESS_FLAGS;
        /// `pkey_index`.
        const PKEY_INDEX = IBV_QP_PKEY_INDEX;
        /// `port_num`.
        const PORT = IBV_QP_PORT;
        /// `qkey` (UD).
        const QKEY = IBV_QP_QKEY;
        /// `ah_attr` (primary path).
        const AV = IBV_QP_AV;
        /// `path_mtu`.
        const PATH_MTU = IBV_QP_PATH_MTU;
        /// `timeout`.
        const TIMEOUT = IBV_QP_TIMEOUT;
        /// `retry_cnt`.
        const RETRY_CNT = IBV_QP_RETRY_CNT;
        /// `rnr_retry`.
        const RNR_RETRY = IBV_QP_RNR_RETRY;
        /// `rq_psn`.
        const RQ_PSN = IBV_QP_RQ_PSN;
        /// `max_rd_atomic`.
        const MAX_QP_RD_ATOMIC = IBV_QP_MAX_QP_RD_ATOMIC;
        /// `alt_ah_attr` etc.
        const ALT_PATH = IBV_QP_ALT_PATH;
        /// `min_rnr_timer`.
        const MIN_RNR_TIMER = IBV_QP_MIN_RNR_TIMER;
        /// `sq_psn`.
        const SQ_PSN = IBV_QP_SQ_PSN;
        /// `max_dest_rd_atomic`.
        const MAX_DEST_RD_ATOMIC = IBV_QP_MAX_DEST_RD_ATOMIC;
        /// `path_mig_state`.
        const PATH_MIG_STATE = IBV_QP_PATH_MIG_STATE;
        /// `cap`.
        const CAP = IBV_QP_CAP;
        /// `dest_qp_num`.
        const DEST_QPN = IBV_QP_DEST_QPN;
        /// `rate_limit`.
        const RATE_LIMIT = IBV_QP_RATE_LIMIT;
    }

    /// Work-completion flags (`enum ibv_wc_flags`, `ibv_poll_cq(3)`).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct WcFlags: u32 {
        /// A 40-byte GRH precedes the payload in the receive buffer (UD).
        const GRH = IBV_WC_GRH;
        /// `imm_data` is valid.
        const WITH_IMM = IBV_WC_WITH_IMM;
        /// The IP checksum was verified.
        const IP_CSUM_OK = IBV_WC_IP_CSUM_OK;
        /// `invalidated_rkey` is valid.
        const WITH_INV = IBV_WC_WITH_INV;
        /// Tag matching: sync request.
        const TM_SYNC_REQ = IBV_WC_TM_SYNC_REQ;
        /// Tag matching: matched.
        const TM_MATCH = IBV_WC_TM_MATCH;
        /// Tag matching: data valid.
        const TM_DATA_VALID = IBV_WC_TM_DATA_VALID;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_are_the_header_bits() {
        assert_eq!(
            (AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE).bits(),
            3
        );
        assert_eq!(
            SendFlags::SIGNALED.bits() | SendFlags::INLINE.bits(),
            0b1010
        );
        assert_eq!(QpAttrMask::DEST_QPN.bits(), 1 << 20);
        assert_eq!(WcFlags::from_bits_truncate(0xffff_ffff), WcFlags::all());
        // Every access bit the header defines is known to the type.
        let all = [
            IBV_ACCESS_LOCAL_WRITE,
            IBV_ACCESS_REMOTE_WRITE,
            IBV_ACCESS_REMOTE_READ,
            IBV_ACCESS_REMOTE_ATOMIC,
            IBV_ACCESS_MW_BIND,
            IBV_ACCESS_ZERO_BASED,
            IBV_ACCESS_ON_DEMAND,
            IBV_ACCESS_HUGETLB,
            IBV_ACCESS_RELAXED_ORDERING,
        ];
        assert_eq!(all.iter().fold(0, |a, b| a | b), AccessFlags::all().bits());
    }
}
