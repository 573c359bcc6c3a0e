//! Address handles (`ibv_create_ah`, `ibv_create_ah_from_wc`, `ibv_destroy_ah`) and the
//! address attributes shared with the QP state machine (`struct ibv_ah_attr`).
//!
//! Invariants: an [`Ah`] holds a clone of its PD.

use std::fmt;

use hotverbs_ffi::{ibv_ah, ibv_ah_attr};

use crate::cq::Wc;
use crate::device::{Gid, PortInfo};
use crate::error::{record_drop_error, Error, Result};
use crate::exchange::Endpoint;
use crate::pd::Pd;
use crate::qp::Grh;
use crate::zeroed;

/// An address: destination LID, service level, port and, for routed/RoCE traffic, a GRH
/// (`struct ibv_ah_attr`).
///
/// # Example
/// ```
/// use hotverbs::{AhAttr, Gid};
/// let ib = AhAttr::lid(0x12, 1);
/// assert!(ib.grh.is_none());
/// let roce = AhAttr::gid(Gid::from_ipv4([10, 77, 0, 2]), 1, 1);
/// assert_eq!(roce.grh.unwrap().sgid_index, 1);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AhAttr {
    /// Destination LID (0 on RoCE).
    pub dlid: u16,
    /// Service level.
    pub sl: u8,
    /// Source path bits.
    pub src_path_bits: u8,
    /// Static rate (0 = port rate).
    pub static_rate: u8,
    /// Local port.
    pub port: u8,
    /// Global route header (required on RoCE).
    pub grh: Option<Grh>,
}

impl AhAttr {
    /// Address by LID (InfiniBand, same subnet), from `port`.
    pub fn lid(dlid: u16, port: u8) -> AhAttr {
        AhAttr {
            dlid,
            sl: 0,
            src_path_bits: 0,
            static_rate: 0,
            port,
            grh: None,
        }
    }

    /// Address by GID (RoCE, or routed IB) from local GID `sgid_index` on `port`.
    pub fn gid(dgid: Gid, sgid_index: u8, port: u8) -> AhAttr {
        AhAttr {
            grh: Some(Grh::to(dgid, sgid_index)),
            ..AhAttr::lid(0, port)
        }
    }

    /// The address of a port with GID `dgid` and LID `dlid`, from the local port `local`
    /// (what [`Context::port_info`](crate::Context::port_info) returned): with a GRH from
    /// `local.gid_index` when the local port has a GID index (always on RoCE) or the
    /// destination has no LID, and `dlid` always (InfiniBand routes by it). The rule
    /// [`Qp::connect`](crate::Qp::connect) uses.
    ///
    /// # Example
    /// ```
    /// use hotverbs::{AhAttr, Context};
    /// let info = Context::open("softnic")?.port_info(None, None)?;
    /// // Our own port (loopback), as a UD test addresses it.
    /// let a = AhAttr::from_port(&info, info.gid, info.lid);
    /// assert_eq!(a.grh.map(|g| g.dgid), info.gid_index.map(|_| info.gid));
    /// # Ok::<(), hotverbs::Error>(())
    /// ```
    pub fn from_port(local: &PortInfo, dgid: Gid, dlid: u16) -> AhAttr {
        let by_gid = local.gid_index.is_some() || dlid == 0;
        AhAttr {
            // Kept with a GRH too: InfiniBand routes by LID whatever the GRH says.
            grh: by_gid.then(|| Grh::to(dgid, local.gid_index.unwrap_or(0) as u8)),
            ..AhAttr::lid(dlid, local.port)
        }
    }

    /// The address of a peer's [`Endpoint`] (its GID and LID), from `local`; see
    /// [`from_port`](Self::from_port). For UD: [`Pd::create_ah`] on it, then
    /// [`Ah::ud_dest`] with the endpoint's QP number.
    pub fn to_endpoint(local: &PortInfo, remote: &Endpoint) -> AhAttr {
        AhAttr::from_port(local, remote.gid(), remote.lid)
    }

    /// As the C struct.
    pub fn to_raw(&self) -> ibv_ah_attr {
        // SAFETY: plain C data.
        let mut a: ibv_ah_attr = unsafe { zeroed() };
        a.dlid = self.dlid;
        a.sl = self.sl;
        a.src_path_bits = self.src_path_bits;
        a.static_rate = self.static_rate;
        a.port_num = self.port;
        if let Some(g) = self.grh {
            a.is_global = 1;
            a.grh.dgid = g.dgid.to_raw();
            a.grh.sgid_index = g.sgid_index;
            a.grh.hop_limit = g.hop_limit;
            a.grh.traffic_class = g.traffic_class;
            a.grh.flow_label = g.flow_label;
        }
        a
    }

    /// From the C struct.
    pub fn from_raw(a: &ibv_ah_attr) -> AhAttr {
        AhAttr {
            dlid: a.dlid,
            sl: a.sl,
            src_path_bits: a.src_path_bits,
            static_rate: a.static_rate,
            port: a.port_num,
            grh: if a.is_global != 0 {
                Some(Grh {
                    // SAFETY: any bit pattern is a valid raw array.
                    dgid: Gid(unsafe { a.grh.dgid.raw }),
                    sgid_index: a.grh.sgid_index,
                    hop_limit: a.grh.hop_limit,
                    traffic_class: a.grh.traffic_class,
                    flow_label: a.grh.flow_label,
                })
            } else {
                None
            },
        }
    }
}

/// An address handle (`struct ibv_ah`) for UD sends.
///
/// # Example
/// ```
/// use hotverbs::{AhAttr, Context};
/// let ctx = Context::open("softnic")?;
/// let pd = ctx.alloc_pd()?;
/// let me = ctx.port_info(None, None)?;
/// let attr = match me.gid_index {
///     Some(i) => AhAttr::gid(me.gid, i as u8, me.port),
///     None => AhAttr::lid(me.lid, me.port),
/// };
/// let ah = pd.create_ah(&attr)?;
/// assert!(!ah.as_raw().is_null());
/// # Ok::<(), hotverbs::Error>(())
/// ```
///
/// # References
/// `ibv_create_ah(3)`, `ibv_create_ah_from_wc(3)`
pub struct Ah {
    ah: *mut ibv_ah,
    pd: Pd,
}

// SAFETY: an AH is an identifier; its verbs are thread-safe.
unsafe impl Send for Ah {}
// SAFETY: see Send.
unsafe impl Sync for Ah {}

impl fmt::Debug for Ah {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ah").field("handle", &self.ah).finish()
    }
}

impl Pd {
    /// `ibv_create_ah(3)`.
    pub fn create_ah(&self, attr: &AhAttr) -> Result<Ah> {
        let f = self
            .context()
            .fns()
            .ibv_create_ah
            .ok_or_else(|| Error::missing("ibv_create_ah"))?;
        let mut raw = attr.to_raw();
        // SAFETY: live PD, valid attributes.
        let ah = unsafe { f(self.as_raw(), &mut raw) };
        if ah.is_null() {
            let ctx = self.context().clone();
            return Err(Error::from_errno("ibv_create_ah").or_hint(|| {
                let p = ctx.query_port(attr.port).ok()?;
                if p.link_layer() == crate::LinkLayer::Ethernet && attr.grh.is_none() {
                    Some("RoCE port: the address needs a GRH (AhAttr::gid)".into())
                } else {
                    Some(format!("port {} / GID index / LID valid?", attr.port))
                }
            }));
        }
        Ok(Ah {
            ah,
            pd: self.clone(),
        })
    }

    /// `ibv_create_ah_from_wc(3)`: the address to reply to the sender of a UD receive.
    /// `grh` is the first 40 bytes of that receive's buffer (UD receives always reserve
    /// them; only meaningful when [`Wc::has_grh`]).
    ///
    /// # Errors
    /// `EINVAL` when `grh` is shorter than 40 bytes; the verb's error otherwise.
    pub fn create_ah_from_wc(&self, wc: &Wc, grh: &[u8], port: u8) -> Result<Ah> {
        if grh.len() < 40 {
            return Err(Error::new("ibv_create_ah_from_wc", libc::EINVAL).with_hint(
                "grh must be the 40-byte GRH area at the start of the UD receive buffer",
            ));
        }
        let f = self
            .context()
            .fns()
            .ibv_create_ah_from_wc
            .ok_or_else(|| Error::missing("ibv_create_ah_from_wc"))?;
        let wc = *wc;
        let mut g = [0u8; 40];
        g.copy_from_slice(&grh[..40]);
        // SAFETY: live PD; wc is a valid completion copy; g is a 40-byte ibv_grh image
        // (ibv_grh is 40 bytes of plain data, alignment 4 satisfied by copying into a
        // properly typed value below).
        let ah = unsafe {
            let mut grh_raw: hotverbs_ffi::ibv_grh = std::mem::transmute_copy(&g);
            let mut raw_wc = *wc.as_raw();
            f(self.as_raw(), &mut raw_wc, &mut grh_raw, port)
        };
        if ah.is_null() {
            return Err(Error::from_errno("ibv_create_ah_from_wc").or_hint(|| {
                (!wc.has_grh())
                    .then(|| "the completion has no GRH and the port needs one (RoCE)?".into())
            }));
        }
        Ok(Ah {
            ah,
            pd: self.clone(),
        })
    }
}

impl Ah {
    /// The raw `ibv_ah` (valid while this `Ah` lives).
    pub fn as_raw(&self) -> *mut ibv_ah {
        self.ah
    }

    /// The datapath's descriptor of this destination (AH, remote QPN, Q_Key), for the raw
    /// `SendConfig::ud` of an embedded datapath; the safe path is
    /// [`Qp::send_ring_ud`](crate::Qp::send_ring_ud), which borrows the AH for the ring's
    /// life. The descriptor is plain data; the ring constructor that takes it is `unsafe`
    /// and requires the AH to outlive the ring.
    pub fn ud_dest(&self, remote_qpn: u32, qkey: u32) -> crate::UdDest {
        crate::UdDest {
            ah: self.ah,
            remote_qpn,
            remote_qkey: qkey,
        }
    }

    /// The PD.
    pub fn pd(&self) -> &Pd {
        &self.pd
    }

    fn destroy_inner(&mut self) -> Result<()> {
        let ah = std::mem::replace(&mut self.ah, std::ptr::null_mut());
        if ah.is_null() {
            return Ok(());
        }
        let f = self
            .pd
            .context()
            .fns()
            .ibv_destroy_ah
            .ok_or_else(|| Error::missing("ibv_destroy_ah"))?;
        // SAFETY: ah came from this table and is destroyed once.
        let ret = unsafe { f(ah) };
        if ret != 0 {
            return Err(Error::from_ret("ibv_destroy_ah", ret));
        }
        Ok(())
    }

    /// `ibv_destroy_ah(3)` now, returning its error.
    pub fn destroy(mut self) -> Result<()> {
        self.destroy_inner()
    }
}

impl Drop for Ah {
    fn drop(&mut self) {
        if let Err(e) = self.destroy_inner() {
            record_drop_error(e);
        }
    }
}
