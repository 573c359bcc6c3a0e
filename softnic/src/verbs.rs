//! softnic's implementations of the exported libibverbs functions and of the context ops,
//! with libibverbs' conventions: pointer-returning verbs return NULL and set `errno`;
//! `ibv_modify_qp`, `ibv_query_*`, `ibv_destroy_*`, `ibv_dealloc_pd`, `ibv_dereg_mr` return
//! 0 or an errno value.
//!
//! # Safety (whole module)
//! Every function is `unsafe extern "C"` with the contract of the verb of the same name:
//! object pointers were returned by softnic (through [`crate::verbs_table`] or
//! [`crate::open_device`]) and are live; out-pointers are writable. Objects store their
//! fabric slab index in `handle` (contexts/channels in the wrapper after the ABI struct).
#![allow(clippy::missing_safety_doc)] // one contract for the module, stated above.

use core::ffi::{c_char, c_int, c_uint, c_void};
use core::ptr::null_mut;
use core::sync::atomic::{AtomicU32, Ordering};

use hotverbs_ffi::*;

use crate::errno::{set_errno, ErrnoScope};
use crate::fabric::{
    self, lock, Ah, Channel, Cq, Ctx, Device, ErrCause, Fabric, Mr, Pd, Ptr, SoftChannel,
    SoftContext, SoftCq, Srq, ACTIVE_MTU, GID_TBL_LEN,
};
use crate::{Config, Profile};

fn release_ctx(f: &mut Fabric, ci: u32) {
    if let Some(Some(c)) = f.ctxs.get_mut(ci as usize) {
        c.objects -= 1;
    }
}

fn fail<T>(errno: i32) -> *mut T {
    set_errno(errno);
    null_mut()
}

/// The slab index of a softnic context.
///
/// # Safety
/// `ctx` is a live softnic context.
pub(crate) unsafe fn ctx_idx(ctx: *mut ibv_context) -> u32 {
    // container_of: the context is the last field of the verbs_context that opens a
    // SoftContext; the pointer was derived from the whole SoftContext allocation.
    let soft = ctx
        .cast::<u8>()
        .wrapping_sub(core::mem::offset_of!(verbs_context, context))
        .cast::<SoftContext>();
    // SAFETY: softnic contexts live inside a SoftContext (caller), so `soft` is it.
    unsafe { (*soft).idx }
}

// ------------------------------------------------------------------ devices

static DEFAULT_DEVICE: std::sync::OnceLock<usize> = std::sync::OnceLock::new();

fn new_ibv_device(name: &str) -> *mut ibv_device {
    // SAFETY: ibv_device is plain C data; all-zero is a valid value.
    let mut d: ibv_device = unsafe { core::mem::zeroed() };
    d.node_type = IBV_NODE_CA;
    d.transport_type = IBV_TRANSPORT_IB;
    for dst in [&mut d.name, &mut d.dev_name] {
        for (i, b) in name.bytes().take(63).enumerate() {
            dst[i] = b as c_char;
        }
    }
    Box::into_raw(Box::new(d))
}

fn device_guid(idx: usize) -> u64 {
    // A locally administered EUI-64 (02:5f:00 ff:fe ...) with the device index.
    0x025f_00ff_fe00_0000 | (idx as u64 + 1)
}

/// Registers a device in the fabric; returns its index.
pub(crate) fn add_device(f: &mut Fabric, config: Config, owned_by_ctx: bool) -> usize {
    let ibv = new_ibv_device(&config.name);
    let idx = f.devices.len();
    let ipv4 = config
        .ipv4
        .unwrap_or([10, 77, ((idx + 1) >> 8) as u8, (idx + 1) as u8]);
    f.add_device(Device {
        config,
        ibv: Ptr(ibv),
        guid: device_guid(idx),
        ipv4,
        owned_by_ctx,
    })
}

pub(crate) fn default_device(f: &mut Fabric) -> usize {
    // Called with the lock held: the OnceLock init cannot race.
    *DEFAULT_DEVICE.get_or_init(|| add_device(f, Config::default(), false))
}

pub(crate) unsafe extern "C" fn get_device_list(num: *mut c_int) -> *mut *mut ibv_device {
    let _errno = ErrnoScope::enter();
    let mut f = lock();
    let d = default_device(&mut f);
    let dev = f.devices[d].as_ref().expect("default device").ibv.0;
    let list: Box<[*mut ibv_device; 2]> = Box::new([dev, null_mut()]);
    if !num.is_null() {
        // SAFETY: writable (caller).
        unsafe { *num = 1 };
    }
    Box::into_raw(list).cast()
}

pub(crate) unsafe extern "C" fn free_device_list(list: *mut *mut ibv_device) {
    let _errno = ErrnoScope::enter();
    if !list.is_null() {
        // SAFETY: allocated by get_device_list as a Box<[_; 2]>.
        drop(unsafe { Box::from_raw(list.cast::<[*mut ibv_device; 2]>()) });
    }
}

pub(crate) unsafe extern "C" fn get_device_name(dev: *mut ibv_device) -> *const c_char {
    let _errno = ErrnoScope::enter();
    if dev.is_null() {
        return core::ptr::null();
    }
    // SAFETY: a live softnic device (caller).
    unsafe { (*dev).name.as_ptr() }
}

fn dev_idx(f: &Fabric, dev: *mut ibv_device) -> Option<usize> {
    f.devices
        .iter()
        .position(|d| d.as_ref().is_some_and(|d| d.ibv.0 == dev))
}

pub(crate) unsafe extern "C" fn get_device_guid(dev: *mut ibv_device) -> __be64 {
    let _errno = ErrnoScope::enter();
    let f = lock();
    dev_idx(&f, dev).map_or(0, |i| f.devices[i].as_ref().expect("device").guid.to_be())
}

pub(crate) unsafe extern "C" fn open_device_c(dev: *mut ibv_device) -> *mut ibv_context {
    let _errno = ErrnoScope::enter();
    let mut f = lock();
    match dev_idx(&f, dev) {
        Some(d) => new_context(&mut f, d),
        None => fail(libc::ENODEV),
    }
}

pub(crate) fn ops() -> ibv_context_ops {
    // SAFETY: all-zero is a valid ibv_context_ops (every slot None).
    let mut o: ibv_context_ops = unsafe { core::mem::zeroed() };
    o.post_send = Some(post_send);
    o.post_recv = Some(post_recv);
    o.post_srq_recv = Some(post_srq_recv);
    o.poll_cq = Some(poll_cq);
    o.req_notify_cq = Some(req_notify_cq);
    o
}

pub(crate) fn new_context(f: &mut Fabric, dev: usize) -> *mut ibv_context {
    let Some((rd, wr)) = fabric::make_pipe() else {
        return fail(libc::EMFILE);
    };
    let nvec = f.devices[dev]
        .as_ref()
        .expect("device")
        .config
        .num_comp_vectors as c_int;
    // SAFETY: ibv_context is C data; all-zero is valid (a zero pthread mutex is the static
    // initializer on Linux).
    let mut ibv: ibv_context = unsafe { core::mem::zeroed() };
    ibv.device = f.devices[dev].as_ref().expect("device").ibv.0;
    ibv.ops = ops();
    ibv.cmd_fd = -1;
    ibv.async_fd = rd;
    ibv.num_comp_vectors = nvec;
    // An extended context, as libibverbs makes for every provider: the verbs.h inlines
    // (`ibv_create_qp_ex`, `ibv_alloc_td`, ...) find the extended ops through it.
    ibv.abi_compat = VERBS_ABI_IS_EXTENDED;
    let mut vctx = crate::ex::verbs_context_ops();
    vctx.sz = core::mem::size_of::<verbs_context>();
    vctx.context = ibv;
    let idx = f.ctxs.len() as u32;
    let p = Box::into_raw(Box::new(SoftContext { vctx, idx }));
    Fabric::add(
        &mut f.ctxs,
        Ctx {
            dev: dev as u32,
            ptr: Ptr(p),
            async_q: Default::default(),
            async_wr: wr,
            objects: 0,
            qps: 0,
        },
    );
    // SAFETY: just allocated; the context is a field of it (the pointer keeps the whole
    // allocation's provenance for ctx_idx's container_of).
    unsafe { core::ptr::addr_of_mut!((*p).vctx.context) }
}

pub(crate) unsafe extern "C" fn close_device(ctx: *mut ibv_context) -> c_int {
    let _errno = ErrnoScope::enter();
    let mut f = lock();
    // SAFETY: live softnic context (caller).
    let ci = unsafe { ctx_idx(ctx) } as usize;
    match f.ctxs.get(ci) {
        Some(Some(c)) if c.objects > 0 => {
            // Objects still refer to the context: keep it (and its fds) alive so they stay
            // usable and destroyable; libibverbs does not check either.
            return 0;
        }
        Some(Some(_)) => {}
        _ => return libc::EINVAL,
    }
    let c = f.ctxs[ci].take().expect("ctx");
    // SAFETY: our pipe ends and our allocation; no object refers to the context.
    unsafe {
        libc::close(c.async_wr);
        libc::close((*c.ptr.0).vctx.context.async_fd);
        drop(Box::from_raw(c.ptr.0));
    }
    let d = c.dev as usize;
    if f.devices[d].as_ref().is_some_and(|d| d.owned_by_ctx) {
        if let Some(dev) = f.devices[d].take() {
            // SAFETY: allocated by new_ibv_device; only this context used it.
            drop(unsafe { Box::from_raw(dev.ibv.0) });
        }
    }
    0
}

pub(crate) unsafe extern "C" fn query_device(
    ctx: *mut ibv_context,
    a: *mut ibv_device_attr,
) -> c_int {
    let _errno = ErrnoScope::enter();
    let f = lock();
    // SAFETY: live context (caller).
    let d = f.ctx_dev(unsafe { ctx_idx(ctx) });
    let c = &d.config;
    let mut x = ibv_device_attr::default();
    for (i, b) in b"0.0.0".iter().enumerate() {
        x.fw_ver[i] = *b as c_char;
    }
    x.node_guid = d.guid.to_be();
    x.sys_image_guid = d.guid.to_be();
    x.max_mr_size = u64::MAX;
    x.page_size_cap = 0xffff_f000;
    x.vendor_id = 0xffffff;
    x.max_qp = c.max_qp as c_int;
    x.max_qp_wr = c.max_qp_wr as c_int;
    x.device_cap_flags = 0x0122_3c76; // as rxe (ibv_devinfo -v)
    x.max_sge = c.max_sge as c_int;
    x.max_sge_rd = c.max_sge as c_int;
    x.max_cq = c.max_cq as c_int;
    x.max_cqe = c.max_cqe as c_int;
    x.max_mr = c.max_mr as c_int;
    x.max_pd = c.max_pd as c_int;
    x.max_qp_rd_atom = c.max_qp_rd_atom as c_int;
    x.max_res_rd_atom = 258048;
    x.max_qp_init_rd_atom = c.max_qp_rd_atom as c_int;
    x.atomic_cap = if c.atomics {
        IBV_ATOMIC_HCA
    } else {
        IBV_ATOMIC_NONE
    };
    x.max_mw = 524287;
    x.max_mcast_grp = 8192;
    x.max_mcast_qp_attach = 56;
    x.max_total_mcast_qp_attach = 458752;
    x.max_ah = c.max_ah as c_int;
    x.max_srq = c.max_srq as c_int;
    x.max_srq_wr = c.max_srq_wr as c_int;
    x.max_srq_sge = c.max_srq_sge as c_int;
    x.max_pkeys = 1;
    x.local_ca_ack_delay = 15;
    x.phys_port_cnt = 1;
    // SAFETY: writable (caller).
    unsafe { *a = x };
    0
}

pub(crate) unsafe extern "C" fn query_port(
    ctx: *mut ibv_context,
    port: u8,
    attr: *mut _compat_ibv_port_attr,
) -> c_int {
    let _errno = ErrnoScope::enter();
    if port != 1 {
        return libc::EINVAL;
    }
    let _ = ctx;
    let mut p = ibv_port_attr {
        state: IBV_PORT_ACTIVE,
        max_mtu: IBV_MTU_4096,
        active_mtu: IBV_MTU_1024,
        gid_tbl_len: GID_TBL_LEN as c_int,
        port_cap_flags: 0x0001_0000 | 0x0200_0000, // CM_SUP | IP_BASED_GIDS
        max_msg_sz: 0x8000_0000,
        pkey_tbl_len: 1,
        max_vl_num: 1,
        active_width: 1, // 1X
        active_speed: 1, // SDR
        phys_state: 5,   // LinkUp
        link_layer: IBV_LINK_LAYER_ETHERNET as u8,
        ..Default::default()
    };
    p.lid = 0;
    // The hotverbs layer (verbs-ffi's ibv_query_port) passes a full, zeroed ibv_port_attr
    // cast to the compat type, as the header's ___ibv_query_port does.
    // SAFETY: the caller provides a full ibv_port_attr (contract above).
    unsafe { attr.cast::<ibv_port_attr>().write(p) };
    debug_assert_eq!(ACTIVE_MTU, 1024);
    0
}

fn gid_of(ctx: *mut ibv_context, port: u32, index: u32) -> Result<[u8; 16], c_int> {
    if port != 1 || index >= GID_TBL_LEN {
        return Err(libc::EINVAL);
    }
    let f = lock();
    // SAFETY: live context (caller of the verb).
    let d = f.ctx_dev(unsafe { ctx_idx(ctx) });
    Ok(d.gid(index).unwrap_or([0; 16]))
}

pub(crate) unsafe extern "C" fn query_gid(
    ctx: *mut ibv_context,
    port: u8,
    index: c_int,
    gid: *mut ibv_gid,
) -> c_int {
    let _errno = ErrnoScope::enter();
    if index < 0 {
        set_errno(libc::EINVAL);
        return -1;
    }
    match gid_of(ctx, port as u32, index as u32) {
        Ok(raw) => {
            // SAFETY: writable (caller).
            unsafe { (*gid).raw = raw };
            0
        }
        Err(e) => {
            set_errno(e);
            -1
        }
    }
}

pub(crate) unsafe extern "C" fn query_gid_ex(
    ctx: *mut ibv_context,
    port: u32,
    index: u32,
    entry: *mut ibv_gid_entry,
    flags: u32,
    entry_size: usize,
) -> c_int {
    let _errno = ErrnoScope::enter();
    if flags != 0 || entry_size < core::mem::size_of::<ibv_gid_entry>() {
        return libc::EINVAL;
    }
    match gid_of(ctx, port, index) {
        Ok(raw) if raw != [0; 16] => {
            let e = ibv_gid_entry {
                gid: ibv_gid { raw },
                gid_index: index,
                port_num: port,
                gid_type: IBV_GID_TYPE_ROCE_V2,
                ndev_ifindex: 0,
            };
            // SAFETY: writable (caller).
            unsafe { entry.write(e) };
            0
        }
        Ok(_) => libc::ENODATA, // an empty table entry
        Err(e) => e,
    }
}

pub(crate) unsafe extern "C" fn query_pkey(
    _ctx: *mut ibv_context,
    port: u8,
    index: c_int,
    pkey: *mut __be16,
) -> c_int {
    let _errno = ErrnoScope::enter();
    if port != 1 || index != 0 {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: writable (caller).
    unsafe { *pkey = 0xffffu16.to_be() };
    0
}

// ------------------------------------------------------------------ PD / MR

pub(crate) unsafe extern "C" fn alloc_pd(ctx: *mut ibv_context) -> *mut ibv_pd {
    let _errno = ErrnoScope::enter();
    let mut f = lock();
    // SAFETY: live context (caller).
    let ci = unsafe { ctx_idx(ctx) };
    let idx = f.pds.len() as u32;
    let ibv = Box::into_raw(Box::new(ibv_pd {
        context: ctx,
        handle: idx,
    }));
    Fabric::add(
        &mut f.pds,
        Pd {
            ctx: ci,
            users: 0,
            ptr: Ptr(ibv),
            prot: idx,
            parent: None,
        },
    );
    f.ctxs[ci as usize].as_mut().expect("ctx").objects += 1;
    ibv
}

pub(crate) unsafe extern "C" fn dealloc_pd(pd: *mut ibv_pd) -> c_int {
    let _errno = ErrnoScope::enter();
    let mut f = lock();
    // SAFETY: live PD (caller).
    let pi = unsafe { (*pd).handle } as usize;
    match f.pds.get(pi) {
        Some(Some(p)) if p.users > 0 => return libc::EBUSY,
        Some(Some(_)) => {}
        _ => return libc::EINVAL,
    }
    let p = f.pds[pi].take().expect("pd");
    if let Some(td) = p.parent {
        // A parent domain: it held its PD and its thread domain.
        if let Some(Some(b)) = f.pds.get_mut(p.prot as usize) {
            b.users -= 1;
        }
        if let Some(Some(t)) = td.and_then(|t| f.tds.get_mut(t as usize)) {
            t.users -= 1;
        }
    }
    release_ctx(&mut f, p.ctx);
    // SAFETY: allocated by alloc_pd.
    drop(unsafe { Box::from_raw(p.ptr.0) });
    0
}

pub(crate) unsafe extern "C" fn reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> *mut ibv_mr {
    let _errno = ErrnoScope::enter();
    // SAFETY: forwarded.
    unsafe { reg_mr_iova2(pd, addr, length, addr as u64, access as c_uint) }
}

pub(crate) unsafe extern "C" fn reg_mr_iova(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_int,
) -> *mut ibv_mr {
    let _errno = ErrnoScope::enter();
    // SAFETY: forwarded.
    unsafe { reg_mr_iova2(pd, addr, length, iova, access as c_uint) }
}

pub(crate) unsafe extern "C" fn reg_mr_iova2(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_uint,
) -> *mut ibv_mr {
    let _errno = ErrnoScope::enter();
    // ibv_reg_mr(3): REMOTE_WRITE or REMOTE_ATOMIC require LOCAL_WRITE.
    if access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC) != 0
        && access & IBV_ACCESS_LOCAL_WRITE == 0
    {
        return fail(libc::EINVAL);
    }
    if (addr.is_null() && length > 0) || iova.checked_add(length as u64).is_none() {
        return fail(libc::EINVAL);
    }
    let mut f = lock();
    // SAFETY: live PD (caller).
    let (pi, ctx) = unsafe { ((*pd).handle, (*pd).context) };
    let idx = f.mrs.len();
    let key = Fabric::mr_key(idx);
    let ibv = Box::into_raw(Box::new(ibv_mr {
        context: ctx,
        pd,
        addr,
        length,
        handle: idx as u32,
        lkey: key,
        rkey: key,
    }));
    let prot = f.prot_of(pi);
    Fabric::add(
        &mut f.mrs,
        Mr {
            pd: pi,
            prot,
            addr: addr as usize,
            iova,
            len: length as u64,
            access,
            key,
            ptr: Ptr(ibv),
        },
    );
    if let Some(Some(p)) = f.pds.get_mut(pi as usize) {
        p.users += 1;
    }
    ibv
}

/// The mappings softnic's dmabuf registrations own, by MR key: `(base, length)` of the
/// `mmap`, unmapped by `dereg_mr`. Only changed with the fabric lock held (lock order:
/// fabric, then this), so no work request is copying through a mapping when it goes.
static DMABUF_MAPS: std::sync::Mutex<std::collections::BTreeMap<u32, (usize, usize)>> =
    std::sync::Mutex::new(std::collections::BTreeMap::new());

fn dmabuf_maps() -> std::sync::MutexGuard<'static, std::collections::BTreeMap<u32, (usize, usize)>>
{
    DMABUF_MAPS.lock().unwrap_or_else(|e| e.into_inner())
}

/// `ibv_reg_dmabuf_mr(3)`: softnic maps `length` bytes at `offset` of the fd (`mmap`,
/// `MAP_SHARED`, read/write) and registers that mapping as the MR's memory, addressed as
/// `iova..iova + length` (as `reg_mr_iova2`); the MR owns the mapping and `dereg_mr` unmaps
/// it. `ibv_mr.addr` is softnic's mapping (libibverbs puts `offset` there; neither is a
/// pointer the application may use). EOPNOTSUPP on a device configured with
/// `dmabuf: false` (what libibverbs answers for a provider without the verb, e.g. rxe).
pub(crate) unsafe extern "C" fn reg_dmabuf_mr(
    pd: *mut ibv_pd,
    offset: u64,
    length: usize,
    iova: u64,
    fd: c_int,
    access: c_int,
) -> *mut ibv_mr {
    let _errno = ErrnoScope::enter();
    {
        let f = lock();
        // SAFETY: live PD of a live softnic context (caller).
        let ci = unsafe { ctx_idx((*pd).context) };
        if !f.cfg(ci).dmabuf {
            return fail(libc::EOPNOTSUPP);
        }
    }
    let access = access as c_uint;
    if access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC) != 0
        && access & IBV_ACCESS_LOCAL_WRITE == 0
    {
        return fail(libc::EINVAL);
    }
    if length == 0 || iova.checked_add(length as u64).is_none() {
        return fail(libc::EINVAL);
    }
    if fd < 0 {
        return fail(libc::EBADF);
    }
    // The range must lie inside the buffer (the kernel checks a dmabuf's size the same
    // way): touching a shared mapping beyond the end of its file raises SIGBUS.
    // SAFETY: fstat on an fd the caller passes for the call, into a local.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return fail(hotverbs_ffi::errno());
    }
    let end = offset.checked_add(length as u64);
    if end.is_none_or(|e| e > st.st_size.max(0) as u64) {
        return fail(libc::EINVAL);
    }
    // mmap wants a page-aligned file offset: map from the page holding `offset`.
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as u64;
    let aligned = offset & !(page - 1);
    let delta = (offset - aligned) as usize;
    let (Ok(file_off), Some(map_len)) = (libc::off_t::try_from(aligned), delta.checked_add(length))
    else {
        return fail(libc::EINVAL);
    };
    // SAFETY: a new shared mapping of the caller's fd; no existing memory is affected.
    let base = unsafe {
        libc::mmap(
            null_mut(),
            map_len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            file_off,
        )
    };
    if base == libc::MAP_FAILED {
        return fail(hotverbs_ffi::errno());
    }
    // The registered memory: derived from the mapping, so it carries its provenance.
    let addr = base.cast::<u8>().wrapping_add(delta).cast::<c_void>();
    // SAFETY: a live PD; addr..addr + length is our mapping, valid until dereg_mr unmaps
    // it.
    let mr = unsafe { reg_mr_iova2(pd, addr, length, iova, access) };
    if mr.is_null() {
        // SAFETY: the mapping made above, used by nothing.
        unsafe { libc::munmap(base, map_len) };
        return mr;
    }
    // SAFETY: the MR just registered; nobody else has the pointer yet.
    let key = unsafe { (*mr).lkey };
    dmabuf_maps().insert(key, (base as usize, map_len));
    mr
}

pub(crate) unsafe extern "C" fn dereg_mr(mr: *mut ibv_mr) -> c_int {
    let _errno = ErrnoScope::enter();
    let mut f = lock();
    // SAFETY: live MR (caller).
    let i = unsafe { (*mr).handle } as usize;
    let Some(Some(m)) = f.mrs.get_mut(i).map(|m| m.take()) else {
        return libc::EINVAL;
    };
    if let Some(Some(p)) = f.pds.get_mut(m.pd as usize) {
        p.users -= 1;
    }
    if let Some((base, len)) = dmabuf_maps().remove(&m.key) {
        // SAFETY: the mapping reg_dmabuf_mr made for this MR, which is gone from the fabric
        // (we hold its lock, so no work request is copying through it); unmapped once.
        unsafe { libc::munmap(base as *mut c_void, len) };
    }
    // SAFETY: allocated by reg_mr_iova2.
    drop(unsafe { Box::from_raw(m.ptr.0) });
    0
}

// ------------------------------------------------------------------ CQ / channel

pub(crate) unsafe extern "C" fn create_comp_channel(
    ctx: *mut ibv_context,
) -> *mut ibv_comp_channel {
    let _errno = ErrnoScope::enter();
    let Some((rd, wr)) = fabric::make_pipe() else {
        return fail(libc::EMFILE);
    };
    let mut f = lock();
    // SAFETY: live context (caller).
    let ci = unsafe { ctx_idx(ctx) };
    let idx = f.channels.len() as u32;
    let p = Box::into_raw(Box::new(SoftChannel {
        ibv: ibv_comp_channel {
            context: ctx,
            fd: rd,
            refcnt: 0,
        },
        idx,
    }));
    Fabric::add(
        &mut f.channels,
        Channel {
            ctx: ci,
            wr,
            events: Default::default(),
            users: 0,
            ptr: Ptr(p),
        },
    );
    f.ctxs[ci as usize].as_mut().expect("ctx").objects += 1;
    p.cast()
}

pub(crate) unsafe extern "C" fn destroy_comp_channel(ch: *mut ibv_comp_channel) -> c_int {
    let _errno = ErrnoScope::enter();
    let mut f = lock();
    // SAFETY: softnic channels are SoftChannel (caller).
    let i = unsafe { (*ch.cast::<SoftChannel>()).idx } as usize;
    match f.channels.get(i) {
        Some(Some(c)) if c.users > 0 => return libc::EBUSY,
        Some(Some(_)) => {}
        _ => return libc::EINVAL,
    }
    let c = f.channels[i].take().expect("channel");
    release_ctx(&mut f, c.ctx);
    // SAFETY: our pipe and our allocation.
    unsafe {
        libc::close(c.wr);
        libc::close((*c.ptr.0).ibv.fd);
        drop(Box::from_raw(c.ptr.0));
    }
    0
}

pub(crate) unsafe extern "C" fn create_cq(
    ctx: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ibv_cq {
    let _errno = ErrnoScope::enter();
    let mut f = lock();
    // SAFETY: forwarded contract.
    match unsafe { new_cq(&mut f, ctx, cqe, cq_context, channel, comp_vector) } {
        Ok(p) => p.cast(),
        Err(e) => fail(e),
    }
}

/// `create_cq` with the fabric locked: the new CQ (a plain one; `create_cq_ex` extends it),
/// or the errno.
///
/// # Safety
/// As `create_cq`.
pub(crate) unsafe fn new_cq(
    f: &mut Fabric,
    ctx: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> Result<*mut SoftCq, c_int> {
    // SAFETY: live context (caller).
    let ci = unsafe { ctx_idx(ctx) };
    let (max_cqe, nvec, rxe) = {
        let c = f.cfg(ci);
        (c.max_cqe, c.num_comp_vectors, c.profile == Profile::Rxe)
    };
    if cqe < 1 || cqe as u32 > max_cqe || comp_vector < 0 || comp_vector as u32 >= nvec {
        return Err(libc::EINVAL);
    }
    // rxe G12/S19: the CQ holds the request rounded up to 2^k - 1, and reports it.
    let cqe = if rxe {
        fabric::rxe_round(cqe as u32) as c_int
    } else {
        cqe
    };
    let ch = if channel.is_null() {
        None
    } else {
        // SAFETY: softnic channel (caller).
        Some(unsafe { (*channel.cast::<SoftChannel>()).idx })
    };
    // SAFETY: ibv_cq_ex is C data; all-zero is valid (every extended slot NULL).
    let mut ibv: ibv_cq_ex = unsafe { core::mem::zeroed() };
    ibv.context = ctx;
    ibv.channel = channel;
    ibv.cq_context = cq_context;
    ibv.handle = f.cqs.len() as u32;
    ibv.cqe = cqe;
    let p = Box::into_raw(Box::new(SoftCq {
        ibv,
        ready: AtomicU32::new(0),
        cur: Default::default(),
    }));
    Fabric::add(
        &mut f.cqs,
        Cq {
            ctx: ci,
            ring: std::collections::VecDeque::with_capacity(cqe as usize),
            cap: cqe as usize,
            limit: cqe as usize,
            overflowed: false,
            rxe,
            inject_overflow: 0,
            stamps: false,
            parent_pd: None,
            armed: None,
            channel: ch,
            users: 0,
            events_reported: 0,
            ptr: Ptr(p),
            dv: None,
        },
    );
    if let Some(c) = ch {
        if let Some(Some(c)) = f.channels.get_mut(c as usize) {
            c.users += 1;
        }
    }
    f.ctxs[ci as usize].as_mut().expect("ctx").objects += 1;
    Ok(p)
}

pub(crate) unsafe extern "C" fn resize_cq(cq: *mut ibv_cq, cqe: c_int) -> c_int {
    let _errno = ErrnoScope::enter();
    let mut f = lock();
    // SAFETY: live CQ (caller).
    let i = unsafe { (*cq).handle } as usize;
    let Some(Some(c)) = f.cqs.get(i) else {
        return libc::EINVAL;
    };
    let max = f.cfg(c.ctx).max_cqe;
    let c = f.cqs[i].as_mut().expect("cq");
    if cqe < 1 || cqe as u32 > max || (cqe as usize) < c.ring.len() {
        return libc::EINVAL;
    }
    // rxe S15/S19: resize_cq(16) -> 31, resize_cq(1) -> 1.
    let cqe = if c.rxe {
        fabric::rxe_round(cqe as u32) as c_int
    } else {
        cqe
    };
    c.cap = cqe as usize;
    c.set_limit();
    // SAFETY: live CQ.
    unsafe { (*cq).cqe = cqe };
    0
}

/// `ibv_destroy_cq(3)`: EBUSY while a QP uses the CQ. Completion events still queued on
/// the channel for it are dropped; events already taken with `ibv_get_cq_event` must be
/// acknowledged first, and the call **blocks until they are**, as libibverbs does
/// (`ibv_get_cq_event(3)`: "destroying a CQ will wait for all completion events to be
/// acknowledged; this guarantees a one-to-one correspondence between acks and successful
/// gets"; libibverbs' `ibv_cmd_destroy_cq` waits on `cq->cond` until
/// `comp_events_completed` equals the events the kernel reported). So a thread that took an
/// event can still use the CQ (and its `cq_context`) until it acknowledges it.
pub(crate) unsafe extern "C" fn destroy_cq(cq: *mut ibv_cq) -> c_int {
    let _errno = ErrnoScope::enter();
    let mut f = lock();
    // SAFETY: live CQ (caller).
    let i = unsafe { (*cq).handle } as usize;
    loop {
        let (channel, reported) = match f.cqs.get(i) {
            Some(Some(c)) if c.users > 0 => return libc::EBUSY,
            Some(Some(c)) => (c.channel, c.events_reported),
            _ => return libc::EINVAL,
        };
        // Events nobody took yet die with the CQ (the kernel drops them from the channel).
        if let Some(ch) = channel {
            if let Some(Some(ch)) = f.channels.get_mut(ch as usize) {
                ch.events.retain(|&e| e as usize != i);
            }
        }
        // SAFETY: live CQ; ack_cq_events writes the counter only under the fabric lock,
        // which we hold.
        let acked = unsafe { (*cq).comp_events_completed };
        // Every event taken has been acknowledged (more acks than gets is the caller's bug;
        // it does not keep the CQ alive).
        if reported.wrapping_sub(acked) as i32 <= 0 {
            break;
        }
        f = fabric::wait_for_acks(f);
    }
    let c = f.cqs[i].take().expect("cq");
    if let Some(Some(p)) = c.parent_pd.and_then(|p| f.pds.get_mut(p as usize)) {
        p.users -= 1;
    }
    if let Some(ch) = c.channel {
        if let Some(Some(ch)) = f.channels.get_mut(ch as usize) {
            ch.users -= 1;
        }
    }
    release_ctx(&mut f, c.ctx);
    // SAFETY: allocated by create_cq; removed from the fabric above, and no event taken for
    // it is unacknowledged, so no caller of get_cq_event may still use it.
    drop(unsafe { Box::from_raw(c.ptr.0) });
    0
}

pub(crate) unsafe extern "C" fn poll_cq(cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int {
    // The mlx5 personality's device runs at every poll while it has queues (one relaxed
    // load otherwise).
    if crate::fabric::DV_QPS.load(Ordering::Relaxed) != 0 {
        let _errno = ErrnoScope::enter();
        lock().dv_step();
    }
    // Fast path: nothing to poll, no lock (busy-polling threads never contend with posters).
    // SAFETY: softnic CQs are SoftCq (create_cq); live (caller).
    let ready = unsafe { &(*cq.cast::<SoftCq>()).ready };
    // Acquire: pairs with the Release in Cq::publish.
    if ready.load(Ordering::Acquire) == 0 {
        return 0;
    }
    let _errno = ErrnoScope::enter();
    let mut f = lock();
    // SAFETY: live CQ (caller).
    let i = unsafe { (*cq).handle };
    f.poll(i, n, wc)
}

pub(crate) unsafe extern "C" fn req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    let _errno = ErrnoScope::enter();
    let mut f = lock();
    // SAFETY: live CQ (caller).
    let i = unsafe { (*cq).handle } as usize;
    match f.cqs.get_mut(i) {
        Some(Some(c)) => {
            c.armed = Some(solicited_only != 0);
            0
        }
        _ => libc::EINVAL,
    }
}

pub(crate) unsafe extern "C" fn get_cq_event(
    ch: *mut ibv_comp_channel,
    cq: *mut *mut ibv_cq,
    cq_context: *mut *mut c_void,
) -> c_int {
    let _errno = ErrnoScope::enter();
    // SAFETY: live channel (caller).
    let fd = unsafe { (*ch).fd };
    if crate::mlx5_active() {
        // The simulated ConnectX runs on while we wait, as the hardware would: WQEs written
        // straight into a send queue complete, and raise this event, with nobody polling.
        // SAFETY: F_GETFL on the channel's own fd.
        if unsafe { libc::fcntl(fd, libc::F_GETFL) } & libc::O_NONBLOCK != 0 {
            crate::mlx5_step();
        } else {
            // An error of poll (none expected on our own pipe) leaves the read below to
            // block or report it.
            let _ = crate::wait_fd_stepping(fd, None);
        }
    }
    // Block (or not, if the application made the fd non-blocking) outside the lock.
    if !fabric::wait_fd(fd) {
        return -1;
    }
    let mut f = lock();
    // SAFETY: softnic channel (caller).
    let i = unsafe { (*ch.cast::<SoftChannel>()).idx } as usize;
    let Some(Some(c)) = f.channels.get_mut(i) else {
        set_errno(libc::EINVAL);
        return -1;
    };
    let Some(cqi) = c.events.pop_front() else {
        set_errno(libc::EAGAIN);
        return -1;
    };
    let Some(Some(q)) = f.cqs.get_mut(cqi as usize) else {
        set_errno(libc::EINVAL);
        return -1;
    };
    // Reported: destroy_cq now waits for its acknowledgement.
    q.events_reported = q.events_reported.wrapping_add(1);
    // SAFETY: writable out-pointers (caller); the CQ is live (it is in the fabric).
    unsafe {
        *cq = q.ptr.0.cast();
        *cq_context = (*q.ptr.0).ibv.cq_context;
    }
    0
}

/// `ibv_ack_cq_events(3)`; wakes a `destroy_cq` waiting for the acknowledgements.
pub(crate) unsafe extern "C" fn ack_cq_events(cq: *mut ibv_cq, n: c_uint) {
    let _errno = ErrnoScope::enter();
    let _f = lock();
    // SAFETY: live CQ (caller: a CQ with unacknowledged events outlives their ack, since
    // destroy_cq waits for it); the counter is only written under the fabric lock.
    unsafe { (*cq).comp_events_completed = (*cq).comp_events_completed.wrapping_add(n) };
    fabric::events_acked();
}

// ------------------------------------------------------------------ async events

pub(crate) unsafe extern "C" fn get_async_event(
    ctx: *mut ibv_context,
    ev: *mut ibv_async_event,
) -> c_int {
    let _errno = ErrnoScope::enter();
    // SAFETY: live context (caller).
    if !fabric::wait_fd(unsafe { (*ctx).async_fd }) {
        return -1;
    }
    let mut f = lock();
    // SAFETY: live context (caller).
    let ci = unsafe { ctx_idx(ctx) } as usize;
    let Some(Some(c)) = f.ctxs.get_mut(ci) else {
        set_errno(libc::EINVAL);
        return -1;
    };
    let Some((ty, el)) = c.async_q.pop_front() else {
        set_errno(libc::EAGAIN);
        return -1;
    };
    let mut out = ibv_async_event {
        event_type: ty,
        ..Default::default()
    };
    match ty {
        IBV_EVENT_CQ_ERR => out.element.cq = el as *mut ibv_cq,
        IBV_EVENT_SRQ_LIMIT_REACHED | IBV_EVENT_SRQ_ERR => out.element.srq = el as *mut ibv_srq,
        IBV_EVENT_PORT_ACTIVE | IBV_EVENT_PORT_ERR => out.element.port_num = el as c_int,
        _ => out.element.qp = el as *mut ibv_qp,
    }
    // SAFETY: writable (caller).
    unsafe { *ev = out };
    0
}

pub(crate) unsafe extern "C" fn ack_async_event(_ev: *mut ibv_async_event) {}

// ------------------------------------------------------------------ QP

pub(crate) unsafe extern "C" fn create_qp(
    pd: *mut ibv_pd,
    init: *mut ibv_qp_init_attr,
) -> *mut ibv_qp {
    let _errno = ErrnoScope::enter();
    let mut f = lock();
    // SAFETY: live PD and readable/writable init attr (caller).
    let (pi, ctx, ia) = unsafe { ((*pd).handle, (*pd).context, &mut *init) };
    // SAFETY: live context.
    let ci = unsafe { ctx_idx(ctx) };
    let c = f.cfg(ci).clone();
    if ia.send_cq.is_null() || ia.recv_cq.is_null() {
        return fail(libc::EINVAL);
    }
    if !matches!(ia.qp_type, IBV_QPT_RC | IBV_QPT_UC | IBV_QPT_UD) {
        return fail(libc::EOPNOTSUPP);
    }
    let srq = if ia.srq.is_null() {
        None
    } else {
        // SAFETY: live SRQ (caller).
        Some(unsafe { (*ia.srq).handle })
    };
    let mut cap = ia.cap;
    if srq.is_some() {
        // ibv_create_qp(3): max_recv_wr/max_recv_sge are ignored with an SRQ.
        cap.max_recv_wr = 0;
        cap.max_recv_sge = 0;
    }
    // ibv_create_qp(3): "actual >= requested"; beyond the device limits -> EINVAL.
    if cap.max_send_wr > c.max_qp_wr
        || cap.max_recv_wr > c.max_qp_wr
        || cap.max_send_sge > c.max_sge
        || cap.max_recv_sge > c.max_sge
        || cap.max_inline_data > c.max_inline_data
    {
        return fail(libc::EINVAL);
    }
    if f.ctxs[ci as usize].as_ref().expect("ctx").qps >= c.max_qp {
        return fail(libc::ENOMEM);
    }
    let rxe = c.profile == Profile::Rxe;
    // What create_qp hands back: the request (Spec); rxe echoes the depths but raises
    // the SGE count and inline size to its WQE size.
    let mut ret = cap;
    if rxe {
        // rxe S5/S19: WQE size = max(16 * max_send_sge, max_inline_data); the returned
        // inline size is the WQE size and max_send_sge is raised to size / 16.
        let size = (16 * cap.max_send_sge)
            .max(cap.max_inline_data)
            .min(c.max_inline_data);
        ret.max_inline_data = size;
        ret.max_send_sge = cap.max_send_sge.max(size / 16).min(c.max_sge);
        // rxe G12/S3/S4/S19: the usable depths (and query_qp's) are rounded up to
        // 2^k - 1; create echoes the request.
        cap = ibv_qp_cap {
            max_send_wr: fabric::rxe_round(cap.max_send_wr),
            max_recv_wr: fabric::rxe_round(cap.max_recv_wr),
            ..ret
        };
    }
    // SAFETY: live CQs (caller).
    let (scq, rcq) = unsafe { ((*ia.send_cq).handle, (*ia.recv_cq).handle) };
    let idx = f.qps.len();
    // SAFETY: ibv_qp is C data; all-zero is valid.
    let mut ibv: ibv_qp = unsafe { core::mem::zeroed() };
    ibv.context = ctx;
    ibv.qp_context = ia.qp_context;
    ibv.pd = pd;
    ibv.send_cq = ia.send_cq;
    ibv.recv_cq = ia.recv_cq;
    ibv.srq = ia.srq;
    ibv.handle = idx as u32;
    ibv.qp_num = idx as u32 + fabric::QPN_BASE;
    ibv.state = IBV_QPS_RESET;
    ibv.qp_type = ia.qp_type;
    let p = Box::into_raw(Box::new(crate::ex::SoftQp::new(ibv))).cast::<ibv_qp>();
    let mut qp = Fabric::new_qp_struct(ci, pi, scq, rcq, srq, ia, cap, p);
    qp.prot = f.prot_of(pi);
    qp.inline_limit = c.max_inline_data.min(cap.max_inline_data);
    qp.atomics = c.atomics;
    qp.mlx5 = c.mlx5;
    qp.set_profile(rxe);
    f.add_qp(qp);
    f.provision_scratch(cap.max_send_sge.max(cap.max_recv_sge));
    for cq in [scq, rcq] {
        if let Some(Some(c)) = f.cqs.get_mut(cq as usize) {
            c.users += 1;
        }
    }
    if let Some(s) = srq {
        if let Some(Some(s)) = f.srqs.get_mut(s as usize) {
            s.users += 1;
        }
    }
    if let Some(Some(p)) = f.pds.get_mut(pi as usize) {
        p.users += 1;
    }
    let cx = f.ctxs[ci as usize].as_mut().expect("ctx");
    cx.objects += 1;
    cx.qps += 1;
    ia.cap = ret;
    p
}

pub(crate) unsafe extern "C" fn modify_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    mask: c_int,
) -> c_int {
    let _errno = ErrnoScope::enter();
    if mask as u32 & EXTENDED_QP_ATTRS != 0 {
        return libc::EOPNOTSUPP;
    }
    let mut f = lock();
    // SAFETY: live QP, readable attr (caller).
    let (i, a) = unsafe { ((*qp).handle as usize, &*attr) };
    f.modify_qp(i, a, mask as u32)
}

/// `ibv_qp_attr_mask` bits from `IBV_QP_RATE_LIMIT` on. libibverbs' `ibv_cmd_query_qp` and
/// `ibv_cmd_modify_qp` (which rxe, mlx5 and the other kernel providers use) refuse them
/// with EOPNOTSUPP before asking the kernel: these attributes need the `_ex` command path.
const EXTENDED_QP_ATTRS: u32 = !(IBV_QP_RATE_LIMIT - 1);

pub(crate) unsafe extern "C" fn query_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    mask: c_int,
    init: *mut ibv_qp_init_attr,
) -> c_int {
    let _errno = ErrnoScope::enter();
    if mask as u32 & EXTENDED_QP_ATTRS != 0 {
        return libc::EOPNOTSUPP;
    }
    let mut f = lock();
    // SAFETY: live QP (caller).
    let i = unsafe { (*qp).handle } as usize;
    let q = f.qp(i);
    let mut a = q.attr;
    a.qp_state = q.state;
    // rxe G10: cur_qp_state is always 0 (RESET).
    a.cur_qp_state = if q.rxe { IBV_QPS_RESET } else { q.state };
    a.cap = q.cap;
    let ini = ibv_qp_init_attr {
        qp_context: q.qp_context as *mut c_void,
        // SAFETY: live QP.
        send_cq: unsafe { (*qp).send_cq },
        // SAFETY: live QP.
        recv_cq: unsafe { (*qp).recv_cq },
        // SAFETY: live QP.
        srq: unsafe { (*qp).srq },
        cap: q.cap,
        qp_type: q.qpt,
        sq_sig_all: q.sq_sig_all as c_int,
    };
    // SAFETY: writable (caller).
    unsafe {
        if !attr.is_null() {
            *attr = a;
        }
        if !init.is_null() {
            *init = ini;
        }
    }
    0
}

pub(crate) unsafe extern "C" fn destroy_qp(qp: *mut ibv_qp) -> c_int {
    let _errno = ErrnoScope::enter();
    let mut f = lock();
    // SAFETY: live QP (caller).
    let i = unsafe { (*qp).handle } as usize;
    if !matches!(f.qps.get(i), Some(Some(_))) {
        return libc::EINVAL;
    }
    let q = f.remove_qp(i);
    for cq in [q.send_cq, q.recv_cq] {
        if let Some(Some(c)) = f.cqs.get_mut(cq as usize) {
            c.users -= 1;
        }
    }
    if let Some(s) = q.srq {
        if let Some(Some(s)) = f.srqs.get_mut(s as usize) {
            s.users -= 1;
        }
    }
    if let Some(Some(p)) = f.pds.get_mut(q.pd as usize) {
        p.users -= 1;
    }
    if let Some(Some(c)) = f.ctxs.get_mut(q.ctx as usize) {
        c.objects -= 1;
        c.qps -= 1;
    }
    // SAFETY: allocated by create_qp as a SoftQp (whose first field starts with the
    // ibv_qp); removed from the fabric above.
    drop(unsafe { Box::from_raw(q.ptr.0.cast::<crate::ex::SoftQp>()) });
    0
}

pub(crate) unsafe extern "C" fn post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad: *mut *mut ibv_send_wr,
) -> c_int {
    let _errno = ErrnoScope::enter();
    let mut f = lock();
    // SAFETY: live QP; valid chain (caller).
    unsafe { f.post_send((*qp).handle as usize, wr, bad) }
}

pub(crate) unsafe extern "C" fn post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    let _errno = ErrnoScope::enter();
    let mut f = lock();
    // SAFETY: live QP; valid chain (caller).
    unsafe { f.post_recv((*qp).handle as usize, wr, bad) }
}

pub(crate) unsafe extern "C" fn post_srq_recv(
    srq: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    let _errno = ErrnoScope::enter();
    let mut f = lock();
    // SAFETY: live SRQ; valid chain (caller).
    unsafe { f.post_srq_recv((*srq).handle as usize, wr, bad) }
}

// ------------------------------------------------------------------ SRQ

pub(crate) unsafe extern "C" fn create_srq(
    pd: *mut ibv_pd,
    init: *mut ibv_srq_init_attr,
) -> *mut ibv_srq {
    let _errno = ErrnoScope::enter();
    let mut f = lock();
    // SAFETY: live PD, valid attr (caller).
    let (pi, ctx, ia) = unsafe { ((*pd).handle, (*pd).context, &mut *init) };
    // SAFETY: live context.
    let ci = unsafe { ctx_idx(ctx) };
    let c = f.cfg(ci);
    if ia.attr.max_wr == 0 || ia.attr.max_wr > c.max_srq_wr || ia.attr.max_sge > c.max_srq_sge {
        return fail(libc::EINVAL);
    }
    // SAFETY: ibv_srq is C data; all-zero is valid.
    let mut ibv: ibv_srq = unsafe { core::mem::zeroed() };
    ibv.context = ctx;
    ibv.srq_context = ia.srq_context;
    ibv.pd = pd;
    ibv.handle = f.srqs.len() as u32;
    let p = Box::into_raw(Box::new(ibv));
    Fabric::add(
        &mut f.srqs,
        Srq {
            ctx: ci,
            pd: pi,
            rq: Fabric::new_srq_rq(ia.attr.max_wr, ia.attr.max_sge),
            limit: 0,
            users: 0,
            ptr: Ptr(p),
            dv: None,
        },
    );
    f.provision_scratch(ia.attr.max_sge);
    if let Some(Some(p)) = f.pds.get_mut(pi as usize) {
        p.users += 1;
    }
    f.ctxs[ci as usize].as_mut().expect("ctx").objects += 1;
    ia.attr.srq_limit = 0;
    p
}

pub(crate) unsafe extern "C" fn modify_srq(
    srq: *mut ibv_srq,
    attr: *mut ibv_srq_attr,
    mask: c_int,
) -> c_int {
    let _errno = ErrnoScope::enter();
    let mut f = lock();
    // SAFETY: live SRQ, readable attr (caller).
    let (i, a) = unsafe { ((*srq).handle as usize, *attr) };
    let Some(Some(s)) = f.srqs.get(i) else {
        return libc::EINVAL;
    };
    let max = f.cfg(s.ctx).max_srq_wr;
    let s = f.srqs[i].as_mut().expect("srq");
    let mask = mask as u32;
    if mask & !(IBV_SRQ_MAX_WR | IBV_SRQ_LIMIT) != 0 {
        return libc::EINVAL;
    }
    let new_max = if mask & IBV_SRQ_MAX_WR != 0 {
        a.max_wr
    } else {
        s.rq.cap
    };
    if new_max == 0 || new_max > max || (new_max as usize) < s.rq.q.len() {
        return libc::EINVAL;
    }
    if mask & IBV_SRQ_LIMIT != 0 && a.srq_limit > new_max {
        return libc::EINVAL;
    }
    s.rq.cap = new_max;
    s.rq.provision();
    if mask & IBV_SRQ_LIMIT != 0 {
        s.limit = a.srq_limit;
    }
    0
}

pub(crate) unsafe extern "C" fn query_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr) -> c_int {
    let _errno = ErrnoScope::enter();
    let f = lock();
    // SAFETY: live SRQ (caller).
    let i = unsafe { (*srq).handle } as usize;
    let Some(Some(s)) = f.srqs.get(i) else {
        return libc::EINVAL;
    };
    // SAFETY: writable (caller).
    unsafe {
        *attr = ibv_srq_attr {
            max_wr: s.rq.cap,
            max_sge: s.rq.max_sge,
            srq_limit: s.limit,
        };
    }
    0
}

pub(crate) unsafe extern "C" fn destroy_srq(srq: *mut ibv_srq) -> c_int {
    let _errno = ErrnoScope::enter();
    let mut f = lock();
    // SAFETY: live SRQ (caller).
    let i = unsafe { (*srq).handle } as usize;
    match f.srqs.get(i) {
        Some(Some(s)) if s.users > 0 => return libc::EBUSY,
        Some(Some(_)) => {}
        _ => return libc::EINVAL,
    }
    let s = f.srqs[i].take().expect("srq");
    if let Some(Some(p)) = f.pds.get_mut(s.pd as usize) {
        p.users -= 1;
    }
    release_ctx(&mut f, s.ctx);
    // SAFETY: allocated by create_srq.
    drop(unsafe { Box::from_raw(s.ptr.0) });
    0
}

// ------------------------------------------------------------------ AH / multicast

pub(crate) unsafe extern "C" fn create_ah(pd: *mut ibv_pd, attr: *mut ibv_ah_attr) -> *mut ibv_ah {
    let _errno = ErrnoScope::enter();
    // SAFETY: readable attr (caller).
    let a = unsafe { *attr };
    // RoCE needs a GRH (rxe S18: is_global=0 -> EINVAL; bad sgid_index -> ENODATA).
    if a.is_global == 0 || a.port_num > 1 {
        return fail(libc::EINVAL);
    }
    if a.grh.sgid_index as u32 >= GID_TBL_LEN {
        return fail(libc::ENODATA);
    }
    let mut f = lock();
    // SAFETY: live PD (caller).
    let (pi, ctx) = unsafe { ((*pd).handle, (*pd).context) };
    let ibv = Box::into_raw(Box::new(ibv_ah {
        context: ctx,
        pd,
        handle: f.ahs.len() as u32,
    }));
    let prot = f.prot_of(pi);
    Fabric::add(
        &mut f.ahs,
        Ah {
            pd: pi,
            prot,
            attr: a,
            ptr: Ptr(ibv),
            dv_av: None,
        },
    );
    if let Some(Some(p)) = f.pds.get_mut(pi as usize) {
        p.users += 1;
    }
    // SAFETY: live context.
    let ci = unsafe { ctx_idx(ctx) };
    f.ctxs[ci as usize].as_mut().expect("ctx").objects += 1;
    ibv
}

pub(crate) unsafe extern "C" fn destroy_ah(ah: *mut ibv_ah) -> c_int {
    let _errno = ErrnoScope::enter();
    let mut f = lock();
    // SAFETY: live AH (caller).
    let (i, ctx) = unsafe { ((*ah).handle as usize, (*ah).context) };
    let Some(Some(a)) = f.ahs.get_mut(i).map(|a| a.take()) else {
        return libc::EINVAL;
    };
    if let Some(Some(p)) = f.pds.get_mut(a.pd as usize) {
        p.users -= 1;
    }
    // SAFETY: live context.
    let ci = unsafe { ctx_idx(ctx) };
    release_ctx(&mut f, ci);
    // SAFETY: allocated by create_ah.
    drop(unsafe { Box::from_raw(a.ptr.0) });
    0
}

pub(crate) unsafe extern "C" fn init_ah_from_wc(
    ctx: *mut ibv_context,
    port: u8,
    wc: *mut ibv_wc,
    grh: *mut ibv_grh,
    ah: *mut ibv_ah_attr,
) -> c_int {
    let _errno = ErrnoScope::enter();
    // SAFETY: readable wc (caller).
    let w = unsafe { &*wc };
    if w.wc_flags & IBV_WC_GRH == 0 || grh.is_null() {
        // RoCE: the sender is only known from the GRH area.
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: the 40-byte GRH area of the receive buffer (caller).
    let g: [u8; 40] = unsafe { grh.cast::<[u8; 40]>().read_unaligned() };
    let mut dgid = [0u8; 16];
    let mut sgid_index = 0u8;
    if g[20] >> 4 == 4 {
        // RoCE v2 over IPv4: the IPv4 header sits in the last 20 bytes.
        dgid[10] = 0xff;
        dgid[11] = 0xff;
        dgid[12..].copy_from_slice(&g[32..36]);
        sgid_index = 1;
    } else {
        dgid.copy_from_slice(&g[8..24]);
    }
    let _ = ctx;
    let a = ibv_ah_attr {
        grh: ibv_global_route {
            dgid: ibv_gid { raw: dgid },
            flow_label: 0,
            sgid_index,
            hop_limit: 0xff,
            traffic_class: 0,
        },
        dlid: w.slid,
        sl: w.sl,
        src_path_bits: w.dlid_path_bits,
        static_rate: 0,
        is_global: 1,
        port_num: port,
    };
    // SAFETY: writable (caller).
    unsafe { *ah = a };
    0
}

pub(crate) unsafe extern "C" fn create_ah_from_wc(
    pd: *mut ibv_pd,
    wc: *mut ibv_wc,
    grh: *mut ibv_grh,
    port: u8,
) -> *mut ibv_ah {
    let _errno = ErrnoScope::enter();
    let mut a = ibv_ah_attr::default();
    // SAFETY: live PD (caller); forwarded pointers.
    if unsafe { init_ah_from_wc((*pd).context, port, wc, grh, &mut a) } != 0 {
        return null_mut();
    }
    // SAFETY: forwarded.
    unsafe { create_ah(pd, &mut a) }
}

pub(crate) unsafe extern "C" fn attach_mcast(
    qp: *mut ibv_qp,
    gid: *const ibv_gid,
    _lid: u16,
) -> c_int {
    let _errno = ErrnoScope::enter();
    let mut f = lock();
    // SAFETY: live QP, readable gid (caller).
    let (i, raw) = unsafe { ((*qp).handle as usize, (*gid).raw) };
    let q = f.qp(i);
    if q.qpt != IBV_QPT_UD || !fabric::is_mcast_gid(&raw) {
        return libc::EINVAL;
    }
    let qpn = i as u32 + fabric::QPN_BASE;
    let g = f.mcast.entry(raw).or_default();
    if !g.contains(&qpn) {
        g.push(qpn);
        f.qp(i).mcast += 1;
    }
    0
}

pub(crate) unsafe extern "C" fn detach_mcast(
    qp: *mut ibv_qp,
    gid: *const ibv_gid,
    _lid: u16,
) -> c_int {
    let _errno = ErrnoScope::enter();
    let mut f = lock();
    // SAFETY: live QP, readable gid (caller).
    let (i, raw) = unsafe { ((*qp).handle as usize, (*gid).raw) };
    let qpn = i as u32 + fabric::QPN_BASE;
    let Some(g) = f.mcast.get_mut(&raw) else {
        return libc::EINVAL;
    };
    let Some(pos) = g.iter().position(|&m| m == qpn) else {
        return libc::EINVAL;
    };
    g.remove(pos);
    if g.is_empty() {
        f.mcast.remove(&raw);
    }
    f.qp(i).mcast -= 1;
    0
}

/// `inject_qp_error` behind the public wrapper.
pub(crate) fn inject_error(qp_handle: usize) {
    let mut f = lock();
    if matches!(f.qps.get(qp_handle), Some(Some(_))) {
        f.qp_error(qp_handle, ErrCause::Fatal);
    }
}
