/*
 * hotverbs-ffi-equiv: the C side of the equivalence proof.
 *
 * Every hv_c_* function below is a non-inline wrapper whose body is one call of a static
 * inline (or macro) of the system's <infiniband/verbs.h>, compiled by the system compiler,
 * so the Rust tests can run the header's own code and verbs-ffi's Rust re-expression of it
 * against the same recording provider and compare what each did.
 *
 * The setup-side inlines fall back to exported libibverbs symbols (ibv_query_port,
 * ibv_query_device, ibv_create_qp, ibv_create_srq). libibverbs is NOT linked: this file
 * defines those symbols itself, each forwarding to a hook the Rust test installs (a
 * recording function), so both the C and the Rust paths land in the same log.
 */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <infiniband/verbs.h>

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

/* The header's own values, for the Rust side to check its constants against. */
void *hv_c_abi_is_extended(void) { return __VERBS_ABI_IS_EXTENDED; }

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
