//! Devices, contexts, ports and GIDs: `ibv_get_device_list`, `ibv_open_device`,
//! `ibv_query_device(_ex)`, `ibv_query_port`, `ibv_query_gid(_ex)`, `ibv_query_pkey`.
//!
//! Invariants: a [`Context`] is an `Arc` around one open `ibv_context` and the function
//! table it was opened through; every child object (PD, CQ, channel) holds a clone, so the
//! context is closed (`ibv_close_device`) only after the last child is gone. The table is
//! one provider's whole table (softnic's `verbs_table()` or the loader's), and the
//! context's five hot ops (`post_send`, `post_recv`, `post_srq_recv`, `poll_cq`,
//! `req_notify_cq`) are filled, as `hotverbs_ffi::inline` requires.
//!
//! # Provider locking
//! The setup objects are `Send + Sync` (`Cq::poll` on two threads, `Qp::reset` while
//! another thread polls the CQ, ...) because every provider locks its CQ, QP and SRQ
//! internally. `MLX5_SINGLE_THREADED=1` switches libmlx5's locks off, process-wide (the
//! provider copies it into a global each time it opens a context and reads the global when
//! it creates a CQ, QP or SRQ), so [`Context::open`] refuses a real device while it is set;
//! softnic has its own locking and ignores it. (A context opened by other code in the
//! process with the variable set would still switch the locks off for objects created
//! afterwards; don't set it in a process that uses hotverbs.)

use std::ffi::{CStr, OsStr};
use std::fmt;
use std::sync::Arc;

use hotverbs_ffi::device_list::DeviceList;
use hotverbs_ffi::{ibv_context, IbvFns};

use crate::error::{record_drop_error, Error, Result};
use crate::zeroed;

/// The name of the software device, always present in [`devices()`].
pub const SOFTNIC: &str = "softnic";

/// The name that opens a new softnic device with the mlx5 personality (a simulated
/// ConnectX for the mlx5 direct path: `SoftnicConfig::mlx5`), e.g.
/// `HOTVERBS_DEVICE=softnic_mlx5` or `hotverbs-perf -d softnic_mlx5 --direct`. Not listed
/// by [`devices()`]: each open makes its own device.
pub const SOFTNIC_MLX5: &str = "softnic_mlx5";

/// Which kind of device a name refers to.
///
/// # Example
/// ```
/// let ctx = hotverbs::Context::open("softnic")?;
/// assert_eq!(ctx.kind(), hotverbs::DeviceKind::Softnic);
/// # Ok::<(), hotverbs::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DeviceKind {
    /// A kernel RDMA device reached through the run-time loaded `libibverbs.so.1`
    /// (mlx5, rxe, ...).
    Real,
    /// The in-process software device [`hotverbs_softnic`].
    Softnic,
}

/// One entry of [`devices()`].
///
/// # Example
/// ```
/// for d in hotverbs::devices() {
///     println!("{} ({:?})", d.name, d.kind);
/// }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeviceInfo {
    /// `ibv_get_device_name(3)`, e.g. `mlx5_0`, `rxe0`, `softnic`.
    pub name: String,
    /// Real or software.
    pub kind: DeviceKind,
}

/// [`devices()`] plus, when real devices could not be listed, why.
///
/// # Example
/// ```
/// let r = hotverbs::devices_report();
/// assert!(r.devices.iter().any(|d| d.name == "softnic"));
/// if let Some(why) = &r.real_unavailable {
///     println!("no real devices: {why}");
/// }
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct DevicesReport {
    /// softnic first, then the real devices in libibverbs' order.
    pub devices: Vec<DeviceInfo>,
    /// `Some(reason)` when libibverbs is not installed or listing failed; `None` when it
    /// answered (possibly with zero devices: a kernel without RDMA, ENOSYS, is an empty
    /// list, not an error).
    pub real_unavailable: Option<String>,
}

#[cfg(feature = "softnic")]
fn softnic_fns() -> &'static IbvFns {
    hotverbs_softnic::verbs_table()
}

/// # Safety
/// `fns` is one provider's whole table (softnic's or the loader's), as
/// [`DeviceList::get`] requires.
unsafe fn names(fns: &IbvFns) -> std::result::Result<Vec<String>, i32> {
    // SAFETY: forwarded contract.
    let list = unsafe { DeviceList::get(fns) }?;
    Ok((0..list.len())
        .filter_map(|i| list.name(i))
        .map(|n| n.to_string_lossy().into_owned())
        .collect())
}

/// Lists every device with the reason real devices are missing, if they are.
///
/// # References
/// `ibv_get_device_list(3)`
pub fn devices_report() -> DevicesReport {
    #[cfg(not(feature = "softnic"))]
    let mut devices: Vec<DeviceInfo> = Vec::new();
    #[cfg(feature = "softnic")]
    // SAFETY: softnic's own table.
    let mut devices: Vec<DeviceInfo> = unsafe { names(softnic_fns()) }
        .unwrap_or_default()
        .into_iter()
        .map(|name| DeviceInfo {
            name,
            kind: DeviceKind::Softnic,
        })
        .collect();
    if cfg!(feature = "softnic") && !devices.iter().any(|d| d.name == SOFTNIC) {
        // softnic always exists, even if its list verb is still being built.
        devices.insert(
            0,
            DeviceInfo {
                name: SOFTNIC.into(),
                kind: DeviceKind::Softnic,
            },
        );
    }
    let real_unavailable = match hotverbs_ffi::ibverbs() {
        Err(e) => Some(e.to_string()),
        // SAFETY: the loader's table.
        Ok(fns) => match unsafe { names(fns) } {
            Ok(real) => {
                devices.extend(real.into_iter().map(|name| DeviceInfo {
                    name,
                    kind: DeviceKind::Real,
                }));
                None
            }
            Err(errno) => Some(Error::new("ibv_get_device_list", errno).to_string()),
        },
    };
    DevicesReport {
        devices,
        real_unavailable,
    }
}

/// All devices: softnic (always, named `softnic`) and the real ones libibverbs lists.
/// Without libibverbs, or on a kernel without RDMA, the list is just softnic.
///
/// # Example
/// ```
/// assert!(hotverbs::devices().iter().any(|d| d.name == "softnic"));
/// ```
///
/// # References
/// `ibv_get_device_list(3)`
pub fn devices() -> Vec<DeviceInfo> {
    devices_report().devices
}

pub(crate) struct CtxInner {
    pub(crate) fns: &'static IbvFns,
    pub(crate) ctx: *mut ibv_context,
    /// We opened it and close it; false for contexts owned by librdmacm.
    owned: bool,
    name: String,
    kind: DeviceKind,
}

// SAFETY: an ibv_context is usable from any thread (libibverbs and softnic lock
// internally); the table is immutable.
unsafe impl Send for CtxInner {}
// SAFETY: see Send; all verbs on a context are thread-safe.
unsafe impl Sync for CtxInner {}

impl Drop for CtxInner {
    fn drop(&mut self) {
        if !self.owned || self.ctx.is_null() {
            return;
        }
        let Some(close) = self.fns.ibv_close_device else {
            return record_drop_error(Error::missing("ibv_close_device"));
        };
        // SAFETY: ctx came from this table's ibv_open_device and every child (which holds an
        // Arc of us) is gone.
        let ret = unsafe { close(self.ctx) };
        if ret != 0 {
            record_drop_error(Error::from_ret("ibv_close_device", ret));
        }
    }
}

/// An open device (`struct ibv_context`): the root of every other object.
///
/// Cheap to clone (an `Arc`); the device is closed when the last clone and the last object
/// made from it are gone. [`Context::close`] closes it now and reports the error.
///
/// # Example
/// ```
/// let ctx = hotverbs::Context::open("softnic")?;
/// let dev = ctx.query_device()?;
/// let port = ctx.query_port(ctx.default_port()?)?;
/// println!("{}: {} ports, max_qp_wr {}, active_mtu {}", ctx.name(),
///          dev.phys_port_cnt(), dev.max_qp_wr(), port.active_mtu().bytes());
/// # Ok::<(), hotverbs::Error>(())
/// ```
#[derive(Clone)]
pub struct Context {
    pub(crate) inner: Arc<CtxInner>,
}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context")
            .field("name", &self.inner.name)
            .field("kind", &self.inner.kind)
            .finish()
    }
}

/// The environment variable that makes libmlx5 skip its CQ/QP/SRQ locks (`"1"` exactly, as
/// libmlx5's `single_threaded_app()` compares it).
const MLX5_SINGLE_THREADED: &str = "MLX5_SINGLE_THREADED";

/// Whether a device of `kind` called `name` may be opened while `MLX5_SINGLE_THREADED` has
/// the value `env`: not a real one when it is `"1"`, because our setup objects' `Sync`
/// relies on the provider's locks. Every real device is refused, not only mlx5 ones: the
/// provider behind a name (`rocep1s0f0`, `ibp3s0`) is not visible through the verbs ABI, and
/// a process that sets the variable opens mlx5 devices anyway.
fn single_threaded_refusal(env: Option<&OsStr>, kind: DeviceKind, name: &str) -> Result<()> {
    if kind == DeviceKind::Softnic || env != Some(OsStr::new("1")) {
        return Ok(());
    }
    Err(
        Error::new("ibv_open_device", libc::ENOTSUP).with_hint(format!(
            "refusing to open {name:?}: {MLX5_SINGLE_THREADED}=1 removes libmlx5's locks, \
             which hotverbs' thread-safe setup objects rely on; unset it (the datapath rings \
             are single-owner and lock-free anyway)"
        )),
    )
}

/// [`single_threaded_refusal`] for this process's environment now: `Err` when a real device
/// must not be opened (or adopted, as librdmacm's contexts are) because
/// `MLX5_SINGLE_THREADED=1` is set.
pub(crate) fn check_provider_locks(kind: DeviceKind, name: &str) -> Result<()> {
    single_threaded_refusal(
        std::env::var_os(MLX5_SINGLE_THREADED).as_deref(),
        kind,
        name,
    )
}

/// Opens the device called `name` in `fns`' list, if it is there.
///
/// # Safety
/// `fns` is one provider's whole table (softnic's or the loader's; `kind` says which), as
/// [`DeviceList::get`] requires; its contexts fill the five hot ops (libibverbs installs
/// dummy ops, softnic fills them).
unsafe fn open_in(
    fns: &'static IbvFns,
    kind: DeviceKind,
    name: &str,
) -> Result<Option<*mut ibv_context>> {
    // SAFETY: forwarded contract.
    let list = unsafe { DeviceList::get(fns) }.map_err(|e| Error::new("ibv_get_device_list", e))?;
    for i in 0..list.len() {
        if list.name(i).map(CStr::to_bytes) != Some(name.as_bytes()) {
            continue;
        }
        // Before the context exists: libmlx5 reads the variable while opening it.
        check_provider_locks(kind, name)?;
        let dev = list.get_raw(i).expect("index in range");
        let open = fns
            .ibv_open_device
            .ok_or_else(|| Error::missing("ibv_open_device"))?;
        // SAFETY: dev is a live entry of the list (freed only after this call; an open
        // context keeps its device referenced).
        let ctx = unsafe { open(dev) };
        if ctx.is_null() {
            return Err(Error::from_errno("ibv_open_device"));
        }
        return Ok(Some(ctx));
    }
    Ok(None)
}

impl Context {
    /// Opens the device called `name`: `"softnic"` for the software device, else a real
    /// device as `ibv_devices` names it (`mlx5_0`, `rxe0`).
    ///
    /// # Errors
    /// `ibv_open_device: ENODEV` with the list of devices when there is no such device;
    /// the loader's message when libibverbs is missing; `ibv_open_device: EOPNOTSUPP` for a
    /// real device while `MLX5_SINGLE_THREADED=1` is set (it removes libmlx5's locks, which
    /// the `Sync` of [`Cq`](crate::Cq), [`Qp`](crate::Qp) and [`Srq`](crate::Srq) relies
    /// on; softnic opens regardless).
    ///
    /// # References
    /// `ibv_open_device(3)`
    pub fn open(name: &str) -> Result<Context> {
        #[cfg(feature = "softnic")]
        if name == SOFTNIC_MLX5 {
            return Self::open_softnic_with(hotverbs_softnic::Config {
                name: SOFTNIC_MLX5.to_string(),
                mlx5: true,
                ..Default::default()
            });
        }
        #[cfg(feature = "softnic")]
        // SAFETY: softnic's own table.
        if let Some(ctx) = unsafe { open_in(softnic_fns(), DeviceKind::Softnic, name) }? {
            return Ok(Self::wrap(softnic_fns(), ctx, name, DeviceKind::Softnic));
        }
        #[cfg(not(feature = "softnic"))]
        if name == SOFTNIC {
            return Err(Error::new("ibv_open_device", libc::ENODEV).with_hint(
                "hotverbs was built without its `softnic` feature (the software device)",
            ));
        }
        let fns = match hotverbs_ffi::ibverbs() {
            Ok(f) => f,
            Err(e) => {
                return Err(Error::new("ibv_open_device", libc::ENODEV)
                    .with_hint(format!("no device {name:?}: {e}")))
            }
        };
        // SAFETY: the loader's table.
        match unsafe { open_in(fns, DeviceKind::Real, name) }? {
            Some(ctx) => Ok(Self::wrap(fns, ctx, name, DeviceKind::Real)),
            None => {
                let all: Vec<String> = devices().into_iter().map(|d| d.name).collect();
                Err(
                    Error::new("ibv_open_device", libc::ENODEV).with_hint(format!(
                        "no device {name:?}; devices here: {}",
                        all.join(", ")
                    )),
                )
            }
        }
    }

    /// The default device: `$HOTVERBS_DEVICE` when set (`HOTVERBS_DEVICE=softnic` for the
    /// software device), else the first real RDMA device. Never softnic by surprise: a host
    /// whose NIC or driver is missing gets an error, not a software device in production.
    /// [`Context::name`] says which one was picked.
    ///
    /// # Errors
    /// `ibv_open_device: ENODEV` ("no RDMA device") when `$HOTVERBS_DEVICE` is unset and no
    /// real device is listed, with the reason libibverbs gave; the errors of
    /// [`open`](Self::open) otherwise.
    ///
    /// # Example
    /// ```
    /// // Here, with no RDMA hardware, fall back to the software device on purpose.
    /// let ctx = hotverbs::Context::open_default().or_else(|_| hotverbs::Context::open_softnic())?;
    /// println!("using {}", ctx.name());
    /// # Ok::<(), hotverbs::Error>(())
    /// ```
    pub fn open_default() -> Result<Context> {
        if let Ok(name) = std::env::var("HOTVERBS_DEVICE") {
            if !name.is_empty() {
                return Self::open(&name);
            }
        }
        let report = devices_report();
        if let Some(real) = report.devices.iter().find(|d| d.kind == DeviceKind::Real) {
            return Self::open(&real.name);
        }
        let why = report
            .real_unavailable
            .unwrap_or_else(|| "libibverbs lists no device".into());
        Err(
            Error::new("ibv_open_device", libc::ENODEV).with_hint(format!(
                "no RDMA device ({why}); for the in-process software device open it by name: \
             HOTVERBS_DEVICE=softnic or Context::open_softnic()"
            )),
        )
    }

    /// Opens softnic, the in-process software device (`"softnic"`), explicitly.
    ///
    /// # Example
    /// ```
    /// let ctx = hotverbs::Context::open_softnic()?;
    /// assert_eq!(ctx.name(), "softnic");
    /// # Ok::<(), hotverbs::Error>(())
    /// ```
    #[cfg(feature = "softnic")]
    pub fn open_softnic() -> Result<Context> {
        Self::open(SOFTNIC)
    }

    /// Opens an extra softnic device with custom limits (`hotverbs_softnic::open_device`),
    /// e.g. a small `max_qp_wr` to test how code copes with device limits. It is not listed
    /// by [`devices()`] and is reached through the same softnic table.
    ///
    /// # Example
    /// ```
    /// let cfg = hotverbs::SoftnicConfig { max_cqe: 64, ..Default::default() };
    /// let ctx = hotverbs::Context::open_softnic_with(cfg)?;
    /// assert_eq!(ctx.query_device()?.max_cqe(), 64);
    /// assert!(ctx.create_cq(65, None).is_err());
    /// # Ok::<(), hotverbs::Error>(())
    /// ```
    #[cfg(feature = "softnic")]
    pub fn open_softnic_with(config: hotverbs_softnic::Config) -> Result<Context> {
        let name = config.name.clone();
        let ctx = hotverbs_softnic::open_device(config);
        if ctx.is_null() {
            return Err(Error::from_errno("ibv_open_device"));
        }
        Ok(Self::wrap(softnic_fns(), ctx, &name, DeviceKind::Softnic))
    }

    fn wrap(fns: &'static IbvFns, ctx: *mut ibv_context, name: &str, kind: DeviceKind) -> Self {
        Context {
            inner: Arc::new(CtxInner {
                fns,
                ctx,
                owned: true,
                name: name.to_string(),
                kind,
            }),
        }
    }

    /// Wraps a context this crate did not open (e.g. `rdma_cm_id.verbs`, owned by
    /// librdmacm); it is never closed by us.
    ///
    /// # Safety
    /// - `ctx` is a live context reached through `fns`, and stays open for as long as this
    ///   `Context` or any object made from it lives;
    /// - `fns` is one provider's whole table (the loader's [`hotverbs_ffi::ibverbs()`] or
    ///   softnic's `verbs_table()`), not assembled from several;
    /// - the context's hot ops (`ops.post_send`, `post_recv`, `post_srq_recv`, `poll_cq`,
    ///   `req_notify_cq`) are filled, which the `hotverbs_ffi::inline` calls of the objects
    ///   made from it assume (true of every context libibverbs makes: it installs dummy
    ///   ops; and of softnic's);
    /// - its provider locks its CQs, QPs and SRQs internally (the setup objects are
    ///   `Sync`): for a real device, no context of this process was opened with
    ///   `MLX5_SINGLE_THREADED=1` before objects are created from this one (libmlx5 copies
    ///   the variable into a process-wide global at every open and reads that global when
    ///   it creates a CQ, QP or SRQ); [`Context::open`] checks this for its own opens.
    pub unsafe fn from_raw_borrowed(fns: &'static IbvFns, ctx: *mut ibv_context) -> Self {
        // SAFETY: ctx is live (caller); device and name are set by every provider.
        let name = unsafe {
            let dev = (*ctx).device;
            if dev.is_null() {
                String::from("?")
            } else {
                CStr::from_ptr((*dev).name.as_ptr())
                    .to_string_lossy()
                    .into_owned()
            }
        };
        #[cfg(not(feature = "softnic"))]
        let kind = DeviceKind::Real;
        #[cfg(feature = "softnic")]
        let kind = if std::ptr::eq(fns, softnic_fns()) {
            DeviceKind::Softnic
        } else {
            DeviceKind::Real
        };
        Context {
            inner: Arc::new(CtxInner {
                fns,
                ctx,
                owned: false,
                name,
                kind,
            }),
        }
    }

    /// The device name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Real device or softnic.
    pub fn kind(&self) -> DeviceKind {
        self.inner.kind
    }

    /// The function table every verb of this context goes through (libibverbs' or
    /// softnic's).
    pub fn fns(&self) -> &'static IbvFns {
        self.inner.fns
    }

    /// The raw `ibv_context`.
    ///
    /// Valid while this `Context` (or any object made from it) lives. Do not close it.
    pub fn as_raw(&self) -> *mut ibv_context {
        self.inner.ctx
    }

    /// Closes the device now (`ibv_close_device`), returning its error.
    ///
    /// # Errors
    /// `EBUSY` when clones or objects of this context are still alive; the verb's error
    /// otherwise.
    pub fn close(self) -> Result<()> {
        let mut inner = Arc::try_unwrap(self.inner).map_err(|_| {
            Error::new("ibv_close_device", libc::EBUSY)
                .with_hint("clones of this Context or objects made from it are still alive")
        })?;
        let ctx = std::mem::replace(&mut inner.ctx, std::ptr::null_mut());
        if !inner.owned {
            return Ok(());
        }
        let close = inner
            .fns
            .ibv_close_device
            .ok_or_else(|| Error::missing("ibv_close_device"))?;
        // SAFETY: ctx was opened through this table and no object uses it any more.
        let ret = unsafe { close(ctx) };
        if ret != 0 {
            return Err(Error::from_ret("ibv_close_device", ret));
        }
        Ok(())
    }

    /// `ibv_query_device_ex(3)` (falling back to `ibv_query_device(3)` where the provider
    /// has no extended query).
    pub fn query_device(&self) -> Result<DeviceAttr> {
        // SAFETY: ibv_device_attr_ex is plain C data; all-zero is valid.
        let mut attr: hotverbs_ffi::ibv_device_attr_ex = unsafe { zeroed() };
        // SAFETY: live context; null input is allowed; attr is writable.
        let ret = unsafe {
            hotverbs_ffi::inline::ibv_query_device_ex(
                self.inner.fns,
                self.inner.ctx,
                std::ptr::null(),
                &mut attr,
            )
        };
        if ret != 0 {
            return Err(Error::from_ret("ibv_query_device_ex", ret));
        }
        Ok(DeviceAttr { raw: attr })
    }

    /// `ibv_query_port(3)` (the header's `___ibv_query_port`, never the compat symbol).
    pub fn query_port(&self, port: u8) -> Result<PortAttr> {
        // SAFETY: plain C data.
        let mut attr: hotverbs_ffi::ibv_port_attr = unsafe { zeroed() };
        // SAFETY: live context, writable attr.
        let ret = unsafe {
            hotverbs_ffi::inline::ibv_query_port(self.inner.fns, self.inner.ctx, port, &mut attr)
        };
        if ret != 0 {
            return Err(Error::from_ret("ibv_query_port", ret).with_hint(format!(
                "port {port} does not exist? ports are numbered from 1"
            )));
        }
        Ok(PortAttr { raw: attr })
    }

    /// The first port whose state is ACTIVE.
    ///
    /// # Errors
    /// `ibv_query_port: ENODEV` when no port is active (cable, `rdma link`, `ip link set up`).
    pub fn default_port(&self) -> Result<u8> {
        let n = self.query_device()?.phys_port_cnt().max(1);
        for p in 1..=n {
            if let Ok(a) = self.query_port(p) {
                if a.is_active() {
                    return Ok(p);
                }
            }
        }
        Err(
            Error::new("ibv_query_port", libc::ENODEV).with_hint(format!(
                "no ACTIVE port on {} ({n} ports): check the link (`ibv_devinfo`, `rdma link`)",
                self.name()
            )),
        )
    }

    /// `ibv_query_gid(3)`: GID `index` of `port`.
    pub fn query_gid(&self, port: u8, index: u32) -> Result<Gid> {
        let f = self
            .inner
            .fns
            .ibv_query_gid
            .ok_or_else(|| Error::missing("ibv_query_gid"))?;
        // SAFETY: plain C data.
        let mut gid: hotverbs_ffi::ibv_gid = unsafe { zeroed() };
        // SAFETY: live context, writable gid.
        let ret = unsafe { f(self.inner.ctx, port, index as i32, &mut gid) };
        if ret != 0 {
            return Err(Error::from_ret("ibv_query_gid", ret).with_hint(format!(
                "GID index {index} out of the port's table (see `show_gids`)"
            )));
        }
        // SAFETY: every bit pattern of the union is a valid raw array.
        Ok(Gid(unsafe { gid.raw }))
    }

    /// `ibv_query_gid_ex(3)`: GID `index` of `port` with its type; falls back to
    /// [`query_gid`](Self::query_gid) (type from the link layer) where the extended verb is
    /// missing.
    pub fn query_gid_entry(&self, port: u8, index: u32) -> Result<GidEntry> {
        if self.inner.fns._ibv_query_gid_ex.is_some() {
            // SAFETY: plain C data.
            let mut e: hotverbs_ffi::ibv_gid_entry = unsafe { zeroed() };
            // SAFETY: live context, writable entry.
            let ret = unsafe {
                hotverbs_ffi::inline::ibv_query_gid_ex(
                    self.inner.fns,
                    self.inner.ctx,
                    port as u32,
                    index,
                    &mut e,
                    0,
                )
            };
            if ret != 0 {
                return Err(Error::from_ret("ibv_query_gid_ex", ret)
                    .or_hint(|| Some(format!("GID index {index} is empty or out of range"))));
            }
            return Ok(GidEntry {
                // SAFETY: any bit pattern is a valid raw array.
                gid: Gid(unsafe { e.gid.raw }),
                index: e.gid_index,
                port: e.port_num as u8,
                gid_type: GidType::from_raw(e.gid_type),
                ndev_ifindex: e.ndev_ifindex,
            });
        }
        let gid = self.query_gid(port, index)?;
        let ib = self.query_port(port)?.link_layer() != LinkLayer::Ethernet;
        Ok(GidEntry {
            gid,
            index,
            port,
            gid_type: if ib {
                GidType::Ib
            } else if gid.ipv4().is_some() {
                GidType::RoceV2
            } else {
                GidType::RoceV1
            },
            ndev_ifindex: 0,
        })
    }

    /// The port's GID table: every non-empty entry, with types.
    pub fn gid_table(&self, port: u8) -> Result<Vec<GidEntry>> {
        let len = self.query_port(port)?.gid_tbl_len();
        let mut out = Vec::new();
        for i in 0..len {
            match self.query_gid_entry(port, i) {
                Ok(e) if !e.gid.is_zero() => out.push(e),
                _ => {}
            }
        }
        Ok(out)
    }

    /// `ibv_query_pkey(3)`: P_Key `index` of `port`, in host order.
    pub fn query_pkey(&self, port: u8, index: u16) -> Result<u16> {
        let f = self
            .inner
            .fns
            .ibv_query_pkey
            .ok_or_else(|| Error::missing("ibv_query_pkey"))?;
        let mut pkey: u16 = 0;
        // SAFETY: live context, writable pkey.
        let ret = unsafe { f(self.inner.ctx, port, index as i32, &mut pkey) };
        if ret != 0 {
            return Err(Error::from_ret("ibv_query_pkey", ret));
        }
        Ok(u16::from_be(pkey))
    }

    /// The GID index a connection should use by default: on Ethernet (RoCE) the RoCE v2
    /// IPv4-mapped GID (else any RoCE v2, else the first), on InfiniBand `None` (address by
    /// LID; GID 0 is used when a GRH is wanted).
    pub fn default_gid_index(&self, port: u8) -> Result<Option<u32>> {
        let attr = self.query_port(port)?;
        if attr.link_layer() != LinkLayer::Ethernet {
            return Ok(None);
        }
        let table = self.gid_table(port)?;
        let pick = table
            .iter()
            .find(|e| e.gid_type == GidType::RoceV2 && e.gid.ipv4().is_some())
            .or_else(|| table.iter().find(|e| e.gid_type == GidType::RoceV2))
            .or_else(|| table.first());
        match pick {
            Some(e) => Ok(Some(e.index)),
            None => Err(Error::new("ibv_query_gid_ex", libc::ENODATA).with_hint(
                "the RoCE port has no GID: give its netdev an IP address (`ip addr add`)",
            )),
        }
    }

    /// Everything a connection needs about the local side of `port` (default: first active)
    /// with `gid_index` (default: [`default_gid_index`](Self::default_gid_index)).
    ///
    /// # Example
    /// ```
    /// let ctx = hotverbs::Context::open("softnic")?;
    /// let local = ctx.port_info(None, None)?;
    /// assert!(local.port >= 1);
    /// # Ok::<(), hotverbs::Error>(())
    /// ```
    pub fn port_info(&self, port: Option<u8>, gid_index: Option<u32>) -> Result<PortInfo> {
        let port = match port {
            Some(p) => p,
            None => self.default_port()?,
        };
        let attr = self.query_port(port)?;
        let gid_index = match gid_index {
            Some(i) => Some(i),
            None => self.default_gid_index(port)?,
        };
        let gid = match gid_index {
            Some(i) => self.query_gid(port, i)?,
            None => self.query_gid(port, 0).unwrap_or(Gid::ZERO),
        };
        Ok(PortInfo {
            port,
            lid: attr.lid(),
            gid,
            gid_index,
            active_mtu: attr.active_mtu(),
            link_layer: attr.link_layer(),
        })
    }
}

/// The local half of addressing: port, LID, GID and the MTU to cap connections at.
/// Made by [`Context::port_info`].
///
/// # Example
/// ```
/// let ctx = hotverbs::Context::open("softnic")?;
/// let info = ctx.port_info(None, None)?;
/// println!("port {} lid {:#06x} gid {}", info.port, info.lid, info.gid);
/// # Ok::<(), hotverbs::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortInfo {
    /// Port number (from 1).
    pub port: u8,
    /// LID (0 on Ethernet).
    pub lid: u16,
    /// The GID at `gid_index` (or GID 0 / zero when addressing by LID).
    pub gid: Gid,
    /// The source GID index for GRH-routed connections; `None` means address by LID.
    pub gid_index: Option<u32>,
    /// The port's active MTU.
    pub active_mtu: Mtu,
    /// InfiniBand or Ethernet (RoCE).
    pub link_layer: LinkLayer,
}

/// `ibv_device_attr_ex`, with accessors for the common limits.
///
/// # Example
/// ```
/// let attr = hotverbs::Context::open("softnic")?.query_device()?;
/// assert!(attr.max_qp_wr() > 0);
/// # Ok::<(), hotverbs::Error>(())
/// ```
#[derive(Clone, Copy)]
pub struct DeviceAttr {
    raw: hotverbs_ffi::ibv_device_attr_ex,
}

impl DeviceAttr {
    /// The full attribute struct (`struct ibv_device_attr_ex`), the raw door to every field.
    pub fn as_raw(&self) -> &hotverbs_ffi::ibv_device_attr_ex {
        &self.raw
    }
    /// SGEs per SRQ receive.
    pub fn max_srq_sge(&self) -> i32 {
        self.raw.orig_attr.max_srq_sge
    }
    /// Firmware version string.
    pub fn fw_ver(&self) -> String {
        let b: Vec<u8> = self
            .raw
            .orig_attr
            .fw_ver
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8)
            .collect();
        String::from_utf8_lossy(&b).into_owned()
    }
    /// Number of physical ports.
    pub fn phys_port_cnt(&self) -> u8 {
        self.raw.orig_attr.phys_port_cnt
    }
    /// Max QPs.
    pub fn max_qp(&self) -> i32 {
        self.raw.orig_attr.max_qp
    }
    /// Max work requests per queue.
    pub fn max_qp_wr(&self) -> i32 {
        self.raw.orig_attr.max_qp_wr
    }
    /// Max SGEs per WR.
    pub fn max_sge(&self) -> i32 {
        self.raw.orig_attr.max_sge
    }
    /// Max CQ entries.
    pub fn max_cqe(&self) -> i32 {
        self.raw.orig_attr.max_cqe
    }
    /// Max MR size in bytes.
    pub fn max_mr_size(&self) -> u64 {
        self.raw.orig_attr.max_mr_size
    }
    /// Max outstanding RDMA reads/atomics a QP may initiate.
    pub fn max_qp_init_rd_atom(&self) -> i32 {
        self.raw.orig_attr.max_qp_init_rd_atom
    }
    /// Max outstanding RDMA reads/atomics a QP may answer.
    pub fn max_qp_rd_atom(&self) -> i32 {
        self.raw.orig_attr.max_qp_rd_atom
    }
    /// Max SRQ work requests.
    pub fn max_srq_wr(&self) -> i32 {
        self.raw.orig_attr.max_srq_wr
    }
    /// Atomic capability (`IBV_ATOMIC_NONE/HCA/GLOB`).
    pub fn atomic_cap(&self) -> u32 {
        self.raw.orig_attr.atomic_cap
    }
    /// Max multicast groups.
    pub fn max_mcast_grp(&self) -> i32 {
        self.raw.orig_attr.max_mcast_grp
    }
    /// Extended device capability flags (`IBV_DEVICE_*`), 0 without the extended query.
    pub fn device_cap_flags_ex(&self) -> u64 {
        self.raw.device_cap_flags_ex
    }
    /// The width of the device's completion timestamps (`completion_timestamp_mask`: the
    /// counter wraps after it); 0 when the device has no completion timestamps (rxe), and
    /// without the extended query.
    ///
    /// # References
    /// `ibv_query_device_ex(3)`
    pub fn completion_timestamp_mask(&self) -> u64 {
        self.raw.completion_timestamp_mask
    }
    /// The frequency of the device clock that stamps completions (`hca_core_clock`), in
    /// kHz; 0 when the device does not declare one. [`crate::TimestampClock`] turns
    /// timestamps into nanoseconds with it.
    ///
    /// # References
    /// `ibv_query_device_ex(3)`
    pub fn hca_core_clock_khz(&self) -> u64 {
        self.raw.hca_core_clock
    }
    /// The vendor's IEEE OUI (`vendor_id`): 0x02c9 Mellanox/NVIDIA, 0xffffff Soft-RoCE
    /// (rxe).
    ///
    /// # References
    /// `ibv_query_device(3)`
    pub fn vendor_id(&self) -> u32 {
        self.raw.orig_attr.vendor_id
    }
    /// The vendor's part id (`vendor_part_id`), e.g. 4123 for a ConnectX-6; 0 on rxe.
    ///
    /// # References
    /// `ibv_query_device(3)`
    pub fn vendor_part_id(&self) -> u32 {
        self.raw.orig_attr.vendor_part_id
    }
    /// Are completion timestamps available (non-zero
    /// [`completion_timestamp_mask`](Self::completion_timestamp_mask))?
    ///
    /// # References
    /// `ibv_query_device_ex(3)`, `ibv_create_cq_ex(3)`
    pub fn supports_completion_timestamps(&self) -> bool {
        self.raw.completion_timestamp_mask != 0
    }
}

impl fmt::Debug for DeviceAttr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceAttr")
            .field("fw_ver", &self.fw_ver())
            .field("phys_port_cnt", &self.phys_port_cnt())
            .field("max_qp", &self.max_qp())
            .field("max_qp_wr", &self.max_qp_wr())
            .field("max_sge", &self.max_sge())
            .field("max_cqe", &self.max_cqe())
            .field(
                "completion_timestamp_mask",
                &format_args!("{:#x}", self.completion_timestamp_mask()),
            )
            .field("hca_core_clock_khz", &self.hca_core_clock_khz())
            .finish_non_exhaustive()
    }
}

/// Path MTU (`enum ibv_mtu`).
///
/// # Example
/// ```
/// use hotverbs::Mtu;
/// assert_eq!(Mtu::Mtu1024.bytes(), 1024);
/// assert_eq!(Mtu::from_bytes(4096), Some(Mtu::Mtu4096));
/// assert!(Mtu::Mtu256 < Mtu::Mtu4096);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u32)]
#[non_exhaustive]
pub enum Mtu {
    /// 256 bytes.
    Mtu256 = hotverbs_ffi::IBV_MTU_256,
    /// 512 bytes.
    Mtu512 = hotverbs_ffi::IBV_MTU_512,
    /// 1024 bytes.
    Mtu1024 = hotverbs_ffi::IBV_MTU_1024,
    /// 2048 bytes.
    Mtu2048 = hotverbs_ffi::IBV_MTU_2048,
    /// 4096 bytes.
    Mtu4096 = hotverbs_ffi::IBV_MTU_4096,
}

impl Mtu {
    /// From the enum value; unknown values are `None`.
    pub fn from_raw(v: u32) -> Option<Mtu> {
        Some(match v {
            hotverbs_ffi::IBV_MTU_256 => Mtu::Mtu256,
            hotverbs_ffi::IBV_MTU_512 => Mtu::Mtu512,
            hotverbs_ffi::IBV_MTU_1024 => Mtu::Mtu1024,
            hotverbs_ffi::IBV_MTU_2048 => Mtu::Mtu2048,
            hotverbs_ffi::IBV_MTU_4096 => Mtu::Mtu4096,
            _ => return None,
        })
    }
    /// From a size in bytes (256..4096, powers of two).
    pub fn from_bytes(b: u32) -> Option<Mtu> {
        Some(match b {
            256 => Mtu::Mtu256,
            512 => Mtu::Mtu512,
            1024 => Mtu::Mtu1024,
            2048 => Mtu::Mtu2048,
            4096 => Mtu::Mtu4096,
            _ => return None,
        })
    }
    /// Size in bytes.
    pub fn bytes(self) -> u32 {
        128 << (self as u32)
    }
    /// The raw enum value.
    pub fn raw(self) -> u32 {
        self as u32
    }
}

/// Link layer of a port.
///
/// # Example
/// ```
/// let ctx = hotverbs::Context::open("softnic")?;
/// // softnic models RoCE (as rxe): Ethernet, GRH required.
/// assert_eq!(ctx.query_port(1)?.link_layer(), hotverbs::LinkLayer::Ethernet);
/// # Ok::<(), hotverbs::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LinkLayer {
    /// InfiniBand (address by LID; GRH optional).
    Infiniband,
    /// Ethernet: RoCE (address by GID; GRH required).
    Ethernet,
    /// Not reported (old drivers: treat as InfiniBand).
    Unspecified,
}

/// `ibv_port_attr`, with accessors.
///
/// # Example
/// ```
/// let ctx = hotverbs::Context::open("softnic")?;
/// let p = ctx.query_port(1)?;
/// assert!(p.is_active());
/// println!("lid {} mtu {} gids {}", p.lid(), p.active_mtu().bytes(), p.gid_tbl_len());
/// # Ok::<(), hotverbs::Error>(())
/// ```
#[derive(Clone, Copy)]
pub struct PortAttr {
    raw: hotverbs_ffi::ibv_port_attr,
}

impl PortAttr {
    /// The full attribute struct (`struct ibv_port_attr`), the raw door to every field.
    pub fn as_raw(&self) -> &hotverbs_ffi::ibv_port_attr {
        &self.raw
    }
    /// `state == IBV_PORT_ACTIVE`.
    pub fn is_active(&self) -> bool {
        self.raw.state == hotverbs_ffi::IBV_PORT_ACTIVE
    }
    /// Raw port state.
    pub fn state(&self) -> u32 {
        self.raw.state
    }
    /// Active MTU (256 if the device reports garbage).
    pub fn active_mtu(&self) -> Mtu {
        Mtu::from_raw(self.raw.active_mtu).unwrap_or(Mtu::Mtu256)
    }
    /// Max MTU.
    pub fn max_mtu(&self) -> Mtu {
        Mtu::from_raw(self.raw.max_mtu).unwrap_or(Mtu::Mtu256)
    }
    /// LID.
    pub fn lid(&self) -> u16 {
        self.raw.lid
    }
    /// Number of GID table entries.
    pub fn gid_tbl_len(&self) -> u32 {
        self.raw.gid_tbl_len.max(0) as u32
    }
    /// Number of P_Key table entries.
    pub fn pkey_tbl_len(&self) -> u16 {
        self.raw.pkey_tbl_len
    }
    /// Max message size.
    pub fn max_msg_sz(&self) -> u32 {
        self.raw.max_msg_sz
    }
    /// Link layer.
    pub fn link_layer(&self) -> LinkLayer {
        match self.raw.link_layer as u32 {
            hotverbs_ffi::IBV_LINK_LAYER_INFINIBAND => LinkLayer::Infiniband,
            hotverbs_ffi::IBV_LINK_LAYER_ETHERNET => LinkLayer::Ethernet,
            _ => LinkLayer::Unspecified,
        }
    }
}

impl fmt::Debug for PortAttr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PortAttr")
            .field("active", &self.is_active())
            .field("active_mtu", &self.active_mtu())
            .field("lid", &self.lid())
            .field("link_layer", &self.link_layer())
            .field("gid_tbl_len", &self.gid_tbl_len())
            .finish_non_exhaustive()
    }
}

/// A 128-bit GID in network byte order (`union ibv_gid`'s `raw`).
///
/// # Example
/// ```
/// use hotverbs::Gid;
/// let g = Gid::from_ipv4([10, 77, 0, 1]);
/// assert_eq!(g.ipv4(), Some([10, 77, 0, 1]));
/// assert_eq!(g.to_string(), "0000:0000:0000:0000:0000:ffff:0a4d:0001");
/// ```
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The all-zero GID (no GID).
    pub const ZERO: Gid = Gid([0; 16]);

    /// The IPv4-mapped GID RoCE v2 uses for an IPv4 address (`::ffff:a.b.c.d`).
    pub fn from_ipv4(ip: [u8; 4]) -> Gid {
        let mut g = [0u8; 16];
        g[10] = 0xff;
        g[11] = 0xff;
        g[12..].copy_from_slice(&ip);
        Gid(g)
    }

    /// The IPv4 address of an IPv4-mapped GID.
    pub fn ipv4(&self) -> Option<[u8; 4]> {
        if self.0[..10].iter().all(|&b| b == 0) && self.0[10] == 0xff && self.0[11] == 0xff {
            Some([self.0[12], self.0[13], self.0[14], self.0[15]])
        } else {
            None
        }
    }

    /// All zero?
    pub fn is_zero(&self) -> bool {
        self.0 == [0; 16]
    }

    /// As the C union.
    pub fn to_raw(self) -> hotverbs_ffi::ibv_gid {
        hotverbs_ffi::ibv_gid { raw: self.0 }
    }
}

impl fmt::Display for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for i in 0..8 {
            if i > 0 {
                f.write_str(":")?;
            }
            write!(f, "{:02x}{:02x}", self.0[2 * i], self.0[2 * i + 1])?;
        }
        Ok(())
    }
}

impl fmt::Debug for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Gid({self})")
    }
}

/// GID type (`enum ibv_gid_type`).
///
/// # Example
/// ```
/// let ctx = hotverbs::Context::open("softnic")?;
/// assert_eq!(ctx.query_gid_entry(1, 1)?.gid_type, hotverbs::GidType::RoceV2);
/// # Ok::<(), hotverbs::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum GidType {
    /// InfiniBand.
    Ib,
    /// RoCE v1 (Ethernet, no IP header).
    RoceV1,
    /// RoCE v2 (UDP/IP).
    RoceV2,
    /// A value this crate does not know.
    Other(u32),
}

impl GidType {
    fn from_raw(v: u32) -> GidType {
        match v {
            hotverbs_ffi::IBV_GID_TYPE_IB => GidType::Ib,
            hotverbs_ffi::IBV_GID_TYPE_ROCE_V1 => GidType::RoceV1,
            hotverbs_ffi::IBV_GID_TYPE_ROCE_V2 => GidType::RoceV2,
            o => GidType::Other(o),
        }
    }
}

/// One GID table entry (`struct ibv_gid_entry`).
///
/// # Example
/// ```
/// let ctx = hotverbs::Context::open("softnic")?;
/// for e in ctx.gid_table(1)? {
///     println!("{} {:?} {}", e.index, e.gid_type, e.gid);
/// }
/// # Ok::<(), hotverbs::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct GidEntry {
    /// The GID.
    pub gid: Gid,
    /// Its index in the port's table.
    pub index: u32,
    /// Port number.
    pub port: u8,
    /// IB, RoCE v1 or RoCE v2.
    pub gid_type: GidType,
    /// ifindex of the netdev (RoCE), 0 otherwise.
    pub ndev_ifindex: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mtu_bytes() {
        assert_eq!(Mtu::Mtu256.bytes(), 256);
        assert_eq!(Mtu::Mtu4096.bytes(), 4096);
        for m in [
            Mtu::Mtu256,
            Mtu::Mtu512,
            Mtu::Mtu1024,
            Mtu::Mtu2048,
            Mtu::Mtu4096,
        ] {
            assert_eq!(Mtu::from_bytes(m.bytes()), Some(m));
            assert_eq!(Mtu::from_raw(m.raw()), Some(m));
        }
        assert_eq!(Mtu::from_bytes(1500), None);
        assert_eq!(Mtu::from_raw(0), None);
    }

    #[test]
    fn single_threaded_mlx5_refuses_real_devices_only() {
        let one = Some(OsStr::new("1"));
        let e = single_threaded_refusal(one, DeviceKind::Real, "mlx5_0")
            .expect_err("a real device must be refused with MLX5_SINGLE_THREADED=1");
        // ENOTSUP is EOPNOTSUPP on Linux, and named so.
        assert_eq!(e.errno_name(), "EOPNOTSUPP");
        let msg = e.to_string();
        assert!(msg.starts_with("ibv_open_device: EOPNOTSUPP"), "{msg}");
        for part in [
            "mlx5_0",
            "MLX5_SINGLE_THREADED=1",
            "libmlx5's locks",
            "unset it",
        ] {
            assert!(msg.contains(part), "{msg:?} lacks {part:?}");
        }
        // Every real device (the provider behind a name is not visible), never softnic.
        assert!(single_threaded_refusal(one, DeviceKind::Real, "rocep1s0f0").is_err());
        assert!(single_threaded_refusal(one, DeviceKind::Softnic, SOFTNIC).is_ok());
        // libmlx5 takes its locks unless the value is exactly "1" (strcmp).
        for other in [
            None,
            Some(""),
            Some("0"),
            Some("yes"),
            Some("1 "),
            Some("11"),
        ] {
            let env = other.map(OsStr::new);
            assert!(
                single_threaded_refusal(env, DeviceKind::Real, "mlx5_0").is_ok(),
                "{other:?} must not refuse"
            );
        }
    }

    #[test]
    fn gid_ipv4_mapping() {
        let g = Gid::from_ipv4([192, 168, 1, 2]);
        assert_eq!(g.ipv4(), Some([192, 168, 1, 2]));
        let mut link_local = [0u8; 16];
        link_local[0] = 0xfe;
        link_local[1] = 0x80;
        assert_eq!(Gid(link_local).ipv4(), None);
        assert!(Gid::ZERO.is_zero());
        assert_eq!(
            Gid(link_local).to_string(),
            "fe80:0000:0000:0000:0000:0000:0000:0000"
        );
    }
}
