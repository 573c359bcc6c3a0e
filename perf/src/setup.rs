//! Setup on hotverbs' setup layer: pick and open the device, build one side's CQ, its `-q`
//! QPs and registered buffer, describe them to the peer, connect them, and hand the raw
//! handles to the datapath ([`engine::Side`]).
//!
//! # `--direct` and the doorbell register
//! The engine builds its rings from raw handles (its rings are `'static` values of an engine
//! moved to another thread), so it takes each QP's send queue from [`Qp::mlx5_sq`] rather
//! than through [`Qp::direct_ring`], and applies hotverbs' rule for a direct ring's register
//! to it ([`Qp::mlx5_register_use`], [`hotverbs::RegisterUse::apply_to`]): BlueFlame only on a thread
//! domain's register, else the 8-byte doorbell alone. So every `--direct` QP is created in
//! a thread domain of its own (a parent domain over the one PD), where the device has
//! them: a ConnectX then BlueFlames, as `Qp::direct_ring` would.

use hotverbs::exchange::Endpoint;
use hotverbs::{
    AccessFlags, Ah, AhAttr, CompChannel, ConnectOptions, Context, Cq, CqBuilder, DeviceKind, Mr,
    ParentDomain, Pd, PortInfo, Qp, QpBuilder, QpType, RemoteMr, SendOps, TimestampClock, WcFields,
    DEFAULT_QKEY, SOFTNIC,
};
use hotverbs_datapath::{LocalBuf, RemoteBuf};

use crate::cli::{Connection, Params};
use crate::engine::{self, QpSide, Side};
use crate::error::PerfError;

/// Inline threshold of latency tests when `-I` is not given (perftest's order of size).
pub const DEFAULT_INLINE_LAT: u32 = 220;
/// Inline threshold of bandwidth tests when `-I` is not given (perftest's default).
pub const DEFAULT_INLINE_BW: u32 = 0;
/// Inline threshold of `send_bw` on the direct path (`--direct`, both passes of
/// `--compare_direct`) when `-I` is not given: the largest message of the fixed-size post
/// list (`DirectRing::post_list`), which writes inline SENDs only.
pub const DEFAULT_INLINE_BW_DIRECT: u32 = 44;

/// The inline threshold asked for when `-I` is not given.
pub fn default_inline(p: &Params, direct: bool) -> u32 {
    if p.test.is_latency() {
        DEFAULT_INLINE_LAT
    } else if direct && p.test == crate::cli::TestKind::SendBw {
        DEFAULT_INLINE_BW_DIRECT
    } else {
        DEFAULT_INLINE_BW
    }
}

/// What to run on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Choice {
    /// Device name.
    pub device: String,
    /// Chosen because no device was named and none exists (the embedded default).
    pub fallback: bool,
}

/// Picks the device: `-d`, else `$HOTVERBS_DEVICE`, else the first real device, else
/// softnic (the embedded default, flagged so the caller can say so).
pub fn choose(named: Option<&str>) -> Choice {
    if let Some(d) = named {
        return Choice {
            device: d.to_string(),
            fallback: false,
        };
    }
    if let Ok(d) = std::env::var("HOTVERBS_DEVICE") {
        if !d.is_empty() {
            return Choice {
                device: d,
                fallback: false,
            };
        }
    }
    match hotverbs::devices()
        .into_iter()
        .find(|d| d.kind == DeviceKind::Real)
    {
        Some(d) => Choice {
            device: d.name,
            fallback: false,
        },
        None => Choice {
            device: SOFTNIC.to_string(),
            fallback: true,
        },
    }
}

/// An open device with its PD and port.
pub struct Device {
    /// The context.
    pub ctx: Context,
    /// One PD for everything.
    pub pd: Pd,
    /// The port (and GID) used.
    pub port: PortInfo,
    /// Reads/atomics in flight per QP, within the device's limits.
    pub rd_atomic: u8,
    /// The device's `max_cqe`: the CQ every QP of a side shares must fit.
    pub max_cqe: u32,
    /// Post through the legacy `ibv_post_send` (`--use_old_post_send`) instead of the
    /// extended `ibv_wr_*` API on an extended QP (the default, as perftest's).
    pub old_post_send: bool,
    /// Create the CQs with completion timestamps and poll them through the extended API
    /// (`--timestamps`).
    pub timestamps: bool,
    /// Post and poll sends through the mlx5 direct path (`--direct`).
    pub direct: bool,
    /// Create the CQ on a completion channel and sleep on its events when a poll finds
    /// nothing (`--events`).
    pub events: bool,
}

impl Device {
    /// Opens `name` and queries the port.
    pub fn open(name: &str, ib_port: u8, gid_index: Option<u8>) -> Result<Device, PerfError> {
        let ctx = Context::open(name)?;
        let pd = ctx.alloc_pd()?;
        let port = ctx
            .port_info(Some(ib_port), gid_index.map(u32::from))
            .map_err(|e| {
                PerfError::verbs(e, format!("device {name}, port {ib_port}: check -i and -x"))
            })?;
        if let (Some(g), true) = (gid_index, port.gid.is_zero()) {
            return Err(PerfError::Usage(format!(
                "GID index {g} of {name} port {ib_port} is empty: pick a populated one with -x \
                 (`show_gids` lists them; rxe's IPv4 GID is usually 1)"
            )));
        }
        let attr = ctx.query_device()?;
        let rd_atomic = attr
            .max_qp_rd_atom()
            .min(attr.max_qp_init_rd_atom())
            .clamp(1, 16) as u8;
        let max_cqe = attr.max_cqe().max(0) as u32;
        Ok(Device {
            ctx,
            pd,
            port,
            rd_atomic,
            max_cqe,
            old_post_send: false,
            timestamps: false,
            direct: false,
            events: false,
        })
    }

    /// The post path and completion options of the run (`--use_old_post_send`,
    /// `--timestamps`).
    pub fn with_paths(mut self, old_post_send: bool, timestamps: bool) -> Device {
        self.old_post_send = old_post_send;
        self.timestamps = timestamps;
        self
    }

    /// The mlx5 direct path (`--direct`): refused by name unless the device is a ConnectX.
    pub fn with_direct(mut self, direct: bool) -> Device {
        self.direct = direct;
        self
    }

    /// Completion events (`--events`): the CQ on a channel, slept on.
    pub fn with_events(mut self, events: bool) -> Device {
        self.events = events;
        self
    }

    /// The device name.
    pub fn name(&self) -> &str {
        self.ctx.name()
    }

    /// The active MTU in bytes.
    pub fn mtu(&self) -> u32 {
        self.port.active_mtu.bytes()
    }
}

/// One side's objects. Field order is drop order: the QPs before their CQ and the MR.
pub struct SideRes {
    /// The QPs (`-q`; RC, or UC / UD with `-c`), all on `cq`.
    pub qps: Vec<Qp>,
    /// `-c UD`: the address handle of each QP's peer, made at `connect`.
    pub ahs: Vec<Ah>,
    /// Their CQ (send and receive; receive only with `--direct`).
    pub cq: Cq,
    /// `--direct`: the send CQ the direct poller reads, each QP's send ring's `wrid`
    /// table, and each QP's receive queue's (the receive CQ is read directly too).
    pub direct: Option<(Cq, WridTables, WridTables)>,
    /// `--timestamps`: the device clock of the CQ's completion timestamps, and whether the
    /// provider's extended CQ may be drained with `ibv_next_poll`.
    pub ts: Option<(TimestampClock, bool)>,
    /// The registered buffer (layout in [`engine`]).
    pub mr: Mr<'static>,
    /// The inline threshold in force (what was asked, within what the QP grants).
    pub inline: u32,
    /// `--events`: the completion channel `cq` was created on.
    pub channel: Option<CompChannel>,
}

/// One `wrid` table per QP (`--direct`).
pub type WridTables = Vec<Box<[u64]>>;

/// `--direct`: a thread domain (in a parent domain over `pd`) for each of `n` QPs, or none
/// at all when the device refuses one (its QPs then ring the doorbell only, and the
/// header says why).
fn thread_domains(dev: &Device, n: u32) -> Option<Vec<ParentDomain>> {
    let mut v = Vec::with_capacity(n as usize);
    for _ in 0..n {
        let td = dev.ctx.alloc_td().ok()?;
        v.push(dev.pd.alloc_parent_domain(Some(&td)).ok()?);
    }
    Some(v)
}

impl SideRes {
    /// Creates the CQ, the `-q` QPs and the buffer for `p`.
    pub fn new(dev: &Device, p: &Params) -> Result<SideRes, PerfError> {
        let depth = engine::send_depth(p);
        let rx = engine::recv_count(p);
        let qps = p.qps.max(1);
        let qp_type = match p.connection {
            Connection::Rc => QpType::Rc,
            Connection::Uc => QpType::Uc,
            Connection::Ud => QpType::Ud,
        };
        let max = p.sizes.iter().copied().max().unwrap_or(1);
        if p.connection == Connection::Ud && max > dev.mtu() {
            return Err(PerfError::Usage(format!(
                "a UD message is one packet: -s {max} exceeds the {} B MTU of {} port {}; \
                 use -s {} or less (or -c RC)",
                dev.mtu(),
                dev.name(),
                dev.port.port,
                dev.mtu()
            )));
        }
        if dev.direct && !dev.ctx.is_mlx5() {
            return Err(PerfError::Usage(format!(
                "--direct writes mlx5 (ConnectX) WQEs and {} is not an mlx5 device: drop \
                 --direct (the default path works on every device), or see it work on \
                 softnic's simulated ConnectX with -d softnic_mlx5",
                dev.name()
            )));
        }
        // Every QP's completions share the CQ: room for all of their WRs at once (with
        // --direct the sends go to their own CQ, of `send_cqe` + 16).
        let send_cqe = qps * depth;
        let cqe = send_cqe + qps * rx + 16;
        if cqe > dev.max_cqe {
            return Err(PerfError::Usage(format!(
                "-q {qps} QPs of {depth} send and {rx} receive WRs share one CQ of {cqe} \
                 entries, and {} allows {}: lower -q, -t or -r",
                dev.name(),
                dev.max_cqe
            )));
        }
        let scq = if dev.direct {
            Some(dev.ctx.create_cq(send_cqe + 16, None)?)
        } else {
            None
        };
        let channel = if dev.events {
            Some(dev.ctx.create_comp_channel()?)
        } else {
            None
        };
        let (cq, ts) = if dev.timestamps {
            // A device without completion timestamps (rxe) is refused here, by name.
            let b = CqBuilder::new(&dev.ctx, cqe)
                .wc_fields(WcFields::from_bits_retain(engine::TS_FIELDS.wc_flags()));
            let cq = match &channel {
                Some(ch) => b.channel(ch).build()?,
                None => b.build()?,
            };
            let clock = dev.ctx.timestamp_clock()?;
            (cq, Some((clock, dev.ctx.ex_cq_batch_poll_safe()?)))
        } else {
            (dev.ctx.create_cq(cqe, channel.as_ref())?, None)
        };
        let len = engine::buffer_len(p);
        let mr = dev
            .pd
            .alloc_mr(
                usize::try_from(len).map_err(|_| {
                    PerfError::Limit(format!(
                        "a buffer of {len} bytes is too large for this machine"
                    ))
                })?,
                AccessFlags::LOCAL_WRITE
                    | AccessFlags::REMOTE_WRITE
                    | AccessFlags::REMOTE_READ
                    | AccessFlags::REMOTE_ATOMIC,
            )
            .map_err(|e| PerfError::verbs(e, format!("registering {len} bytes")))?;
        // --direct: each QP in a thread domain of its own (its doorbell register its own).
        let domains = if dev.direct {
            thread_domains(dev, qps)
        } else {
            None
        };
        let pd_of = |i: u32| -> &Pd {
            match &domains {
                Some(d) => d[i as usize].as_pd(),
                None => &dev.pd,
            }
        };
        let build = |pd: &Pd, inline: u32| {
            let b = QpBuilder::new(pd, scq.as_ref().unwrap_or(&cq), &cq, qp_type)
                .max_send_wr(depth)
                .max_recv_wr(rx.max(1))
                .max_send_sge(1)
                .max_recv_sge(1)
                .max_inline_data(inline)
                .sq_sig_all(false);
            let b = if dev.old_post_send || dev.direct {
                b
            } else {
                b.send_ops(send_ops(p))
            };
            b.build()
        };
        let no_extended =
            |e: &hotverbs::Error| !dev.old_post_send && e.errno_name() == "EOPNOTSUPP";
        let explain = |e: hotverbs::Error, inline: u32| {
            if no_extended(&e) {
                PerfError::verbs(
                    e,
                    format!(
                        "device {} has no extended QPs for these operations: run with \
                         --use_old_post_send",
                        dev.name()
                    ),
                )
            } else {
                PerfError::verbs(e, format!("max_inline_data {inline}"))
            }
        };
        let wanted = p
            .inline_size
            .unwrap_or_else(|| default_inline(p, dev.direct));
        // With -I the user's value must work; by default, step down until the device
        // accepts (rxe and mlx5 grant different maxima). The other QPs are built with what
        // the first one was given.
        let tries: Vec<u32> = if p.inline_size.is_some() {
            vec![wanted]
        } else {
            [wanted, 128, 64, 0]
                .into_iter()
                .filter(|&v| v <= wanted)
                .collect()
        };
        let mut last = None;
        let mut first = None;
        for inline in tries {
            match build(pd_of(0), inline) {
                Ok(qp) => {
                    first = Some((qp, inline));
                    break;
                }
                Err(e) if no_extended(&e) => return Err(explain(e, inline)),
                Err(e) => last = Some(explain(e, inline)),
            }
        }
        let Some((qp, inline)) = first else {
            return Err(last.unwrap_or_else(|| {
                PerfError::Internal("ibv_create_qp was not tried: no inline size to try".into())
            }));
        };
        let inline = inline.min(qp.cap().max_inline_data);
        let mut all = vec![qp];
        for i in 1..qps {
            all.push(build(pd_of(i), inline).map_err(|e| explain(e, inline))?);
        }
        let direct = match scq {
            Some(scq) => {
                let mut wrids = Vec::with_capacity(all.len());
                let mut rq_wrids = Vec::with_capacity(all.len());
                for qp in &all {
                    let n = qp.mlx5_sq(std::ptr::null_mut())?.wqe_cnt as usize;
                    wrids.push(vec![0u64; n].into_boxed_slice());
                    let (rq, _) = qp.mlx5_rq(std::ptr::null_mut())?;
                    rq_wrids.push(vec![0u64; rq.wqe_cnt as usize].into_boxed_slice());
                }
                Some((scq, wrids, rq_wrids))
            }
            None => None,
        };
        Ok(SideRes {
            inline,
            qps: all,
            ahs: Vec::new(),
            cq,
            direct,
            ts,
            mr,
            channel,
        })
    }

    /// The landing zone offered to the peer.
    pub fn landing(&self, p: &Params) -> RemoteMr {
        let s = engine::slot_size(p.sizes.iter().copied().max().unwrap_or(1)) as u64;
        RemoteMr {
            addr: self.mr.addr() + s,
            len: s,
            rkey: self.mr.rkey(),
        }
    }

    /// Our endpoints, one per QP in order, each with the (shared) landing zone.
    pub fn endpoints(&self, dev: &Device, p: &Params) -> Vec<Endpoint> {
        self.qps
            .iter()
            .map(|qp| qp.endpoint(&dev.port).with_mr(self.landing(p)))
            .collect()
    }

    /// RESET -> INIT -> RTR -> RTS, QP i towards `remotes[i]`; over UD, the address handles
    /// to them.
    pub fn connect(&mut self, dev: &Device, remotes: &[Endpoint]) -> Result<(), PerfError> {
        if remotes.len() != self.qps.len() {
            return Err(PerfError::Protocol(format!(
                "the peer has {} QPs and this side {}: both sides need the same -q",
                remotes.len(),
                self.qps.len()
            )));
        }
        let opts = ConnectOptions {
            max_rd_atomic: dev.rd_atomic,
            max_dest_rd_atomic: dev.rd_atomic,
            // perftest's value (RNR waits for ever), to compare like with like.
            rnr_retry: 7,
            ..ConnectOptions::default()
        };
        self.ahs.clear();
        for (qp, remote) in self.qps.iter_mut().zip(remotes) {
            qp.connect(&dev.port, remote, &opts)?;
            if qp.qp_type() == QpType::Ud {
                self.ahs.push(
                    dev.pd
                        .create_ah(&AhAttr::to_endpoint(&dev.port, remote))
                        .map_err(|e| PerfError::verbs(e, "the address handle to the peer"))?,
                );
            }
        }
        Ok(())
    }

    /// `--events`: the channel and the CQ to sleep on.
    pub fn events(&self) -> Option<engine::Events> {
        self.channel.as_ref().map(|ch| engine::Events {
            ch: ch.clone(),
            cq: self.cq.clone(),
        })
    }

    /// The raw handles for the datapath, QP i aimed at `remotes[i]` (all at the peer's
    /// landing zone). With `--direct`, each QP's send queue rung as
    /// [`Qp::mlx5_register_use`] says;
    /// once per `SideRes` (the rings built from it start at the register's first buffer).
    pub fn side(&mut self, remotes: &[Endpoint]) -> Result<Side, PerfError> {
        let r = remotes.first().and_then(|e| e.mr).ok_or_else(|| {
            PerfError::Protocol("the peer offered no memory window: is it hotverbs-perf?".into())
        })?;
        if remotes.len() != self.qps.len() {
            return Err(PerfError::Protocol(format!(
                "the peer has {} QPs and this side {}: both sides need the same -q",
                remotes.len(),
                self.qps.len()
            )));
        }
        let mut qps = Vec::with_capacity(self.qps.len());
        for (i, (qp, remote)) in self.qps.iter().zip(remotes).enumerate() {
            let (sq, register, rq) = match &mut self.direct {
                Some((_, wrids, rq_wrids)) => {
                    let sq = qp.mlx5_sq(wrids[i].as_mut_ptr())?;
                    let register = qp.mlx5_register_use()?;
                    // The receive queue, written directly from counter 0: nothing was
                    // posted to it through libmlx5 (receives are the engine's).
                    let (rq, head) = qp.mlx5_rq(rq_wrids[i].as_mut_ptr())?;
                    if head != 0 {
                        return Err(PerfError::Internal(format!(
                            "--direct: QP {i}'s receive queue was posted to through libmlx5"
                        )));
                    }
                    let rq = (rq.wqe_cnt > 0).then_some(rq);
                    (Some(register.apply_to(sq)), Some(register), rq)
                }
                None => (None, None, None),
            };
            qps.push(QpSide {
                qp: qp.as_raw(),
                qpx: qp.as_qp_ex(),
                sq,
                rq,
                register,
                ud: self
                    .ahs
                    .get(i)
                    .map(|ah| ah.ud_dest(remote.qpn, DEFAULT_QKEY)),
            });
        }
        Ok(Side {
            qps,
            cq: self.cq.as_raw(),
            mr: LocalBuf::new(
                self.mr.addr(),
                u32::try_from(self.mr.len()).map_err(|_| {
                    PerfError::Limit(format!(
                        "a buffer of {} bytes is over 4 GiB, the most a datapath LocalBuf spans",
                        self.mr.len()
                    ))
                })?,
                self.mr.lkey(),
            ),
            remote: RemoteBuf::new(r.addr, r.len, r.rkey),
            max_inline: self.inline,
            timestamps: match (self.ts, self.cq.as_cq_ex()) {
                (Some((clock, batch_safe)), Some(cq)) => Some((cq, clock, batch_safe)),
                _ => None,
            },
            direct_cq: match &self.direct {
                Some((scq, _, _)) => Some(scq.mlx5_cq()?),
                None => None,
            },
            direct_recv_cq: match &self.direct {
                Some(_) => Some(self.cq.mlx5_cq()?),
                None => None,
            },
            sim: self.cq.context().kind() == hotverbs::DeviceKind::Softnic,
        })
    }
}

/// The `ibv_wr_*` builders a test posts with (the extended QP is created with exactly
/// these).
pub fn send_ops(p: &Params) -> SendOps {
    use crate::cli::TestKind;
    match p.test {
        TestKind::SendLat | TestKind::SendBw => SendOps::SEND | SendOps::SEND_WITH_IMM,
        TestKind::WriteLat if p.write_imm => SendOps::RDMA_WRITE | SendOps::RDMA_WRITE_WITH_IMM,
        TestKind::WriteLat | TestKind::WriteBw => SendOps::RDMA_WRITE,
        TestKind::ReadLat | TestKind::ReadBw => SendOps::RDMA_READ,
        TestKind::AtomicLat => SendOps::ATOMIC_FETCH_AND_ADD | SendOps::ATOMIC_CMP_AND_SWP,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_device_wins() {
        let c = choose(Some("rxe0"));
        assert_eq!(c.device, "rxe0");
        assert!(!c.fallback);
    }
}
