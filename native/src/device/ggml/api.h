/* ggml reached through dlopen/dlsym of llama_cpp's own shared objects (api.c): our own
 * prototypes of the ggml functions this library uses, in one table. ggml's structs stay
 * opaque (tensors are reached through views and accessor functions only); the only
 * struct passed by value, ggml_init's parameters, is declared here with ggml's layout. */
#ifndef PI_GGML_API_H
#define PI_GGML_API_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct ggml_context;
struct ggml_tensor;
struct ggml_cgraph;
struct ggml_backend;
struct ggml_backend_device;
struct ggml_backend_reg;
struct ggml_backend_buffer;
struct ggml_backend_buffer_type;
struct ggml_gallocr;

typedef struct ggml_tensor gt;
typedef struct ggml_context gctx;
typedef struct ggml_backend_device *gdev_t;
typedef struct ggml_backend_buffer_type *gbuft_t;
typedef struct ggml_backend_buffer *gbuf_t;
typedef struct ggml_backend *gbackend_t;

/* ggml_init's parameters, passed by value: mem_size, mem_buffer, no_alloc */
typedef struct pi_ggml_init_params {
    size_t mem_size;
    void *mem_buffer;
    bool no_alloc;
} pi_ggml_init_params;

/* ggml enum values this library uses (ggml.h, ggml-backend.h of the pinned range) */
enum { PI_G_TYPE_F32 = 0, PI_G_TYPE_F16 = 1, PI_G_TYPE_I32 = 26, PI_G_TYPE_I64 = 27 };
enum { PI_G_STATUS_SUCCESS = 0 };
enum { PI_G_BUFFER_USAGE_WEIGHTS = 1 };

/* X(return type, name without the ggml_ prefix, parameter list): one line per function */
#define PI_GGML_FUNCS(X)                                                                                   \
    X(const char *, version, (void))                                                                      \
    X(size_t, tensor_overhead, (void))                                                                    \
    X(gctx *, init, (pi_ggml_init_params))                                                                \
    X(void, free, (gctx *))                                                                               \
    X(int64_t, blck_size, (int))                                                                          \
    X(size_t, type_size, (int))                                                                           \
    X(size_t, row_size, (int, int64_t))                                                                   \
    X(const char *, type_name, (int))                                                                     \
    X(size_t, nbytes, (const gt *))                                                                       \
    X(gt *, new_tensor_1d, (gctx *, int, int64_t))                                                        \
    X(gt *, new_tensor_2d, (gctx *, int, int64_t, int64_t))                                               \
    X(gt *, new_tensor_3d, (gctx *, int, int64_t, int64_t, int64_t))                                      \
    X(gt *, view_1d, (gctx *, gt *, int64_t, size_t))                                                     \
    X(gt *, view_2d, (gctx *, gt *, int64_t, int64_t, size_t, size_t))                                    \
    X(gt *, view_3d, (gctx *, gt *, int64_t, int64_t, int64_t, size_t, size_t, size_t))                   \
    X(gt *, reshape_2d, (gctx *, gt *, int64_t, int64_t))                                                 \
    X(gt *, reshape_3d, (gctx *, gt *, int64_t, int64_t, int64_t))                                        \
    X(gt *, permute, (gctx *, gt *, int, int, int, int))                                                  \
    X(gt *, transpose, (gctx *, gt *))                                                                    \
    X(gt *, cont, (gctx *, gt *))                                                                         \
    X(gt *, cpy, (gctx *, gt *, gt *))                                                                    \
    X(gt *, set_rows, (gctx *, gt *, gt *, gt *))                                                         \
    X(gt *, mul_mat, (gctx *, gt *, gt *))                                                                \
    X(gt *, mul_mat_id, (gctx *, gt *, gt *, gt *))                                                       \
    X(gt *, get_rows, (gctx *, gt *, gt *))                                                               \
    X(gt *, mul, (gctx *, gt *, gt *))                                                                    \
    X(gt *, add, (gctx *, gt *, gt *))                                                                    \
    X(gt *, scale, (gctx *, gt *, float))                                                                 \
    X(gt *, rms_norm, (gctx *, gt *, float))                                                              \
    X(gt *, norm, (gctx *, gt *, float))                                                                  \
    X(gt *, rope_ext, (gctx *, gt *, gt *, gt *, int, int, int, float, float, float, float, float, float)) \
    X(gt *, soft_max_ext, (gctx *, gt *, gt *, float, float))                                             \
    X(gt *, flash_attn_ext, (gctx *, gt *, gt *, gt *, gt *, float, float, float))                        \
    X(gt *, silu, (gctx *, gt *))                                                                         \
    X(gt *, gelu, (gctx *, gt *))                                                                         \
    X(gt *, relu, (gctx *, gt *))                                                                         \
    X(gt *, cast, (gctx *, gt *, int))                                                                    \
    X(gt *, pad, (gctx *, gt *, int, int, int, int))                                                      \
    X(gt *, set_name, (gt *, const char *))                                                               \
    X(void, set_input, (gt *))                                                                            \
    X(void, set_output, (gt *))                                                                           \
    X(struct ggml_cgraph *, new_graph_custom, (gctx *, size_t, bool))                                     \
    X(size_t, graph_overhead_custom, (size_t, bool))                                                      \
    X(void, build_forward_expand, (struct ggml_cgraph *, gt *))                                           \
    X(size_t, backend_buft_get_alloc_size, (gbuft_t, const gt *))                                         \
    X(size_t, backend_buft_get_alignment, (gbuft_t))                                                      \
    X(const char *, backend_buft_name, (gbuft_t))                                                         \
    X(void, backend_buffer_free, (gbuf_t))                                                                \
    X(size_t, backend_buffer_get_size, (gbuf_t))                                                          \
    X(void, backend_buffer_clear, (gbuf_t, uint8_t))                                                      \
    X(void, backend_buffer_set_usage, (gbuf_t, int))                                                      \
    X(void, backend_tensor_set, (gt *, const void *, size_t, size_t))                                     \
    X(void, backend_tensor_get, (const gt *, void *, size_t, size_t))                                     \
    X(void, backend_tensor_memset, (gt *, uint8_t, size_t, size_t))                                       \
    X(void, backend_free, (gbackend_t))                                                                   \
    X(int, backend_graph_compute, (gbackend_t, struct ggml_cgraph *))                                     \
    X(size_t, backend_dev_count, (void))                                                                  \
    X(gdev_t, backend_dev_get, (size_t))                                                                  \
    X(gdev_t, backend_dev_by_name, (const char *))                                                        \
    X(const char *, backend_dev_name, (gdev_t))                                                           \
    X(const char *, backend_dev_description, (gdev_t))                                                    \
    X(void, backend_dev_memory, (gdev_t, size_t *, size_t *))                                             \
    X(int, backend_dev_type, (gdev_t))                                                                    \
    X(gbackend_t, backend_dev_init, (gdev_t, const char *))                                               \
    X(gbuft_t, backend_dev_buffer_type, (gdev_t))                                                         \
    X(bool, backend_dev_supports_op, (gdev_t, const gt *))                                                \
    X(struct ggml_backend_reg *, backend_dev_backend_reg, (gdev_t))                                       \
    X(void *, backend_reg_get_proc_address, (struct ggml_backend_reg *, const char *))                    \
    X(void, backend_load_all_from_path, (const char *))                                                   \
    X(gbuf_t, backend_alloc_ctx_tensors_from_buft, (gctx *, gbuft_t))                                     \
    X(size_t, backend_alloc_ctx_tensors_from_buft_size, (gctx *, gbuft_t))                                \
    X(gbuf_t, backend_cpu_buffer_from_ptr, (void *, size_t))                                              \
    X(int, backend_tensor_alloc, (gbuf_t, gt *, void *))                                                  \
    X(void, gallocr_reserve_n_size, (struct ggml_gallocr *, struct ggml_cgraph *, const int *, const int *,  \
                                     size_t *))                                                           \
    X(struct ggml_gallocr *, gallocr_new, (gbuft_t))                                                      \
    X(void, gallocr_free, (struct ggml_gallocr *))                                                        \
    X(bool, gallocr_reserve, (struct ggml_gallocr *, struct ggml_cgraph *))                               \
    X(bool, gallocr_alloc_graph, (struct ggml_gallocr *, struct ggml_cgraph *))                           \
    X(size_t, gallocr_get_buffer_size, (struct ggml_gallocr *, int))

#define PI_GGML_FIELD(ret, name, args) ret(*name) args;
typedef struct pi_ggml_api {
    PI_GGML_FUNCS(PI_GGML_FIELD)
} pi_ggml_api;
#undef PI_GGML_FIELD

/* the bound table (after a successful pi_ggml_bind), or NULL with an error set */
const pi_ggml_api *pi_ggml(void);

#endif
