//! The C side: `csrc/equiv.c`, each function one call of the system header's static inline
//! of the same name (without the `hv_c_` prefix), and the file's stand-ins for the exported
//! libibverbs symbols.
//!
//! The prototypes here are written from `verbs.h`; a wrong one would make the C and Rust
//! sides receive different arguments, which the tests would report.

use core::ffi::{c_int, c_uint, c_void};

use hotverbs_ffi::*;

/// A recording stand-in for `ibv_query_port@IBVERBS_1.1`.
pub type QueryPortFn =
    unsafe extern "C" fn(*mut ibv_context, u8, *mut _compat_ibv_port_attr) -> c_int;
/// A recording stand-in for `ibv_query_device`.
pub type QueryDeviceFn = unsafe extern "C" fn(*mut ibv_context, *mut ibv_device_attr) -> c_int;
/// A recording stand-in for `ibv_create_qp`.
pub type CreateQpFn = unsafe extern "C" fn(*mut ibv_pd, *mut ibv_qp_init_attr) -> *mut ibv_qp;
/// A recording stand-in for `_ibv_query_gid_ex`.
pub type QueryGidExFn =
    unsafe extern "C" fn(*mut ibv_context, u32, u32, *mut ibv_gid_entry, u32, usize) -> c_int;
/// A recording stand-in for `_ibv_query_gid_table`.
pub type QueryGidTableFn =
    unsafe extern "C" fn(*mut ibv_context, *mut ibv_gid_entry, usize, u32, usize) -> isize;
/// A recording stand-in for `ibv_create_srq`.
pub type CreateSrqFn = unsafe extern "C" fn(*mut ibv_pd, *mut ibv_srq_init_attr) -> *mut ibv_srq;

/// One entry of the C compiler's layout table (`hv_c_layout`): `"sizeof T"`,
/// `"alignof T"` or `"T.field"`, and its value.
#[repr(C)]
pub struct LayoutEntry {
    /// A static NUL-terminated name.
    pub name: *const core::ffi::c_char,
    /// `sizeof` / `_Alignof` / `offsetof` as the C compiler computed it.
    pub value: usize,
}

#[allow(missing_docs)] // each is documented by the header inline it wraps.
extern "C" {
    pub fn hv_c_post_send(
        qp: *mut ibv_qp,
        wr: *mut ibv_send_wr,
        bad: *mut *mut ibv_send_wr,
    ) -> c_int;
    pub fn hv_c_post_recv(
        qp: *mut ibv_qp,
        wr: *mut ibv_recv_wr,
        bad: *mut *mut ibv_recv_wr,
    ) -> c_int;
    pub fn hv_c_post_srq_recv(
        srq: *mut ibv_srq,
        wr: *mut ibv_recv_wr,
        bad: *mut *mut ibv_recv_wr,
    ) -> c_int;
    pub fn hv_c_poll_cq(cq: *mut ibv_cq, num_entries: c_int, wc: *mut ibv_wc) -> c_int;
    pub fn hv_c_req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int;

    pub fn hv_c_wr_start(qp: *mut ibv_qp_ex);
    pub fn hv_c_wr_complete(qp: *mut ibv_qp_ex) -> c_int;
    pub fn hv_c_wr_abort(qp: *mut ibv_qp_ex);
    pub fn hv_c_wr_send(qp: *mut ibv_qp_ex);
    pub fn hv_c_wr_send_imm(qp: *mut ibv_qp_ex, imm: __be32);
    pub fn hv_c_wr_send_inv(qp: *mut ibv_qp_ex, rkey: u32);
    pub fn hv_c_wr_send_tso(qp: *mut ibv_qp_ex, hdr: *mut c_void, hdr_sz: u16, mss: u16);
    pub fn hv_c_wr_rdma_write(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64);
    pub fn hv_c_wr_rdma_write_imm(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64, imm: __be32);
    pub fn hv_c_wr_rdma_read(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64);
    pub fn hv_c_wr_atomic_cmp_swp(
        qp: *mut ibv_qp_ex,
        rkey: u32,
        remote_addr: u64,
        compare: u64,
        swap: u64,
    );
    pub fn hv_c_wr_atomic_fetch_add(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64, add: u64);
    pub fn hv_c_wr_atomic_write(
        qp: *mut ibv_qp_ex,
        rkey: u32,
        remote_addr: u64,
        atomic_wr: *const c_void,
    );
    pub fn hv_c_wr_bind_mw(
        qp: *mut ibv_qp_ex,
        mw: *mut ibv_mw,
        rkey: u32,
        bind_info: *const ibv_mw_bind_info,
    );
    pub fn hv_c_wr_local_inv(qp: *mut ibv_qp_ex, rkey: u32);
    pub fn hv_c_wr_set_sge(qp: *mut ibv_qp_ex, lkey: u32, addr: u64, length: u32);
    pub fn hv_c_wr_set_sge_list(qp: *mut ibv_qp_ex, num_sge: usize, sg_list: *const ibv_sge);
    pub fn hv_c_wr_set_inline_data(qp: *mut ibv_qp_ex, addr: *mut c_void, length: usize);
    pub fn hv_c_wr_set_inline_data_list(
        qp: *mut ibv_qp_ex,
        num_buf: usize,
        buf_list: *const ibv_data_buf,
    );
    pub fn hv_c_wr_set_ud_addr(
        qp: *mut ibv_qp_ex,
        ah: *mut ibv_ah,
        remote_qpn: u32,
        remote_qkey: u32,
    );
    pub fn hv_c_wr_set_xrc_srqn(qp: *mut ibv_qp_ex, srqn: u32);

    pub fn hv_c_start_poll(cq: *mut ibv_cq_ex, attr: *mut ibv_poll_cq_attr) -> c_int;
    pub fn hv_c_next_poll(cq: *mut ibv_cq_ex) -> c_int;
    pub fn hv_c_end_poll(cq: *mut ibv_cq_ex);
    pub fn hv_c_wc_read_opcode(cq: *mut ibv_cq_ex) -> ibv_wc_opcode;
    pub fn hv_c_wc_read_vendor_err(cq: *mut ibv_cq_ex) -> u32;
    pub fn hv_c_wc_read_byte_len(cq: *mut ibv_cq_ex) -> u32;
    pub fn hv_c_wc_read_imm_data(cq: *mut ibv_cq_ex) -> __be32;
    pub fn hv_c_wc_read_invalidated_rkey(cq: *mut ibv_cq_ex) -> u32;
    pub fn hv_c_wc_read_qp_num(cq: *mut ibv_cq_ex) -> u32;
    pub fn hv_c_wc_read_src_qp(cq: *mut ibv_cq_ex) -> u32;
    pub fn hv_c_wc_read_wc_flags(cq: *mut ibv_cq_ex) -> c_uint;
    pub fn hv_c_wc_read_slid(cq: *mut ibv_cq_ex) -> u32;
    pub fn hv_c_wc_read_sl(cq: *mut ibv_cq_ex) -> u8;
    pub fn hv_c_wc_read_completion_ts(cq: *mut ibv_cq_ex) -> u64;
    pub fn hv_c_cq_ex_to_cq(cq: *mut ibv_cq_ex) -> *mut ibv_cq;
    pub fn hv_c_wc_read_dlid_path_bits(cq: *mut ibv_cq_ex) -> u8;
    pub fn hv_c_wc_read_completion_wallclock_ns(cq: *mut ibv_cq_ex) -> u64;
    pub fn hv_c_wc_read_cvlan(cq: *mut ibv_cq_ex) -> u16;
    pub fn hv_c_wc_read_flow_tag(cq: *mut ibv_cq_ex) -> u32;
    pub fn hv_c_wc_read_tm_info(cq: *mut ibv_cq_ex, tm_info: *mut ibv_wc_tm_info);
    pub fn hv_c_alloc_td(ctx: *mut ibv_context, attr: *mut ibv_td_init_attr) -> *mut ibv_td;
    pub fn hv_c_dealloc_td(td: *mut ibv_td) -> c_int;
    pub fn hv_c_alloc_parent_domain(
        ctx: *mut ibv_context,
        attr: *mut ibv_parent_domain_init_attr,
    ) -> *mut ibv_pd;
    pub fn hv_c_query_rt_values_ex(ctx: *mut ibv_context, values: *mut ibv_values_ex) -> c_int;

    pub fn hv_c_verbs_get_ctx(ctx: *mut ibv_context) -> *mut verbs_context;
    pub fn hv_c_query_port(ctx: *mut ibv_context, port_num: u8, attr: *mut ibv_port_attr) -> c_int;
    pub fn hv_c_query_device_ex(
        ctx: *mut ibv_context,
        input: *const ibv_query_device_ex_input,
        attr: *mut ibv_device_attr_ex,
    ) -> c_int;
    pub fn hv_c_create_qp_ex(ctx: *mut ibv_context, attr: *mut ibv_qp_init_attr_ex) -> *mut ibv_qp;
    pub fn hv_c_create_srq_ex(
        ctx: *mut ibv_context,
        attr: *mut ibv_srq_init_attr_ex,
    ) -> *mut ibv_srq;
    pub fn hv_c_create_cq_ex(
        ctx: *mut ibv_context,
        attr: *mut ibv_cq_init_attr_ex,
    ) -> *mut ibv_cq_ex;
    pub fn hv_c_query_gid_ex(
        ctx: *mut ibv_context,
        port_num: u32,
        gid_index: u32,
        entry: *mut ibv_gid_entry,
        flags: u32,
    ) -> c_int;
    pub fn hv_c_query_gid_table(
        ctx: *mut ibv_context,
        entries: *mut ibv_gid_entry,
        max_entries: usize,
        flags: u32,
    ) -> isize;
    pub fn hv_c_abi_is_extended() -> *mut c_void;
    /// The layout table: writes its length to `*len` and returns the static array.
    pub fn hv_c_layout(len: *mut usize) -> *const LayoutEntry;

    /// Installs the functions the `_ibv_query_gid_*` stand-ins forward to.
    pub fn hv_c_set_gid_hooks(query_gid_ex: QueryGidExFn, query_gid_table: QueryGidTableFn);
    /// The C file's `_ibv_query_gid_ex` symbol.
    #[link_name = "_ibv_query_gid_ex"]
    pub fn export_ibv_query_gid_ex(
        ctx: *mut ibv_context,
        port_num: u32,
        gid_index: u32,
        entry: *mut ibv_gid_entry,
        flags: u32,
        entry_size: usize,
    ) -> c_int;
    /// The C file's `_ibv_query_gid_table` symbol.
    #[link_name = "_ibv_query_gid_table"]
    pub fn export_ibv_query_gid_table(
        ctx: *mut ibv_context,
        entries: *mut ibv_gid_entry,
        max_entries: usize,
        flags: u32,
        entry_size: usize,
    ) -> isize;

    /// Installs the functions the exported-symbol stand-ins forward to.
    pub fn hv_c_set_export_hooks(
        query_port: QueryPortFn,
        query_device: QueryDeviceFn,
        create_qp: CreateQpFn,
        create_srq: CreateSrqFn,
    );

    /// The C file's `ibv_query_port` symbol (what the header's fallback calls).
    #[link_name = "ibv_query_port"]
    pub fn export_ibv_query_port(
        ctx: *mut ibv_context,
        port_num: u8,
        attr: *mut _compat_ibv_port_attr,
    ) -> c_int;
    /// The C file's `ibv_query_device` symbol.
    #[link_name = "ibv_query_device"]
    pub fn export_ibv_query_device(ctx: *mut ibv_context, attr: *mut ibv_device_attr) -> c_int;
    /// The C file's `ibv_create_qp` symbol.
    #[link_name = "ibv_create_qp"]
    pub fn export_ibv_create_qp(pd: *mut ibv_pd, attr: *mut ibv_qp_init_attr) -> *mut ibv_qp;
    /// The C file's `ibv_create_srq` symbol.
    #[link_name = "ibv_create_srq"]
    pub fn export_ibv_create_srq(pd: *mut ibv_pd, attr: *mut ibv_srq_init_attr) -> *mut ibv_srq;
}

/// An [`IbvFns`] whose `ibv_query_port`, `ibv_query_device`, `ibv_create_qp`,
/// `ibv_create_srq`, `_ibv_query_gid_ex` and `_ibv_query_gid_table` are the very symbols
/// the header's C inlines call (the C file's recording stand-ins); every other entry is
/// `None`.
pub fn export_table() -> IbvFns {
    IbvFns {
        ibv_query_port: Some(export_ibv_query_port),
        ibv_query_device: Some(export_ibv_query_device),
        ibv_create_qp: Some(export_ibv_create_qp),
        ibv_create_srq: Some(export_ibv_create_srq),
        _ibv_query_gid_ex: Some(export_ibv_query_gid_ex),
        _ibv_query_gid_table: Some(export_ibv_query_gid_table),
        ..IbvFns::EMPTY
    }
}
