/* Input of hotverbs-codegen: everything hotverbs-ffi binds. */
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>
