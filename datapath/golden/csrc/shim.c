/* The golden model's C side: fake mlx5 QP / CQ / BlueFlame objects in plain memory, driven
 * through rdma-core's own providers/mlx5 qp.c and cq.c (compiled from the source the
 * ibverbs-sys crate vendors, at test time only). The Rust side (src/lib.rs) wraps this.
 *
 * Based on the project's mlx5-golden spike (../shared/mlx5-golden/harness/main.c, env_init):
 * the fields a fake QP / CQ needs are set by hand, everything else is rdma-core's code.
 *
 * Built twice by build.rs: once against rdma-core's util/mmio.h and util/udma_barrier.h
 * patched to call hv_mmio_hook / hv_barrier_hook (the comparison tests record every UAR
 * store and barrier), once unpatched (the instruction counts measure libmlx5 as it ships). */
#include <config.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <endian.h>
#include "mlx5.h"
#include "wqe.h"

#define HV_LOG 8192

struct hv_store {
	int64_t off;
	uint32_t size;
	uint64_t raw;
};

struct hv_barrier {
	int32_t kind;
	uint32_t dbr; /* host order send doorbell record at the barrier */
};

struct hv_wr {
	uint64_t wr_id;
	uint32_t opcode;     /* enum ibv_wr_opcode */
	uint32_t send_flags; /* IBV_SEND_* */
	uint32_t imm_be;
	uint32_t rkey;
	uint64_t remote_addr;
	uint64_t compare_add;
	uint64_t swap;
	const struct ibv_sge *sges;
	uint32_t num_sge;
	uint32_t remote_qpn;
	uint32_t remote_qkey;
	uint32_t pad;
	struct ibv_ah *ah;
};

struct hv_env {
	struct mlx5_context *ctx;
	struct mlx5_qp *qp;
	struct mlx5_cq *cq;
	struct mlx5_bf *bf;
	uint8_t *sq, *uar, *cqbuf;
	__be32 *qpdb, *cqdb;
	unsigned wqe_cnt, ncqe;
	struct hv_store stores[HV_LOG];
	int nstores;
	struct hv_barrier barriers[HV_LOG];
	int nbarriers;
	struct mlx5_ah *ahs[64];
	int nahs;
};

/* The env the hooks record into: per thread, because the test harness runs tests on
 * several threads at once and each records its own env (a process-wide pointer let one
 * test's `hv_record` steal another's stores: "0 stores" failures under load). */
static _Thread_local struct hv_env *cur_env;

/* Called by the patched util/mmio.h before every MMIO store. */
void hv_mmio_hook(void *addr, unsigned size, uint64_t raw)
{
	struct hv_env *e = cur_env;
	if (e && e->nstores < HV_LOG)
		e->stores[e->nstores++] = (struct hv_store){ (uint8_t *)addr - e->uar, size, raw };
}

/* Called by the patched util/udma_barrier.h: 1 udma_to_device_barrier, 2 mmio_wc_start,
 * 3 mmio_flush_writes, 4 udma_from_device_barrier. */
void hv_barrier_hook(int kind)
{
	struct hv_env *e = cur_env;
	if (e && e->nbarriers < HV_LOG)
		e->barriers[e->nbarriers++] =
			(struct hv_barrier){ kind, be32toh(e->qpdb[MLX5_SND_DBR]) };
}

static void *zalloc_aligned(size_t sz, uint8_t fill)
{
	size_t n = (sz + 4095) & ~4095UL;
	void *p = aligned_alloc(4096, n ? n : 4096);
	if (!p)
		abort();
	memset(p, fill, n ? n : 4096);
	return p;
}

/* qpt: IBV_QPT_RC, IBV_QPT_UC or IBV_QPT_UD; cqe_sz: 64 or 128 (MLX5_CQE_SIZE). */
struct hv_env *hv_env_new(int qpt, unsigned wqe_cnt, unsigned max_gs, unsigned max_inline,
			  unsigned qpn, unsigned ncqe, unsigned char poison, unsigned cqe_sz)
{
	int ud = qpt == IBV_QPT_UD;
	if (qpt != IBV_QPT_RC && qpt != IBV_QPT_UC && qpt != IBV_QPT_UD)
		abort();
	if (cqe_sz != 64 && cqe_sz != 128)
		abort();
	struct hv_env *e = calloc(1, sizeof(*e));
	if (!e)
		abort();
	e->wqe_cnt = wqe_cnt;
	e->ncqe = ncqe;
	e->ctx = calloc(1, sizeof(*e->ctx));
	e->qp = calloc(1, sizeof(*e->qp));
	e->cq = calloc(1, sizeof(*e->cq));
	e->bf = calloc(1, sizeof(*e->bf));
	e->sq = zalloc_aligned((size_t)wqe_cnt * MLX5_SEND_WQE_BB, poison);
	e->uar = zalloc_aligned(4096, 0);
	e->qpdb = zalloc_aligned(64, 0);
	e->cqdb = zalloc_aligned(64, 0);

	struct mlx5_context *ctx = e->ctx;
	ctx->dbg_fp = NULL; /* error CQEs would print a dump */
	ctx->shut_up_bf = 0;
	ctx->prefer_bf = 0;
	ctx->cqe_version = 0; /* requester CQEs found by QP number */
	strcpy(ctx->hostname, "golden");

	e->bf->reg = e->uar;
	e->bf->buf_size = 256;
	e->bf->offset = 0;
	e->bf->uuarn = 1;
	e->bf->need_lock = 0;

	struct mlx5_cq *cq = e->cq;
	cq->verbs_cq.cq.context = &ctx->ibv_ctx.context;
	cq->verbs_cq.cq.cqe = ncqe - 1;
	cq->cqe_sz = cqe_sz;
	e->cqbuf = zalloc_aligned((size_t)ncqe * cqe_sz, 0);
	/* As mlx5_alloc_cq_buf: the 64-byte CQE is the last 64 bytes of each entry. */
	for (unsigned i = 0; i < ncqe; i++)
		((struct mlx5_cqe64 *)(e->cqbuf + cqe_sz * i + cqe_sz - 64))->op_own =
			MLX5_CQE_INVALID << 4;
	cq->buf_a.buf = e->cqbuf;
	cq->active_buf = &cq->buf_a;
	cq->dbrec = e->cqdb;
	cq->cqn = 0x77;

	struct mlx5_qp *qp = e->qp;
	struct ibv_qp *ibqp = &qp->verbs_qp.qp;
	qp->rsc.type = MLX5_RSC_TYPE_QP;
	qp->rsc.rsn = qpn;
	ibqp->context = &ctx->ibv_ctx.context;
	ibqp->qp_num = qpn;
	ibqp->qp_type = qpt;
	ibqp->state = IBV_QPS_RTS;
	ibqp->send_cq = ibqp->recv_cq = &cq->verbs_cq.cq;
	qp->ibv_qp = ibqp;
	qp->sq_start = e->sq;
	qp->sq.qend = e->sq + (size_t)wqe_cnt * MLX5_SEND_WQE_BB;
	qp->sq.wqe_cnt = wqe_cnt;
	qp->sq.wqe_shift = MLX5_SEND_WQE_SHIFT;
	qp->sq.max_post = wqe_cnt;
	qp->sq.max_gs = max_gs;
	qp->sq.qp_state_max_gs = max_gs; /* == max_gs in RTS */
	qp->sq.wrid = calloc(wqe_cnt, sizeof(uint64_t));
	qp->sq.wqe_head = calloc(wqe_cnt, sizeof(unsigned));
	qp->sq.wr_data = calloc(wqe_cnt, sizeof(uint32_t));
	qp->max_inline_data = max_inline;
	qp->db = e->qpdb;
	qp->bf = e->bf;
	qp->sq_signal_bits = 0;
	qp->atomics_enabled = 1;
	if (mlx5_store_qp(ctx, qpn, qp))
		abort();

	/* What a verbs context provides: ibv_post_send / ibv_poll_cq dispatch through it. */
	ctx->ibv_ctx.context.ops.post_send = mlx5_post_send;
	ctx->ibv_ctx.context.ops.poll_cq = mlx5_poll_cq;

	struct ibv_qp_init_attr_ex attr = {
		.qp_type = qpt,
		.comp_mask = IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
		.send_ops_flags = ud ? (IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM)
				  : qpt == IBV_QPT_UC
				  ? (IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM |
				     IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM)
				  : (IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE |
					IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM |
					IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_RDMA_READ |
					IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP |
					IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD),
	};
	qp->verbs_qp.comp_mask |= VERBS_QP_EX;
	if (mlx5_qp_fill_wr_pfns(qp, &attr, NULL))
		abort();
	return e;
}

struct ibv_ah *hv_new_ah(struct hv_env *e, const uint8_t *av)
{
	if (e->nahs == 64)
		abort();
	struct mlx5_ah *ah = calloc(1, sizeof(*ah));
	if (!ah)
		abort();
	memcpy(&ah->av, av, sizeof(ah->av));
	ah->ibv_ah.context = &e->ctx->ibv_ctx.context;
	e->ahs[e->nahs++] = ah;
	return &ah->ibv_ah;
}

/* The mlx5_qp as the ibv_qp libibverbs hands out, and its ibv_qp_ex. */
struct ibv_qp *hv_qp(struct hv_env *e) { return &e->qp->verbs_qp.qp; }
struct ibv_qp_ex *hv_qp_ex(struct hv_env *e) { return &e->qp->verbs_qp.qp_ex; }
struct ibv_cq *hv_cq(struct hv_env *e) { return &e->cq->verbs_cq.cq; }
uint8_t *hv_sq(struct hv_env *e) { return e->sq; }
uint8_t *hv_uar(struct hv_env *e) { return e->uar; }
uint32_t *hv_qp_dbrec(struct hv_env *e) { return (uint32_t *)e->qpdb; }
uint32_t *hv_cq_dbrec(struct hv_env *e) { return (uint32_t *)e->cqdb; }
uint8_t *hv_cq_buf(struct hv_env *e) { return e->cqbuf; }
uint64_t *hv_sq_wrid(struct hv_env *e) { return e->qp->sq.wrid; }
unsigned hv_bf_offset(struct hv_env *e) { return e->bf->offset; }
unsigned hv_cur_post(struct hv_env *e) { return e->qp->sq.cur_post; }
unsigned hv_cq_cons(struct hv_env *e) { return e->cq->cons_index; }
/* libmlx5's CQ clean for QP `qpn` (what a QP's move to RESET or its destruction runs) from
 * consumer index `cons`; `dv_owned` sets the flag mlx5dv_init_obj leaves on a CQ, with which
 * libmlx5 skips the clean. */
void hv_cq_clean(struct hv_env *e, uint32_t qpn, uint32_t cons, int dv_owned)
{
	e->cq->cons_index = cons;
	if (dv_owned)
		e->cq->flags |= MLX5_CQ_FLAGS_DV_OWNED;
	else
		e->cq->flags &= ~MLX5_CQ_FLAGS_DV_OWNED;
	__mlx5_cq_clean(e->cq, qpn, NULL);
}
/* libmlx5's mlx5_arm_cq of CQ `cqn` with its consumer index `cons` and arm sequence number `sn`; the
 * CQ UAR page is the env's register page from offset 0x800 (the doorbell at 0x820). */
void hv_arm_cq(struct hv_env *e, uint32_t cons, uint32_t sn, int solicited, uint32_t cqn)
{
	e->cq->cqn = cqn;
	e->cq->cons_index = cons;
	e->cq->arm_sn = sn;
	e->ctx->cq_uar_reg = e->uar + 0x800;
	mlx5_arm_cq(&e->cq->verbs_cq.cq, solicited);
}
/* The context's poll_cq (ibv_poll_cq dispatches through it): `f`, or mlx5_poll_cq. */
void hv_set_poll_cq(struct hv_env *e, int (*f)(struct ibv_cq *, int, struct ibv_wc *))
{
	e->ctx->ibv_ctx.context.ops.poll_cq = f ? f : mlx5_poll_cq;
}

/* Pretend every posted WQE completed (mlx5-golden README, pitfall 4). */
void hv_drain(struct hv_env *e) { e->qp->sq.tail = e->qp->sq.head; }

/* Records the hooks' calls into `e` from now on, forgetting earlier ones. */
void hv_record(struct hv_env *e)
{
	cur_env = e;
	if (e) {
		e->nstores = 0;
		e->nbarriers = 0;
	}
}

int hv_stores(struct hv_env *e, const struct hv_store **out)
{
	*out = e->stores;
	return e->nstores;
}

int hv_barriers(struct hv_env *e, const struct hv_barrier **out)
{
	*out = e->barriers;
	return e->nbarriers;
}

/* ibv_post_send of the chain wrs[0..n) (built here as ibv_send_wr). */
int hv_post_send(struct hv_env *e, const struct hv_wr *w, int n, int *bad_index)
{
	struct ibv_send_wr wr[64];
	if (n < 1 || n > 64)
		abort();
	memset(wr, 0, sizeof(wr));
	for (int i = 0; i < n; i++) {
		wr[i].wr_id = w[i].wr_id;
		wr[i].opcode = w[i].opcode;
		wr[i].send_flags = w[i].send_flags;
		wr[i].imm_data = w[i].imm_be;
		wr[i].sg_list = (struct ibv_sge *)w[i].sges;
		wr[i].num_sge = w[i].num_sge;
		if (w[i].ah) {
			wr[i].wr.ud.ah = w[i].ah;
			wr[i].wr.ud.remote_qpn = w[i].remote_qpn;
			wr[i].wr.ud.remote_qkey = w[i].remote_qkey;
		} else if (w[i].opcode == IBV_WR_ATOMIC_CMP_AND_SWP ||
			   w[i].opcode == IBV_WR_ATOMIC_FETCH_AND_ADD) {
			wr[i].wr.atomic.remote_addr = w[i].remote_addr;
			wr[i].wr.atomic.rkey = w[i].rkey;
			wr[i].wr.atomic.compare_add = w[i].compare_add;
			wr[i].wr.atomic.swap = w[i].swap;
		} else {
			wr[i].wr.rdma.remote_addr = w[i].remote_addr;
			wr[i].wr.rdma.rkey = w[i].rkey;
		}
		wr[i].next = i + 1 < n ? &wr[i + 1] : NULL;
	}
	struct ibv_send_wr *bad = NULL;
	int rc = mlx5_post_send(&e->qp->verbs_qp.qp, wr, &bad);
	*bad_index = bad ? (int)(bad - wr) : -1;
	return rc;
}

/* The same chain through ibv_wr_start / ibv_wr_* / ibv_wr_complete. */
int hv_post_ex(struct hv_env *e, const struct hv_wr *w, int n)
{
	struct ibv_qp_ex *x = &e->qp->verbs_qp.qp_ex;
	struct ibv_data_buf bufs[64];
	ibv_wr_start(x);
	for (int i = 0; i < n; i++) {
		x->wr_id = w[i].wr_id;
		x->wr_flags = w[i].send_flags & ~IBV_SEND_INLINE;
		switch (w[i].opcode) {
		case IBV_WR_SEND: ibv_wr_send(x); break;
		case IBV_WR_SEND_WITH_IMM: ibv_wr_send_imm(x, w[i].imm_be); break;
		case IBV_WR_RDMA_WRITE: ibv_wr_rdma_write(x, w[i].rkey, w[i].remote_addr); break;
		case IBV_WR_RDMA_WRITE_WITH_IMM:
			ibv_wr_rdma_write_imm(x, w[i].rkey, w[i].remote_addr, w[i].imm_be);
			break;
		case IBV_WR_RDMA_READ: ibv_wr_rdma_read(x, w[i].rkey, w[i].remote_addr); break;
		case IBV_WR_ATOMIC_CMP_AND_SWP:
			ibv_wr_atomic_cmp_swp(x, w[i].rkey, w[i].remote_addr, w[i].compare_add,
					      w[i].swap);
			break;
		case IBV_WR_ATOMIC_FETCH_AND_ADD:
			ibv_wr_atomic_fetch_add(x, w[i].rkey, w[i].remote_addr, w[i].compare_add);
			break;
		default: abort();
		}
		if (w[i].ah)
			ibv_wr_set_ud_addr(x, w[i].ah, w[i].remote_qpn, w[i].remote_qkey);
		if (w[i].send_flags & IBV_SEND_INLINE) {
			if (w[i].num_sge > 64)
				abort();
			for (unsigned k = 0; k < w[i].num_sge; k++)
				bufs[k] = (struct ibv_data_buf){
					(void *)(uintptr_t)w[i].sges[k].addr, w[i].sges[k].length
				};
			ibv_wr_set_inline_data_list(x, w[i].num_sge, bufs);
		} else {
			ibv_wr_set_sge_list(x, w[i].num_sge, w[i].sges);
		}
	}
	return ibv_wr_complete(x);
}

int hv_poll_cq(struct hv_env *e, int n, struct ibv_wc *wc)
{
	return mlx5_poll_cq(&e->cq->verbs_cq.cq, n, wc);
}

/* ---- Instruction-count workloads (run under callgrind; each measured function is
 * noinline and named hv_measured_* so --toggle-collect counts it and what it calls). ---- */

/* n lone 32-byte inline SENDs through mlx5_post_send, every 32nd signaled (the SQ is
 * drained by hand: pitfall 4). */
__attribute__((noinline)) int hv_measured_c_post_send(struct hv_env *e, const uint8_t *msg,
						      unsigned len, unsigned long n,
						      unsigned chain)
{
	struct ibv_sge sge[64];
	struct ibv_send_wr wr[64], *bad;
	for (unsigned i = 0; i < chain; i++) {
		sge[i] = (struct ibv_sge){ (uintptr_t)msg, len, 0 };
		wr[i] = (struct ibv_send_wr){ .wr_id = i, .sg_list = &sge[i], .num_sge = 1,
					      .opcode = IBV_WR_SEND,
					      .send_flags = IBV_SEND_INLINE,
					      .next = i + 1 < chain ? &wr[i + 1] : NULL };
	}
	for (unsigned long k = 0; k < n; k += chain) {
		wr[chain - 1].send_flags =
			IBV_SEND_INLINE | ((k / chain) % (32 / chain ? 32 / chain : 1) == 0
						   ? IBV_SEND_SIGNALED : 0);
		if (mlx5_post_send(&e->qp->verbs_qp.qp, wr, &bad))
			return -1;
		e->qp->sq.tail = e->qp->sq.head;
	}
	return 0;
}

/* The same through ibv_wr_start / ibv_wr_send / ibv_wr_set_inline_data / ibv_wr_complete. */
__attribute__((noinline)) int hv_measured_c_post_wr(struct hv_env *e, const uint8_t *msg,
						    unsigned len, unsigned long n, unsigned chain)
{
	struct ibv_qp_ex *x = &e->qp->verbs_qp.qp_ex;
	for (unsigned long k = 0; k < n; k += chain) {
		ibv_wr_start(x);
		for (unsigned i = 0; i < chain; i++) {
			x->wr_id = i;
			x->wr_flags = (i == chain - 1 &&
				       (k / chain) % (32 / chain ? 32 / chain : 1) == 0)
					      ? IBV_SEND_SIGNALED : 0;
			ibv_wr_send(x);
			ibv_wr_set_inline_data(x, (void *)msg, len);
		}
		if (ibv_wr_complete(x))
			return -1;
		e->qp->sq.tail = e->qp->sq.head;
	}
	return 0;
}

/* Drains n completions with mlx5_poll_cq, up to 32 per call. */
__attribute__((noinline)) int hv_measured_c_poll(struct hv_env *e, unsigned long n)
{
	struct ibv_wc wc[32];
	unsigned long got = 0;
	while (got < n) {
		int k = mlx5_poll_cq(&e->cq->verbs_cq.cq, 32, wc);
		if (k < 0)
			return -1;
		for (int i = 0; i < k; i++)
			if (wc[i].status != IBV_WC_SUCCESS)
				return -2;
		got += k;
	}
	return 0;
}

/* ---- The receive queue (issue 30): mlx5_post_recv on a fake RQ. ---- */

struct hv_rwr {
	uint64_t wr_id;
	const struct ibv_sge *sges;
	int32_t num_sge;
	int32_t pad;
};

/* Gives the env's QP a receive queue of wqe_cnt WQEs of `stride` bytes (a power of two, 16
 * bytes per scatter entry: max_gs = stride / 16), filled with `poison`, as mlx5_create_qp
 * lays it out for mlx5_post_recv: rq.offset 0 in qp->buf, rq.max_post = wqe_cnt, the receive
 * counter in qp->db[MLX5_RCV_DBR], no WQE signature. */
void hv_rq_init(struct hv_env *e, unsigned wqe_cnt, unsigned stride, unsigned char poison)
{
	struct mlx5_qp *qp = e->qp;
	unsigned shift = 0;
	while ((1u << shift) < stride)
		shift++;
	if ((1u << shift) != stride || stride < 16 || (wqe_cnt & (wqe_cnt - 1)))
		abort();
	qp->buf.buf = zalloc_aligned((size_t)wqe_cnt * stride, poison);
	qp->buf.length = (size_t)wqe_cnt * stride;
	qp->rq.offset = 0;
	qp->rq.wqe_cnt = wqe_cnt;
	qp->rq.wqe_shift = shift;
	qp->rq.max_gs = stride / 16;
	qp->rq.qp_state_max_gs = stride / 16;
	qp->rq.max_post = wqe_cnt;
	qp->rq.head = 0;
	qp->rq.tail = 0;
	qp->rq.wrid = calloc(wqe_cnt, sizeof(uint64_t));
	qp->wq_sig = 0;
	/* mlx5_copy_to_recv_wqe (scatter-to-CQE) finds the context through the QP's PD. */
	struct mlx5_pd *pd = calloc(1, sizeof(*pd));
	if (!pd)
		abort();
	pd->ibv_pd.context = &e->ctx->ibv_ctx.context;
	qp->verbs_qp.qp.pd = &pd->ibv_pd;
	/* No NULL MR: no segment's lkey is skipped. */
	e->ctx->dump_fill_mkey_be = htobe32(0xffffffffu);
}

int hv_post_recv(struct hv_env *e, const struct hv_rwr *w, int n, int *bad_index)
{
	struct ibv_recv_wr wr[64];
	if (n < 1 || n > 64)
		abort();
	memset(wr, 0, sizeof(wr));
	for (int i = 0; i < n; i++) {
		wr[i].wr_id = w[i].wr_id;
		wr[i].sg_list = (struct ibv_sge *)w[i].sges;
		wr[i].num_sge = w[i].num_sge;
		wr[i].next = i + 1 < n ? &wr[i + 1] : NULL;
	}
	struct ibv_recv_wr *bad = NULL;
	int rc = mlx5_post_recv(&e->qp->verbs_qp.qp, wr, &bad);
	*bad_index = bad ? (int)(bad - wr) : -1;
	return rc;
}

uint8_t *hv_rq_buf(struct hv_env *e) { return e->qp->buf.buf; }
uint64_t *hv_rq_wrid(struct hv_env *e) { return e->qp->rq.wrid; }
unsigned hv_rq_head(struct hv_env *e) { return e->qp->rq.head; }
/* What mlx5_poll_cq does for each receive it completes: the tail moves on. */
void hv_rq_set_tail(struct hv_env *e, unsigned tail) { e->qp->rq.tail = tail; }

/* ---- SRQ (issue 30): mlx5_alloc_srq_buf's own layout, mlx5_post_srq_recv and
 * mlx5_free_srq_wqe on it. ---- */

struct hv_srq {
	struct mlx5_srq srq;
	struct mlx5_device dev;
	__be32 db[2];
};

/* An SRQ of `max_wr` receives of `max_gs` entries, its buffer and list made by libmlx5's
 * mlx5_alloc_srq_buf (with a wait queue when `have_wq`: the device allows twice the
 * WQEs). */
struct hv_srq *hv_srq_new(struct hv_env *e, unsigned max_wr, int max_gs, int have_wq)
{
	struct hv_srq *s = calloc(1, sizeof(*s));
	if (!s)
		abort();
	s->dev.page_size = 4096;
	e->ctx->ibv_ctx.context.device = &s->dev.verbs_dev.device;
	e->ctx->max_srq_recv_wr = have_wq ? 2 * max_wr + 1 : max_wr + 1;
	e->ctx->max_recv_wr = 1 << 16;
	s->srq.max_gs = max_gs;
	s->srq.vsrq.srq.context = &e->ctx->ibv_ctx.context;
	if (mlx5_alloc_srq_buf(&e->ctx->ibv_ctx.context, &s->srq, max_wr, NULL))
		abort();
	s->srq.db = s->db;
	return s;
}

int hv_post_srq_recv(struct hv_srq *s, const struct hv_rwr *w, int n, int *bad_index)
{
	struct ibv_recv_wr wr[64];
	if (n < 1 || n > 64)
		abort();
	memset(wr, 0, sizeof(wr));
	for (int i = 0; i < n; i++) {
		wr[i].wr_id = w[i].wr_id;
		wr[i].sg_list = (struct ibv_sge *)w[i].sges;
		wr[i].num_sge = w[i].num_sge;
		wr[i].next = i + 1 < n ? &wr[i + 1] : NULL;
	}
	struct ibv_recv_wr *bad = NULL;
	int rc = mlx5_post_srq_recv(&s->srq.vsrq.srq, wr, &bad);
	*bad_index = bad ? (int)(bad - wr) : -1;
	return rc;
}

void hv_srq_free_wqe(struct hv_srq *s, int ind) { mlx5_free_srq_wqe(&s->srq, ind); }
uint8_t *hv_srq_buf(struct hv_srq *s) { return s->srq.buf.buf; }
uint64_t *hv_srq_wrid(struct hv_srq *s) { return s->srq.wrid; }
unsigned long *hv_srq_bitmap(struct hv_srq *s) { return s->srq.free_wqe_bitmap; }
uint32_t hv_srq_db(struct hv_srq *s) { return s->db[0]; }
/* head, tail, nwqes, max, max_gs, wqe_shift, waitq_head, counter */
void hv_srq_state(struct hv_srq *s, int out[8])
{
	out[0] = s->srq.head;
	out[1] = s->srq.tail;
	out[2] = (int)s->srq.nwqes;
	out[3] = s->srq.max;
	out[4] = s->srq.max_gs;
	out[5] = s->srq.wqe_shift;
	out[6] = s->srq.waitq_head;
	out[7] = s->srq.counter;
}

/* Makes the SRQ libmlx5's SRQ number `srqn` on the env's context (mlx5_store_srq), so
 * mlx5_poll_cq finds it for a responder CQE naming it. */
void hv_srq_store(struct hv_env *e, struct hv_srq *s, uint32_t srqn)
{
	s->srq.srqn = srqn;
	if (mlx5_store_srq(e->ctx, srqn, &s->srq))
		abort();
}

/* Issue 30's receive rows: per received message, what an application does with libmlx5:
 * poll one completion (mlx5_poll_cq: the CQE, the wr_id, a scattered payload copied into
 * the buffer), read the message's first byte (hand it on), repost the buffer
 * (mlx5_post_recv of one WR). `sges[i]` is slot i's buffer (wr_id i). */
__attribute__((noinline)) int hv_measured_c_recv(struct hv_env *e, unsigned long n,
						 const struct ibv_sge *sges, unsigned slots)
{
	struct ibv_wc wc;
	struct ibv_recv_wr wr, *bad;
	volatile uint8_t sink;
	memset(&wr, 0, sizeof(wr));
	wr.num_sge = 1;
	for (unsigned long k = 0; k < n; k++) {
		if (mlx5_poll_cq(&e->cq->verbs_cq.cq, 1, &wc) != 1 || wc.status != IBV_WC_SUCCESS)
			return -1;
		const struct ibv_sge *s = &sges[wc.wr_id % slots];
		sink = *(const volatile uint8_t *)(uintptr_t)s->addr;
		(void)sink;
		wr.wr_id = wc.wr_id;
		wr.sg_list = (struct ibv_sge *)s;
		if (mlx5_post_recv(&e->qp->verbs_qp.qp, &wr, &bad))
			return -2;
	}
	return 0;
}
