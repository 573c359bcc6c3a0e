/* From the project's mlx5-golden spike (../shared/mlx5-golden/harness/stubs.c): symbols
 * qp.o and cq.o reference that live in other rdma-core objects, none reached here. */
/* Stubs for every symbol qp.o + cq.o reference but that live in other
 * rdma-core objects (buf.c, srq.c, mlx5.c, verbs.c, libibverbs).
 * None of them is reached on the RC send / requester-CQE paths exercised
 * by the harness; each one aborts loudly if it ever is. */
#include <config.h>
#include <stdio.h>
#include <stdlib.h>
#include "mlx5.h"

#define NOT_REACHED(name) do { fprintf(stderr, "STUB HIT: %s\n", name); abort(); } while (0)

/* globals normally defined in mlx5.c */
int mlx5_freeze_on_error_cqe = 0;

/* libibverbs */
struct ibv_qp_ex *ibv_qp_to_qp_ex(struct ibv_qp *qp)
{ return (struct ibv_qp_ex *)qp; } /* real impl: checks comp_mask, same cast */

/* buf.c */
/* Reached by mlx5_alloc_srq_buf (the SRQ golden, issue 30): page-aligned anonymous
 * memory, as buf.c's MLX5_ALLOC_TYPE_ANON gives. */
int mlx5_alloc_prefered_buf(struct mlx5_context *mctx, struct mlx5_buf *buf,
			    size_t size, int page_size, enum mlx5_alloc_type type,
			    const char *component)
{
	void *p = NULL;
	if (posix_memalign(&p, page_size > 0 ? page_size : 4096, size))
		return -1;
	buf->buf = p;
	buf->length = size;
	buf->type = MLX5_ALLOC_TYPE_ANON;
	return 0;
}
int mlx5_free_actual_buf(struct mlx5_context *ctx, struct mlx5_buf *buf)
{ NOT_REACHED(__func__); }
void mlx5_get_alloc_type(struct mlx5_context *context, struct ibv_pd *pd,
			 const char *component, enum mlx5_alloc_type *alloc_type,
			 enum mlx5_alloc_type default_type)
{ *alloc_type = default_type; } /* no environment, no parent domain: the default */

/* srq.c is compiled in (the SRQ golden, issue 30). */

/* verbs.c / mlx5.c */
struct mlx5_mkey *mlx5_find_mkey(struct mlx5_context *ctx, uint32_t mkeyn)
{ return NULL; }
int mlx5_get_cmd_status_err(int err, void *out)
{ NOT_REACHED(__func__); }
int mlx5dv_devx_qp_query(struct ibv_qp *qp, const void *in, size_t inlen,
			 void *out, size_t outlen)
{ NOT_REACHED(__func__); }
int mlx5dv_get_clock_info(struct ibv_context *context,
			  struct mlx5dv_clock_info *clock_info)
{ NOT_REACHED(__func__); }
