/* Input of hotverbs-codegen for the mlx5 direct path: the mlx5 direct-verbs header
 * (its types, constants and exported functions; the static inline helpers are not bound). */
#include <infiniband/mlx5dv.h>
