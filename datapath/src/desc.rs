//! Plain descriptors of memory and destinations, produced by the setup layer from its
//! `ibv_mr`s, address handles and endpoint exchange. They hold numbers only: the datapath
//! never sees a setup object.

use hotverbs_ffi::ibv_ah;

/// Local registered memory: `addr` .. `addr + len` inside an MR whose `lkey` is given.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct LocalBuf {
    /// Virtual address of the first byte.
    pub addr: u64,
    /// Length in bytes.
    pub len: u32,
    /// The MR's `lkey`.
    pub lkey: u32,
}

impl LocalBuf {
    /// A descriptor of `len` bytes at `addr` in the MR with `lkey`.
    #[inline(always)]
    pub const fn new(addr: u64, len: u32, lkey: u32) -> Self {
        Self { addr, len, lkey }
    }

    /// The sub-range `offset .. offset + len`, or `None` if it does not fit (or its address
    /// would overflow `u64`).
    #[inline]
    pub const fn slice(&self, offset: u32, len: u32) -> Option<Self> {
        match (
            offset.checked_add(len),
            self.addr.checked_add(offset as u64),
        ) {
            (Some(end), Some(addr)) if end <= self.len => Some(Self {
                addr,
                len,
                lkey: self.lkey,
            }),
            _ => None,
        }
    }
}

/// Remote memory a peer registered and advertised: `addr` .. `addr + len` under `rkey`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct RemoteBuf {
    /// Remote virtual address of the first byte (or 0 for a zero-based MR).
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// The remote MR's `rkey`.
    pub rkey: u32,
}

impl RemoteBuf {
    /// A descriptor of `len` remote bytes at `addr` under `rkey`.
    #[inline(always)]
    pub const fn new(addr: u64, len: u64, rkey: u32) -> Self {
        Self { addr, len, rkey }
    }
}

/// A datagram destination (UD QPs, multicast senders): address handle, remote QPN, Q_Key.
/// Plain data: building one is safe; the `unsafe` [`SendRing::new`](crate::SendRing::new)
/// and [`SendRing::set_ud_dest`](crate::SendRing::set_ud_dest) that hand `ah` to the
/// provider state its validity requirements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UdDest {
    /// The `ibv_ah` created by the setup layer (`ibv_create_ah(3)`); it must outlive the ring.
    pub ah: *mut ibv_ah,
    /// Remote QP number (`0xFFFFFF` for multicast).
    pub remote_qpn: u32,
    /// Q_Key.
    pub remote_qkey: u32,
}
