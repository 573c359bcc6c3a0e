/*
 * hotverbs-ffi-equiv: the C side of the equivalence proof.
 *
 * Every hv_c_* function below is a non-inline wrapper whose body is one call of a static
 * inline (or macro) of the system's <infiniband/verbs.h>, compiled by the system compiler,
 * so the Rust tests can run the header's own code and verbs-ffi's Rust re-expression of it
 * against the same recording provider and compare what each did.
 *
 * The setup-side inlines fall back to (or simply call) exported libibverbs symbols
 * (ibv_query_port, ibv_query_device, ibv_create_qp, ibv_create_srq, _ibv_query_gid_ex,
 * _ibv_query_gid_table). libibverbs is NOT linked: this file
 * defines those symbols itself, each forwarding to a hook the Rust test installs (a
 * recording function), so both the C and the Rust paths land in the same log.
 */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <infiniband/verbs.h>
#include <infiniband/mlx5dv.h>

/* ---- the five legacy hot verbs (dispatch through context->ops) ---------------------- */

int hv_c_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
	return ibv_post_send(qp, wr, bad);
}

int hv_c_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	return ibv_post_recv(qp, wr, bad);
}

int hv_c_post_srq_recv(struct ibv_srq *srq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	return ibv_post_srq_recv(srq, wr, bad);
}

int hv_c_poll_cq(struct ibv_cq *cq, int num_entries, struct ibv_wc *wc)
{
	return ibv_poll_cq(cq, num_entries, wc);
}

int hv_c_req_notify_cq(struct ibv_cq *cq, int solicited_only)
{
	return ibv_req_notify_cq(cq, solicited_only);
}

/* ---- the ibv_wr_* family (dispatch through ibv_qp_ex) ------------------------------- */

void hv_c_wr_start(struct ibv_qp_ex *qp) { ibv_wr_start(qp); }
int hv_c_wr_complete(struct ibv_qp_ex *qp) { return ibv_wr_complete(qp); }
void hv_c_wr_abort(struct ibv_qp_ex *qp) { ibv_wr_abort(qp); }
void hv_c_wr_send(struct ibv_qp_ex *qp) { ibv_wr_send(qp); }
void hv_c_wr_send_imm(struct ibv_qp_ex *qp, __be32 imm) { ibv_wr_send_imm(qp, imm); }
void hv_c_wr_send_inv(struct ibv_qp_ex *qp, uint32_t rkey) { ibv_wr_send_inv(qp, rkey); }

void hv_c_wr_send_tso(struct ibv_qp_ex *qp, void *hdr, uint16_t hdr_sz, uint16_t mss)
{
	ibv_wr_send_tso(qp, hdr, hdr_sz, mss);
}

void hv_c_wr_rdma_write(struct ibv_qp_ex *qp, uint32_t rkey, uint64_t remote_addr)
{
	ibv_wr_rdma_write(qp, rkey, remote_addr);
}

void hv_c_wr_rdma_write_imm(struct ibv_qp_ex *qp, uint32_t rkey, uint64_t remote_addr,
			    __be32 imm)
{
	ibv_wr_rdma_write_imm(qp, rkey, remote_addr, imm);
}

void hv_c_wr_rdma_read(struct ibv_qp_ex *qp, uint32_t rkey, uint64_t remote_addr)
{
	ibv_wr_rdma_read(qp, rkey, remote_addr);
}

void hv_c_wr_atomic_cmp_swp(struct ibv_qp_ex *qp, uint32_t rkey, uint64_t remote_addr,
			    uint64_t compare, uint64_t swap)
{
	ibv_wr_atomic_cmp_swp(qp, rkey, remote_addr, compare, swap);
}

void hv_c_wr_atomic_fetch_add(struct ibv_qp_ex *qp, uint32_t rkey, uint64_t remote_addr,
			      uint64_t add)
{
	ibv_wr_atomic_fetch_add(qp, rkey, remote_addr, add);
}

void hv_c_wr_atomic_write(struct ibv_qp_ex *qp, uint32_t rkey, uint64_t remote_addr,
			  const void *atomic_wr)
{
	ibv_wr_atomic_write(qp, rkey, remote_addr, atomic_wr);
}

void hv_c_wr_bind_mw(struct ibv_qp_ex *qp, struct ibv_mw *mw, uint32_t rkey,
		     const struct ibv_mw_bind_info *bind_info)
{
	ibv_wr_bind_mw(qp, mw, rkey, bind_info);
}

void hv_c_wr_local_inv(struct ibv_qp_ex *qp, uint32_t rkey) { ibv_wr_local_inv(qp, rkey); }

void hv_c_wr_set_sge(struct ibv_qp_ex *qp, uint32_t lkey, uint64_t addr, uint32_t length)
{
	ibv_wr_set_sge(qp, lkey, addr, length);
}

void hv_c_wr_set_sge_list(struct ibv_qp_ex *qp, size_t num_sge, const struct ibv_sge *sg_list)
{
	ibv_wr_set_sge_list(qp, num_sge, sg_list);
}

void hv_c_wr_set_inline_data(struct ibv_qp_ex *qp, void *addr, size_t length)
{
	ibv_wr_set_inline_data(qp, addr, length);
}

void hv_c_wr_set_inline_data_list(struct ibv_qp_ex *qp, size_t num_buf,
				  const struct ibv_data_buf *buf_list)
{
	ibv_wr_set_inline_data_list(qp, num_buf, buf_list);
}

void hv_c_wr_set_ud_addr(struct ibv_qp_ex *qp, struct ibv_ah *ah, uint32_t remote_qpn,
			 uint32_t remote_qkey)
{
	ibv_wr_set_ud_addr(qp, ah, remote_qpn, remote_qkey);
}

void hv_c_wr_set_xrc_srqn(struct ibv_qp_ex *qp, uint32_t srqn) { ibv_wr_set_xrc_srqn(qp, srqn); }

/* ---- the extended-CQ poll family (dispatch through ibv_cq_ex) ----------------------- */

int hv_c_start_poll(struct ibv_cq_ex *cq, struct ibv_poll_cq_attr *attr)
{
	return ibv_start_poll(cq, attr);
}

int hv_c_next_poll(struct ibv_cq_ex *cq) { return ibv_next_poll(cq); }
void hv_c_end_poll(struct ibv_cq_ex *cq) { ibv_end_poll(cq); }
enum ibv_wc_opcode hv_c_wc_read_opcode(struct ibv_cq_ex *cq) { return ibv_wc_read_opcode(cq); }
uint32_t hv_c_wc_read_vendor_err(struct ibv_cq_ex *cq) { return ibv_wc_read_vendor_err(cq); }
uint32_t hv_c_wc_read_byte_len(struct ibv_cq_ex *cq) { return ibv_wc_read_byte_len(cq); }
__be32 hv_c_wc_read_imm_data(struct ibv_cq_ex *cq) { return ibv_wc_read_imm_data(cq); }

uint32_t hv_c_wc_read_invalidated_rkey(struct ibv_cq_ex *cq)
{
	return ibv_wc_read_invalidated_rkey(cq);
}

uint32_t hv_c_wc_read_qp_num(struct ibv_cq_ex *cq) { return ibv_wc_read_qp_num(cq); }
uint32_t hv_c_wc_read_src_qp(struct ibv_cq_ex *cq) { return ibv_wc_read_src_qp(cq); }
unsigned int hv_c_wc_read_wc_flags(struct ibv_cq_ex *cq) { return ibv_wc_read_wc_flags(cq); }
uint32_t hv_c_wc_read_slid(struct ibv_cq_ex *cq) { return ibv_wc_read_slid(cq); }
uint8_t hv_c_wc_read_sl(struct ibv_cq_ex *cq) { return ibv_wc_read_sl(cq); }
uint64_t hv_c_wc_read_completion_ts(struct ibv_cq_ex *cq) { return ibv_wc_read_completion_ts(cq); }
struct ibv_cq *hv_c_cq_ex_to_cq(struct ibv_cq_ex *cq) { return ibv_cq_ex_to_cq(cq); }
uint8_t hv_c_wc_read_dlid_path_bits(struct ibv_cq_ex *cq) { return ibv_wc_read_dlid_path_bits(cq); }
uint64_t hv_c_wc_read_completion_wallclock_ns(struct ibv_cq_ex *cq)
{
	return ibv_wc_read_completion_wallclock_ns(cq);
}
uint16_t hv_c_wc_read_cvlan(struct ibv_cq_ex *cq) { return ibv_wc_read_cvlan(cq); }
uint32_t hv_c_wc_read_flow_tag(struct ibv_cq_ex *cq) { return ibv_wc_read_flow_tag(cq); }
void hv_c_wc_read_tm_info(struct ibv_cq_ex *cq, struct ibv_wc_tm_info *tm_info)
{
	ibv_wc_read_tm_info(cq, tm_info);
}

/* ---- setup-side inlines (verbs_context logic, fallbacks to exported symbols) -------- */

struct verbs_context *hv_c_verbs_get_ctx(struct ibv_context *ctx) { return verbs_get_ctx(ctx); }

int hv_c_query_port(struct ibv_context *ctx, uint8_t port_num, struct ibv_port_attr *attr)
{
	/* the macro: ___ibv_query_port */
	return ibv_query_port(ctx, port_num, attr);
}

int hv_c_query_device_ex(struct ibv_context *ctx, const struct ibv_query_device_ex_input *input,
			 struct ibv_device_attr_ex *attr)
{
	return ibv_query_device_ex(ctx, input, attr);
}

struct ibv_qp *hv_c_create_qp_ex(struct ibv_context *ctx, struct ibv_qp_init_attr_ex *attr)
{
	return ibv_create_qp_ex(ctx, attr);
}

struct ibv_srq *hv_c_create_srq_ex(struct ibv_context *ctx, struct ibv_srq_init_attr_ex *attr)
{
	return ibv_create_srq_ex(ctx, attr);
}

struct ibv_cq_ex *hv_c_create_cq_ex(struct ibv_context *ctx, struct ibv_cq_init_attr_ex *attr)
{
	return ibv_create_cq_ex(ctx, attr);
}

int hv_c_query_gid_ex(struct ibv_context *ctx, uint32_t port_num, uint32_t gid_index,
		      struct ibv_gid_entry *entry, uint32_t flags)
{
	return ibv_query_gid_ex(ctx, port_num, gid_index, entry, flags);
}

ssize_t hv_c_query_gid_table(struct ibv_context *ctx, struct ibv_gid_entry *entries,
			     size_t max_entries, uint32_t flags)
{
	return ibv_query_gid_table(ctx, entries, max_entries, flags);
}

struct ibv_td *hv_c_alloc_td(struct ibv_context *ctx, struct ibv_td_init_attr *attr)
{
	return ibv_alloc_td(ctx, attr);
}

int hv_c_dealloc_td(struct ibv_td *td) { return ibv_dealloc_td(td); }

struct ibv_pd *hv_c_alloc_parent_domain(struct ibv_context *ctx,
					struct ibv_parent_domain_init_attr *attr)
{
	return ibv_alloc_parent_domain(ctx, attr);
}

int hv_c_query_rt_values_ex(struct ibv_context *ctx, struct ibv_values_ex *values)
{
	return ibv_query_rt_values_ex(ctx, values);
}

/* The header's own values, for the Rust side to check its constants against. */
void *hv_c_abi_is_extended(void) { return __VERBS_ABI_IS_EXTENDED; }

/* ---- layout as this C compiler sees the installed header -------------------------- */

struct hv_layout {
	const char *name;
	size_t value;
};

static const struct hv_layout hv_layout_table[] = {
	{"sizeof mlx5_wqe_ctrl_seg", sizeof(struct mlx5_wqe_ctrl_seg)},
	{"mlx5_wqe_ctrl_seg.qpn_ds", offsetof(struct mlx5_wqe_ctrl_seg, qpn_ds)},
	{"mlx5_wqe_ctrl_seg.fm_ce_se", offsetof(struct mlx5_wqe_ctrl_seg, fm_ce_se)},
	{"mlx5_wqe_ctrl_seg.imm", offsetof(struct mlx5_wqe_ctrl_seg, imm)},
	{"sizeof mlx5_wqe_raddr_seg", sizeof(struct mlx5_wqe_raddr_seg)},
	{"mlx5_wqe_raddr_seg.rkey", offsetof(struct mlx5_wqe_raddr_seg, rkey)},
	{"sizeof mlx5_wqe_atomic_seg", sizeof(struct mlx5_wqe_atomic_seg)},
	{"mlx5_wqe_atomic_seg.compare", offsetof(struct mlx5_wqe_atomic_seg, compare)},
	{"sizeof mlx5_wqe_data_seg", sizeof(struct mlx5_wqe_data_seg)},
	{"mlx5_wqe_data_seg.lkey", offsetof(struct mlx5_wqe_data_seg, lkey)},
	{"mlx5_wqe_data_seg.addr", offsetof(struct mlx5_wqe_data_seg, addr)},
	{"sizeof mlx5_wqe_av", sizeof(struct mlx5_wqe_av)},
	{"mlx5_wqe_av.dqp_dct", offsetof(struct mlx5_wqe_av, dqp_dct)},
	{"sizeof mlx5_wqe_datagram_seg", sizeof(struct mlx5_wqe_datagram_seg)},
	{"sizeof mlx5_cqe64", sizeof(struct mlx5_cqe64)},
	{"mlx5_cqe64.byte_cnt", offsetof(struct mlx5_cqe64, byte_cnt)},
	{"mlx5_cqe64.sop_drop_qpn", offsetof(struct mlx5_cqe64, sop_drop_qpn)},
	{"mlx5_cqe64.wqe_counter", offsetof(struct mlx5_cqe64, wqe_counter)},
	{"mlx5_cqe64.op_own", offsetof(struct mlx5_cqe64, op_own)},
	{"sizeof mlx5_err_cqe", sizeof(struct mlx5_err_cqe)},
	{"mlx5_err_cqe.vendor_err_synd", offsetof(struct mlx5_err_cqe, vendor_err_synd)},
	{"mlx5_err_cqe.syndrome", offsetof(struct mlx5_err_cqe, syndrome)},
	{"sizeof mlx5dv_qp", sizeof(struct mlx5dv_qp)},
	{"mlx5dv_qp.sq", offsetof(struct mlx5dv_qp, sq)},
	{"mlx5dv_qp.bf", offsetof(struct mlx5dv_qp, bf)},
	{"mlx5dv_qp.comp_mask", offsetof(struct mlx5dv_qp, comp_mask)},
	{"mlx5dv_qp.sqn", offsetof(struct mlx5dv_qp, sqn)},
	{"sizeof mlx5dv_cq", sizeof(struct mlx5dv_cq)},
	{"mlx5dv_cq.cqe_cnt", offsetof(struct mlx5dv_cq, cqe_cnt)},
	{"mlx5dv_cq.cqn", offsetof(struct mlx5dv_cq, cqn)},
	{"sizeof mlx5dv_ah", sizeof(struct mlx5dv_ah)},
	{"sizeof mlx5dv_obj", sizeof(struct mlx5dv_obj)},
	{"mlx5dv_obj.cq", offsetof(struct mlx5dv_obj, cq)},
	{"mlx5dv_obj.ah", offsetof(struct mlx5dv_obj, ah)},
	{"sizeof ibv_sge", sizeof(struct ibv_sge)},
	{"alignof ibv_sge", _Alignof(struct ibv_sge)},
	{"ibv_sge.addr", offsetof(struct ibv_sge, addr)},
	{"ibv_sge.length", offsetof(struct ibv_sge, length)},
	{"ibv_sge.lkey", offsetof(struct ibv_sge, lkey)},
	{"sizeof ibv_send_wr", sizeof(struct ibv_send_wr)},
	{"alignof ibv_send_wr", _Alignof(struct ibv_send_wr)},
	{"ibv_send_wr.wr_id", offsetof(struct ibv_send_wr, wr_id)},
	{"ibv_send_wr.next", offsetof(struct ibv_send_wr, next)},
	{"ibv_send_wr.sg_list", offsetof(struct ibv_send_wr, sg_list)},
	{"ibv_send_wr.num_sge", offsetof(struct ibv_send_wr, num_sge)},
	{"ibv_send_wr.opcode", offsetof(struct ibv_send_wr, opcode)},
	{"ibv_send_wr.send_flags", offsetof(struct ibv_send_wr, send_flags)},
	{"ibv_send_wr.imm_data", offsetof(struct ibv_send_wr, imm_data)},
	{"ibv_send_wr.wr", offsetof(struct ibv_send_wr, wr)},
	{"ibv_send_wr.wr.rdma.remote_addr", offsetof(struct ibv_send_wr, wr.rdma.remote_addr)},
	{"ibv_send_wr.wr.rdma.rkey", offsetof(struct ibv_send_wr, wr.rdma.rkey)},
	{"ibv_send_wr.wr.atomic.remote_addr", offsetof(struct ibv_send_wr, wr.atomic.remote_addr)},
	{"ibv_send_wr.wr.atomic.compare_add", offsetof(struct ibv_send_wr, wr.atomic.compare_add)},
	{"ibv_send_wr.wr.atomic.swap", offsetof(struct ibv_send_wr, wr.atomic.swap)},
	{"ibv_send_wr.wr.atomic.rkey", offsetof(struct ibv_send_wr, wr.atomic.rkey)},
	{"ibv_send_wr.wr.ud.ah", offsetof(struct ibv_send_wr, wr.ud.ah)},
	{"ibv_send_wr.wr.ud.remote_qpn", offsetof(struct ibv_send_wr, wr.ud.remote_qpn)},
	{"ibv_send_wr.wr.ud.remote_qkey", offsetof(struct ibv_send_wr, wr.ud.remote_qkey)},
	{"sizeof ibv_recv_wr", sizeof(struct ibv_recv_wr)},
	{"alignof ibv_recv_wr", _Alignof(struct ibv_recv_wr)},
	{"ibv_recv_wr.wr_id", offsetof(struct ibv_recv_wr, wr_id)},
	{"ibv_recv_wr.next", offsetof(struct ibv_recv_wr, next)},
	{"ibv_recv_wr.sg_list", offsetof(struct ibv_recv_wr, sg_list)},
	{"ibv_recv_wr.num_sge", offsetof(struct ibv_recv_wr, num_sge)},
	{"sizeof ibv_wc", sizeof(struct ibv_wc)},
	{"alignof ibv_wc", _Alignof(struct ibv_wc)},
	{"ibv_wc.wr_id", offsetof(struct ibv_wc, wr_id)},
	{"ibv_wc.status", offsetof(struct ibv_wc, status)},
	{"ibv_wc.opcode", offsetof(struct ibv_wc, opcode)},
	{"ibv_wc.vendor_err", offsetof(struct ibv_wc, vendor_err)},
	{"ibv_wc.byte_len", offsetof(struct ibv_wc, byte_len)},
	{"ibv_wc.imm_data", offsetof(struct ibv_wc, imm_data)},
	{"ibv_wc.qp_num", offsetof(struct ibv_wc, qp_num)},
	{"ibv_wc.src_qp", offsetof(struct ibv_wc, src_qp)},
	{"ibv_wc.wc_flags", offsetof(struct ibv_wc, wc_flags)},
	{"ibv_wc.pkey_index", offsetof(struct ibv_wc, pkey_index)},
	{"ibv_wc.slid", offsetof(struct ibv_wc, slid)},
	{"ibv_wc.sl", offsetof(struct ibv_wc, sl)},
	{"ibv_wc.dlid_path_bits", offsetof(struct ibv_wc, dlid_path_bits)},
	{"sizeof ibv_context", sizeof(struct ibv_context)},
	{"alignof ibv_context", _Alignof(struct ibv_context)},
	{"ibv_context.device", offsetof(struct ibv_context, device)},
	{"ibv_context.ops", offsetof(struct ibv_context, ops)},
	{"ibv_context.cmd_fd", offsetof(struct ibv_context, cmd_fd)},
	{"ibv_context.async_fd", offsetof(struct ibv_context, async_fd)},
	{"ibv_context.num_comp_vectors", offsetof(struct ibv_context, num_comp_vectors)},
	{"ibv_context.abi_compat", offsetof(struct ibv_context, abi_compat)},
	{"sizeof ibv_context_ops", sizeof(struct ibv_context_ops)},
	{"alignof ibv_context_ops", _Alignof(struct ibv_context_ops)},
	{"ibv_context_ops.poll_cq", offsetof(struct ibv_context_ops, poll_cq)},
	{"ibv_context_ops.req_notify_cq", offsetof(struct ibv_context_ops, req_notify_cq)},
	{"ibv_context_ops.post_srq_recv", offsetof(struct ibv_context_ops, post_srq_recv)},
	{"ibv_context_ops.post_send", offsetof(struct ibv_context_ops, post_send)},
	{"ibv_context_ops.post_recv", offsetof(struct ibv_context_ops, post_recv)},
	{"sizeof verbs_context", sizeof(struct verbs_context)},
	{"alignof verbs_context", _Alignof(struct verbs_context)},
	{"verbs_context.query_port", offsetof(struct verbs_context, query_port)},
	{"verbs_context.create_cq_ex", offsetof(struct verbs_context, create_cq_ex)},
	{"verbs_context.alloc_td", offsetof(struct verbs_context, alloc_td)},
	{"verbs_context.dealloc_td", offsetof(struct verbs_context, dealloc_td)},
	{"verbs_context.alloc_parent_domain", offsetof(struct verbs_context, alloc_parent_domain)},
	{"verbs_context.query_rt_values", offsetof(struct verbs_context, query_rt_values)},
	{"verbs_context.query_device_ex", offsetof(struct verbs_context, query_device_ex)},
	{"verbs_context.create_qp_ex", offsetof(struct verbs_context, create_qp_ex)},
	{"verbs_context.create_srq_ex", offsetof(struct verbs_context, create_srq_ex)},
	{"verbs_context.sz", offsetof(struct verbs_context, sz)},
	{"verbs_context.context", offsetof(struct verbs_context, context)},
	{"sizeof ibv_qp", sizeof(struct ibv_qp)},
	{"alignof ibv_qp", _Alignof(struct ibv_qp)},
	{"ibv_qp.context", offsetof(struct ibv_qp, context)},
	{"ibv_qp.qp_context", offsetof(struct ibv_qp, qp_context)},
	{"ibv_qp.pd", offsetof(struct ibv_qp, pd)},
	{"ibv_qp.send_cq", offsetof(struct ibv_qp, send_cq)},
	{"ibv_qp.recv_cq", offsetof(struct ibv_qp, recv_cq)},
	{"ibv_qp.srq", offsetof(struct ibv_qp, srq)},
	{"ibv_qp.handle", offsetof(struct ibv_qp, handle)},
	{"ibv_qp.qp_num", offsetof(struct ibv_qp, qp_num)},
	{"ibv_qp.state", offsetof(struct ibv_qp, state)},
	{"ibv_qp.qp_type", offsetof(struct ibv_qp, qp_type)},
	{"ibv_qp.events_completed", offsetof(struct ibv_qp, events_completed)},
	{"sizeof ibv_qp_ex", sizeof(struct ibv_qp_ex)},
	{"alignof ibv_qp_ex", _Alignof(struct ibv_qp_ex)},
	{"ibv_qp_ex.qp_base", offsetof(struct ibv_qp_ex, qp_base)},
	{"ibv_qp_ex.comp_mask", offsetof(struct ibv_qp_ex, comp_mask)},
	{"ibv_qp_ex.wr_id", offsetof(struct ibv_qp_ex, wr_id)},
	{"ibv_qp_ex.wr_flags", offsetof(struct ibv_qp_ex, wr_flags)},
	{"ibv_qp_ex.wr_atomic_cmp_swp", offsetof(struct ibv_qp_ex, wr_atomic_cmp_swp)},
	{"ibv_qp_ex.wr_atomic_fetch_add", offsetof(struct ibv_qp_ex, wr_atomic_fetch_add)},
	{"ibv_qp_ex.wr_bind_mw", offsetof(struct ibv_qp_ex, wr_bind_mw)},
	{"ibv_qp_ex.wr_local_inv", offsetof(struct ibv_qp_ex, wr_local_inv)},
	{"ibv_qp_ex.wr_rdma_read", offsetof(struct ibv_qp_ex, wr_rdma_read)},
	{"ibv_qp_ex.wr_rdma_write", offsetof(struct ibv_qp_ex, wr_rdma_write)},
	{"ibv_qp_ex.wr_rdma_write_imm", offsetof(struct ibv_qp_ex, wr_rdma_write_imm)},
	{"ibv_qp_ex.wr_send", offsetof(struct ibv_qp_ex, wr_send)},
	{"ibv_qp_ex.wr_send_imm", offsetof(struct ibv_qp_ex, wr_send_imm)},
	{"ibv_qp_ex.wr_send_inv", offsetof(struct ibv_qp_ex, wr_send_inv)},
	{"ibv_qp_ex.wr_send_tso", offsetof(struct ibv_qp_ex, wr_send_tso)},
	{"ibv_qp_ex.wr_set_ud_addr", offsetof(struct ibv_qp_ex, wr_set_ud_addr)},
	{"ibv_qp_ex.wr_set_xrc_srqn", offsetof(struct ibv_qp_ex, wr_set_xrc_srqn)},
	{"ibv_qp_ex.wr_set_inline_data", offsetof(struct ibv_qp_ex, wr_set_inline_data)},
	{"ibv_qp_ex.wr_set_inline_data_list", offsetof(struct ibv_qp_ex, wr_set_inline_data_list)},
	{"ibv_qp_ex.wr_set_sge", offsetof(struct ibv_qp_ex, wr_set_sge)},
	{"ibv_qp_ex.wr_set_sge_list", offsetof(struct ibv_qp_ex, wr_set_sge_list)},
	{"ibv_qp_ex.wr_start", offsetof(struct ibv_qp_ex, wr_start)},
	{"ibv_qp_ex.wr_complete", offsetof(struct ibv_qp_ex, wr_complete)},
	{"ibv_qp_ex.wr_abort", offsetof(struct ibv_qp_ex, wr_abort)},
	{"ibv_qp_ex.wr_atomic_write", offsetof(struct ibv_qp_ex, wr_atomic_write)},
	{"sizeof ibv_cq", sizeof(struct ibv_cq)},
	{"alignof ibv_cq", _Alignof(struct ibv_cq)},
	{"ibv_cq.context", offsetof(struct ibv_cq, context)},
	{"ibv_cq.channel", offsetof(struct ibv_cq, channel)},
	{"ibv_cq.cq_context", offsetof(struct ibv_cq, cq_context)},
	{"ibv_cq.handle", offsetof(struct ibv_cq, handle)},
	{"ibv_cq.cqe", offsetof(struct ibv_cq, cqe)},
	{"ibv_cq.comp_events_completed", offsetof(struct ibv_cq, comp_events_completed)},
	{"ibv_cq.async_events_completed", offsetof(struct ibv_cq, async_events_completed)},
	{"sizeof ibv_cq_ex", sizeof(struct ibv_cq_ex)},
	{"alignof ibv_cq_ex", _Alignof(struct ibv_cq_ex)},
	{"ibv_cq_ex.context", offsetof(struct ibv_cq_ex, context)},
	{"ibv_cq_ex.cqe", offsetof(struct ibv_cq_ex, cqe)},
	{"ibv_cq_ex.comp_mask", offsetof(struct ibv_cq_ex, comp_mask)},
	{"ibv_cq_ex.status", offsetof(struct ibv_cq_ex, status)},
	{"ibv_cq_ex.wr_id", offsetof(struct ibv_cq_ex, wr_id)},
	{"ibv_cq_ex.start_poll", offsetof(struct ibv_cq_ex, start_poll)},
	{"ibv_cq_ex.next_poll", offsetof(struct ibv_cq_ex, next_poll)},
	{"ibv_cq_ex.end_poll", offsetof(struct ibv_cq_ex, end_poll)},
	{"ibv_cq_ex.read_opcode", offsetof(struct ibv_cq_ex, read_opcode)},
	{"ibv_cq_ex.read_vendor_err", offsetof(struct ibv_cq_ex, read_vendor_err)},
	{"ibv_cq_ex.read_byte_len", offsetof(struct ibv_cq_ex, read_byte_len)},
	{"ibv_cq_ex.read_imm_data", offsetof(struct ibv_cq_ex, read_imm_data)},
	{"ibv_cq_ex.read_qp_num", offsetof(struct ibv_cq_ex, read_qp_num)},
	{"ibv_cq_ex.read_src_qp", offsetof(struct ibv_cq_ex, read_src_qp)},
	{"ibv_cq_ex.read_wc_flags", offsetof(struct ibv_cq_ex, read_wc_flags)},
	{"ibv_cq_ex.read_slid", offsetof(struct ibv_cq_ex, read_slid)},
	{"ibv_cq_ex.read_sl", offsetof(struct ibv_cq_ex, read_sl)},
	{"ibv_cq_ex.read_dlid_path_bits", offsetof(struct ibv_cq_ex, read_dlid_path_bits)},
	{"ibv_cq_ex.read_completion_ts", offsetof(struct ibv_cq_ex, read_completion_ts)},
	{"ibv_cq_ex.read_cvlan", offsetof(struct ibv_cq_ex, read_cvlan)},
	{"ibv_cq_ex.read_flow_tag", offsetof(struct ibv_cq_ex, read_flow_tag)},
	{"ibv_cq_ex.read_tm_info", offsetof(struct ibv_cq_ex, read_tm_info)},
	{"ibv_cq_ex.read_completion_wallclock_ns", offsetof(struct ibv_cq_ex, read_completion_wallclock_ns)},
	{"sizeof ibv_srq", sizeof(struct ibv_srq)},
	{"alignof ibv_srq", _Alignof(struct ibv_srq)},
	{"ibv_srq.context", offsetof(struct ibv_srq, context)},
	{"ibv_srq.srq_context", offsetof(struct ibv_srq, srq_context)},
	{"ibv_srq.pd", offsetof(struct ibv_srq, pd)},
	{"ibv_srq.handle", offsetof(struct ibv_srq, handle)},
	{"ibv_srq.events_completed", offsetof(struct ibv_srq, events_completed)},
	{"sizeof ibv_port_attr", sizeof(struct ibv_port_attr)},
	{"alignof ibv_port_attr", _Alignof(struct ibv_port_attr)},
	{"ibv_port_attr.state", offsetof(struct ibv_port_attr, state)},
	{"ibv_port_attr.max_mtu", offsetof(struct ibv_port_attr, max_mtu)},
	{"ibv_port_attr.active_mtu", offsetof(struct ibv_port_attr, active_mtu)},
	{"ibv_port_attr.gid_tbl_len", offsetof(struct ibv_port_attr, gid_tbl_len)},
	{"ibv_port_attr.port_cap_flags", offsetof(struct ibv_port_attr, port_cap_flags)},
	{"ibv_port_attr.lid", offsetof(struct ibv_port_attr, lid)},
	{"ibv_port_attr.sm_lid", offsetof(struct ibv_port_attr, sm_lid)},
	{"ibv_port_attr.link_layer", offsetof(struct ibv_port_attr, link_layer)},
	{"ibv_port_attr.flags", offsetof(struct ibv_port_attr, flags)},
	{"ibv_port_attr.port_cap_flags2", offsetof(struct ibv_port_attr, port_cap_flags2)},
	{"ibv_port_attr.active_speed", offsetof(struct ibv_port_attr, active_speed)},
	{"sizeof ibv_device_attr", sizeof(struct ibv_device_attr)},
	{"alignof ibv_device_attr", _Alignof(struct ibv_device_attr)},
	{"ibv_device_attr.max_qp", offsetof(struct ibv_device_attr, max_qp)},
	{"ibv_device_attr.max_sge", offsetof(struct ibv_device_attr, max_sge)},
	{"sizeof ibv_device_attr_ex", sizeof(struct ibv_device_attr_ex)},
	{"alignof ibv_device_attr_ex", _Alignof(struct ibv_device_attr_ex)},
	{"ibv_device_attr_ex.orig_attr", offsetof(struct ibv_device_attr_ex, orig_attr)},
	{"ibv_device_attr_ex.comp_mask", offsetof(struct ibv_device_attr_ex, comp_mask)},
	{"ibv_device_attr_ex.max_dm_size", offsetof(struct ibv_device_attr_ex, max_dm_size)},
	{"sizeof ibv_query_device_ex_input", sizeof(struct ibv_query_device_ex_input)},
	{"alignof ibv_query_device_ex_input", _Alignof(struct ibv_query_device_ex_input)},
	{"ibv_query_device_ex_input.comp_mask", offsetof(struct ibv_query_device_ex_input, comp_mask)},
	{"sizeof ibv_qp_init_attr", sizeof(struct ibv_qp_init_attr)},
	{"alignof ibv_qp_init_attr", _Alignof(struct ibv_qp_init_attr)},
	{"ibv_qp_init_attr.qp_context", offsetof(struct ibv_qp_init_attr, qp_context)},
	{"ibv_qp_init_attr.send_cq", offsetof(struct ibv_qp_init_attr, send_cq)},
	{"ibv_qp_init_attr.recv_cq", offsetof(struct ibv_qp_init_attr, recv_cq)},
	{"ibv_qp_init_attr.srq", offsetof(struct ibv_qp_init_attr, srq)},
	{"ibv_qp_init_attr.cap", offsetof(struct ibv_qp_init_attr, cap)},
	{"ibv_qp_init_attr.qp_type", offsetof(struct ibv_qp_init_attr, qp_type)},
	{"ibv_qp_init_attr.sq_sig_all", offsetof(struct ibv_qp_init_attr, sq_sig_all)},
	{"sizeof ibv_qp_init_attr_ex", sizeof(struct ibv_qp_init_attr_ex)},
	{"alignof ibv_qp_init_attr_ex", _Alignof(struct ibv_qp_init_attr_ex)},
	{"ibv_qp_init_attr_ex.qp_context", offsetof(struct ibv_qp_init_attr_ex, qp_context)},
	{"ibv_qp_init_attr_ex.send_cq", offsetof(struct ibv_qp_init_attr_ex, send_cq)},
	{"ibv_qp_init_attr_ex.recv_cq", offsetof(struct ibv_qp_init_attr_ex, recv_cq)},
	{"ibv_qp_init_attr_ex.srq", offsetof(struct ibv_qp_init_attr_ex, srq)},
	{"ibv_qp_init_attr_ex.cap", offsetof(struct ibv_qp_init_attr_ex, cap)},
	{"ibv_qp_init_attr_ex.qp_type", offsetof(struct ibv_qp_init_attr_ex, qp_type)},
	{"ibv_qp_init_attr_ex.sq_sig_all", offsetof(struct ibv_qp_init_attr_ex, sq_sig_all)},
	{"ibv_qp_init_attr_ex.comp_mask", offsetof(struct ibv_qp_init_attr_ex, comp_mask)},
	{"ibv_qp_init_attr_ex.pd", offsetof(struct ibv_qp_init_attr_ex, pd)},
	{"ibv_qp_init_attr_ex.send_ops_flags", offsetof(struct ibv_qp_init_attr_ex, send_ops_flags)},
	{"sizeof ibv_srq_init_attr", sizeof(struct ibv_srq_init_attr)},
	{"alignof ibv_srq_init_attr", _Alignof(struct ibv_srq_init_attr)},
	{"ibv_srq_init_attr.srq_context", offsetof(struct ibv_srq_init_attr, srq_context)},
	{"ibv_srq_init_attr.attr", offsetof(struct ibv_srq_init_attr, attr)},
	{"sizeof ibv_srq_init_attr_ex", sizeof(struct ibv_srq_init_attr_ex)},
	{"alignof ibv_srq_init_attr_ex", _Alignof(struct ibv_srq_init_attr_ex)},
	{"ibv_srq_init_attr_ex.srq_context", offsetof(struct ibv_srq_init_attr_ex, srq_context)},
	{"ibv_srq_init_attr_ex.attr", offsetof(struct ibv_srq_init_attr_ex, attr)},
	{"ibv_srq_init_attr_ex.comp_mask", offsetof(struct ibv_srq_init_attr_ex, comp_mask)},
	{"ibv_srq_init_attr_ex.srq_type", offsetof(struct ibv_srq_init_attr_ex, srq_type)},
	{"ibv_srq_init_attr_ex.pd", offsetof(struct ibv_srq_init_attr_ex, pd)},
	{"ibv_srq_init_attr_ex.xrcd", offsetof(struct ibv_srq_init_attr_ex, xrcd)},
	{"ibv_srq_init_attr_ex.cq", offsetof(struct ibv_srq_init_attr_ex, cq)},
	{"sizeof ibv_cq_init_attr_ex", sizeof(struct ibv_cq_init_attr_ex)},
	{"alignof ibv_cq_init_attr_ex", _Alignof(struct ibv_cq_init_attr_ex)},
	{"ibv_cq_init_attr_ex.cqe", offsetof(struct ibv_cq_init_attr_ex, cqe)},
	{"ibv_cq_init_attr_ex.cq_context", offsetof(struct ibv_cq_init_attr_ex, cq_context)},
	{"ibv_cq_init_attr_ex.channel", offsetof(struct ibv_cq_init_attr_ex, channel)},
	{"ibv_cq_init_attr_ex.comp_vector", offsetof(struct ibv_cq_init_attr_ex, comp_vector)},
	{"ibv_cq_init_attr_ex.wc_flags", offsetof(struct ibv_cq_init_attr_ex, wc_flags)},
	{"ibv_cq_init_attr_ex.comp_mask", offsetof(struct ibv_cq_init_attr_ex, comp_mask)},
	{"ibv_cq_init_attr_ex.flags", offsetof(struct ibv_cq_init_attr_ex, flags)},
	{"sizeof ibv_gid_entry", sizeof(struct ibv_gid_entry)},
	{"alignof ibv_gid_entry", _Alignof(struct ibv_gid_entry)},
	{"ibv_gid_entry.gid", offsetof(struct ibv_gid_entry, gid)},
	{"ibv_gid_entry.gid_index", offsetof(struct ibv_gid_entry, gid_index)},
	{"ibv_gid_entry.port_num", offsetof(struct ibv_gid_entry, port_num)},
	{"ibv_gid_entry.gid_type", offsetof(struct ibv_gid_entry, gid_type)},
	{"ibv_gid_entry.ndev_ifindex", offsetof(struct ibv_gid_entry, ndev_ifindex)},
	{"sizeof ibv_data_buf", sizeof(struct ibv_data_buf)},
	{"alignof ibv_data_buf", _Alignof(struct ibv_data_buf)},
	{"ibv_data_buf.addr", offsetof(struct ibv_data_buf, addr)},
	{"ibv_data_buf.length", offsetof(struct ibv_data_buf, length)},
	{"sizeof ibv_poll_cq_attr", sizeof(struct ibv_poll_cq_attr)},
	{"alignof ibv_poll_cq_attr", _Alignof(struct ibv_poll_cq_attr)},
	{"ibv_poll_cq_attr.comp_mask", offsetof(struct ibv_poll_cq_attr, comp_mask)},
	{"sizeof ibv_mw_bind_info", sizeof(struct ibv_mw_bind_info)},
	{"alignof ibv_mw_bind_info", _Alignof(struct ibv_mw_bind_info)},
	{"ibv_mw_bind_info.mr", offsetof(struct ibv_mw_bind_info, mr)},
	{"ibv_mw_bind_info.addr", offsetof(struct ibv_mw_bind_info, addr)},
	{"ibv_mw_bind_info.length", offsetof(struct ibv_mw_bind_info, length)},
	{"ibv_mw_bind_info.mw_access_flags", offsetof(struct ibv_mw_bind_info, mw_access_flags)},
};

const struct hv_layout *hv_c_layout(size_t *len)
{
	*len = sizeof(hv_layout_table) / sizeof(hv_layout_table[0]);
	return hv_layout_table;
}

/* ---- recording stand-ins for the exported symbols ----------------------------------- */

/* From here on ibv_query_port names the exported function, not the header's macro. */
#undef ibv_query_port

typedef int (*hv_query_port_fn)(struct ibv_context *, uint8_t, struct _compat_ibv_port_attr *);
typedef int (*hv_query_device_fn)(struct ibv_context *, struct ibv_device_attr *);
typedef struct ibv_qp *(*hv_create_qp_fn)(struct ibv_pd *, struct ibv_qp_init_attr *);
typedef struct ibv_srq *(*hv_create_srq_fn)(struct ibv_pd *, struct ibv_srq_init_attr *);

/* Set once (before any call) by the Rust side; read-only afterwards. */
static hv_query_port_fn hook_query_port;
static hv_query_device_fn hook_query_device;
static hv_create_qp_fn hook_create_qp;
static hv_create_srq_fn hook_create_srq;

void hv_c_set_export_hooks(hv_query_port_fn query_port, hv_query_device_fn query_device,
			   hv_create_qp_fn create_qp, hv_create_srq_fn create_srq)
{
	hook_query_port = query_port;
	hook_query_device = query_device;
	hook_create_qp = create_qp;
	hook_create_srq = create_srq;
}

typedef int (*hv_query_gid_ex_fn)(struct ibv_context *, uint32_t, uint32_t,
				  struct ibv_gid_entry *, uint32_t, size_t);
typedef ssize_t (*hv_query_gid_table_fn)(struct ibv_context *, struct ibv_gid_entry *, size_t,
					 uint32_t, size_t);

static hv_query_gid_ex_fn hook_query_gid_ex;
static hv_query_gid_table_fn hook_query_gid_table;

void hv_c_set_gid_hooks(hv_query_gid_ex_fn query_gid_ex, hv_query_gid_table_fn query_gid_table)
{
	hook_query_gid_ex = query_gid_ex;
	hook_query_gid_table = query_gid_table;
}

int _ibv_query_gid_ex(struct ibv_context *context, uint32_t port_num, uint32_t gid_index,
		      struct ibv_gid_entry *entry, uint32_t flags, size_t entry_size)
{
	return hook_query_gid_ex(context, port_num, gid_index, entry, flags, entry_size);
}

ssize_t _ibv_query_gid_table(struct ibv_context *context, struct ibv_gid_entry *entries,
			     size_t max_entries, uint32_t flags, size_t entry_size)
{
	return hook_query_gid_table(context, entries, max_entries, flags, entry_size);
}

int ibv_query_port(struct ibv_context *context, uint8_t port_num,
		   struct _compat_ibv_port_attr *port_attr)
{
	return hook_query_port(context, port_num, port_attr);
}

int ibv_query_device(struct ibv_context *context, struct ibv_device_attr *device_attr)
{
	return hook_query_device(context, device_attr);
}

struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *qp_init_attr)
{
	return hook_create_qp(pd, qp_init_attr);
}

struct ibv_srq *ibv_create_srq(struct ibv_pd *pd, struct ibv_srq_init_attr *srq_init_attr)
{
	return hook_create_srq(pd, srq_init_attr);
}
