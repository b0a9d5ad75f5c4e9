/* ONNX Runtime custom ops `ai.warmstart::Q4MatMul` and `ai.warmstart::Q8MatMul`: MatMulNBits (bits 4, block 32 /
 * bits 8, blocks of 32-256; no zero points) computed by ws_q4.h / ws_q8.h straight from the initializers' bytes as
 * ONNX Runtime maps them from model.onnx.data: no prepack, no copy.
 *
 *   Q4MatMul  inputs A float [..., K], B uint8 [N, K/32, 16], scales float [N, K/32]; attrs K, N, block_size (32)
 *   Q8MatMul  inputs A float [..., K], B uint8 [N, K/block, block], scales float [N, K/block];
 *             attrs K, N, block_size (32, 64, 128 or 256)
 *   output    Y float [..., N]
 *
 * Loaded with the session option `custom_ops_library` (or RegisterCustomOpsLibrary_V2), which calls
 * RegisterCustomOps below. No ONNX Runtime header is used: the few OrtApi entries called are taken from the table by
 * index, and OrtCustomOp is declared here, both as in include/onnxruntime/core/session/onnxruntime_c_api.h of
 * ONNX Runtime 1.31 (the table is append-only: every index below is unchanged since the version that added it;
 * the newest used, KernelContext_ParallelFor, came in API version 17, the version this library asks for).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ws_q4.h"
#include "ws_q8.h"

#define WS_ORT_API_VERSION 17
#define WS_EXPORT __attribute__((visibility("default")))

typedef struct OrtStatus OrtStatus;
typedef struct OrtApi OrtApi; /* a table of function pointers, read by index */
typedef struct OrtSessionOptions OrtSessionOptions;
typedef struct OrtCustomOpDomain OrtCustomOpDomain;
typedef struct OrtKernelInfo OrtKernelInfo;
typedef struct OrtKernelContext OrtKernelContext;
typedef struct OrtValue OrtValue;
typedef struct OrtTypeInfo OrtTypeInfo;
typedef struct OrtTensorTypeAndShapeInfo OrtTensorTypeAndShapeInfo;
typedef struct OrtShapeInferContext OrtShapeInferContext;

typedef struct OrtApiBase {
    const OrtApi* (*GetApi)(uint32_t version);
    const char* (*GetVersionString)(void);
} OrtApiBase;

enum { ORT_INVALID_ARGUMENT = 2, ORT_FAIL = 1 };                 /* OrtErrorCode */
enum { ELEM_FLOAT = 1, ELEM_UINT8 = 2 };                         /* ONNXTensorElementDataType */
enum { INPUT_OUTPUT_REQUIRED = 0 };                              /* OrtCustomOpInputOutputCharacteristic */

/* struct OrtCustomOp, every member through ReleaseAliasMap (ORT reads the members its `version` has). */
typedef struct OrtCustomOp {
    uint32_t version;
    void* (*CreateKernel)(const struct OrtCustomOp*, const OrtApi*, const OrtKernelInfo*);
    const char* (*GetName)(const struct OrtCustomOp*);
    const char* (*GetExecutionProviderType)(const struct OrtCustomOp*);
    int (*GetInputType)(const struct OrtCustomOp*, size_t);
    size_t (*GetInputTypeCount)(const struct OrtCustomOp*);
    int (*GetOutputType)(const struct OrtCustomOp*, size_t);
    size_t (*GetOutputTypeCount)(const struct OrtCustomOp*);
    void (*KernelCompute)(void*, OrtKernelContext*);
    void (*KernelDestroy)(void*);
    int (*GetInputCharacteristic)(const struct OrtCustomOp*, size_t);
    int (*GetOutputCharacteristic)(const struct OrtCustomOp*, size_t);
    int (*GetInputMemoryType)(const struct OrtCustomOp*, size_t);
    int (*GetVariadicInputMinArity)(const struct OrtCustomOp*);
    int (*GetVariadicInputHomogeneity)(const struct OrtCustomOp*);
    int (*GetVariadicOutputMinArity)(const struct OrtCustomOp*);
    int (*GetVariadicOutputHomogeneity)(const struct OrtCustomOp*);
    OrtStatus* (*CreateKernelV2)(const struct OrtCustomOp*, const OrtApi*, const OrtKernelInfo*, void**);
    OrtStatus* (*KernelComputeV2)(void*, OrtKernelContext*);
    OrtStatus* (*InferOutputShapeFn)(const struct OrtCustomOp*, OrtShapeInferContext*);
    int (*GetStartVersion)(const struct OrtCustomOp*);
    int (*GetEndVersion)(const struct OrtCustomOp*);
    size_t (*GetMayInplace)(int**, int**);
    void (*ReleaseMayInplace)(int*, int*);
    size_t (*GetAliasMap)(int**, int**);
    void (*ReleaseAliasMap)(int*, int*);
} OrtCustomOp;

/* OrtApi entries by index (counted in the header named above). */
#define I_CreateStatus 0
#define I_CreateCustomOpDomain 26
#define I_CustomOpDomain_Add 27
#define I_AddCustomOpDomain 28
#define I_GetTensorMutableData 51
#define I_CastTypeInfoToTensorInfo 55
#define I_GetTensorElementType 60
#define I_GetDimensionsCount 61
#define I_GetDimensions 62
#define I_GetTensorTypeAndShape 65
#define I_KernelInfoGetAttribute_int64 86
#define I_KernelContext_GetInput 90
#define I_KernelContext_GetOutput 91
#define I_ReleaseTypeInfo 98
#define I_ReleaseTensorTypeAndShapeInfo 99
#define I_KernelInfo_GetInputTypeInfo 234
#define I_KernelContext_ParallelFor 274

static const OrtApi* g_api;
#define FN(i) (((void* const*)g_api)[i])

static OrtStatus* create_status(int code, const char* msg) {
    return ((OrtStatus * (*)(int, const char*)) FN(I_CreateStatus))(code, msg);
}
static OrtStatus* attr_int64(const OrtKernelInfo* info, const char* name, int64_t* out) {
    return ((OrtStatus * (*)(const OrtKernelInfo*, const char*, int64_t*)) FN(I_KernelInfoGetAttribute_int64))(info, name,
                                                                                                              out);
}
static OrtStatus* input_type_info(const OrtKernelInfo* info, size_t i, OrtTypeInfo** out) {
    return ((OrtStatus * (*)(const OrtKernelInfo*, size_t, OrtTypeInfo**)) FN(I_KernelInfo_GetInputTypeInfo))(info, i,
                                                                                                             out);
}
static OrtStatus* cast_tensor_info(const OrtTypeInfo* t, const OrtTensorTypeAndShapeInfo** out) {
    return ((OrtStatus * (*)(const OrtTypeInfo*, const OrtTensorTypeAndShapeInfo**)) FN(I_CastTypeInfoToTensorInfo))(
        t, out);
}
static void release_type_info(OrtTypeInfo* t) { ((void (*)(OrtTypeInfo*))FN(I_ReleaseTypeInfo))(t); }
static OrtStatus* element_type(const OrtTensorTypeAndShapeInfo* t, int* out) {
    return ((OrtStatus * (*)(const OrtTensorTypeAndShapeInfo*, int*)) FN(I_GetTensorElementType))(t, out);
}
static OrtStatus* dims_count(const OrtTensorTypeAndShapeInfo* t, size_t* out) {
    return ((OrtStatus * (*)(const OrtTensorTypeAndShapeInfo*, size_t*)) FN(I_GetDimensionsCount))(t, out);
}
static OrtStatus* dims(const OrtTensorTypeAndShapeInfo* t, int64_t* out, size_t n) {
    return ((OrtStatus * (*)(const OrtTensorTypeAndShapeInfo*, int64_t*, size_t)) FN(I_GetDimensions))(t, out, n);
}
static OrtStatus* value_shape(const OrtValue* v, OrtTensorTypeAndShapeInfo** out) {
    return ((OrtStatus * (*)(const OrtValue*, OrtTensorTypeAndShapeInfo**)) FN(I_GetTensorTypeAndShape))(v, out);
}
static void release_shape(OrtTensorTypeAndShapeInfo* t) {
    ((void (*)(OrtTensorTypeAndShapeInfo*))FN(I_ReleaseTensorTypeAndShapeInfo))(t);
}
static OrtStatus* tensor_data(OrtValue* v, void** out) {
    return ((OrtStatus * (*)(OrtValue*, void**)) FN(I_GetTensorMutableData))(v, out);
}
static OrtStatus* get_input(const OrtKernelContext* c, size_t i, const OrtValue** out) {
    return ((OrtStatus * (*)(const OrtKernelContext*, size_t, const OrtValue**)) FN(I_KernelContext_GetInput))(c, i,
                                                                                                              out);
}
static OrtStatus* get_output(OrtKernelContext* c, size_t i, const int64_t* d, size_t n, OrtValue** out) {
    return ((OrtStatus * (*)(OrtKernelContext*, size_t, const int64_t*, size_t, OrtValue**))
                FN(I_KernelContext_GetOutput))(c, i, d, n, out);
}
static OrtStatus* parallel_for(const OrtKernelContext* c, void (*fn)(void*, size_t), size_t total, size_t batch,
                               void* data) {
    return ((OrtStatus * (*)(const OrtKernelContext*, void (*)(void*, size_t), size_t, size_t, void*))
                FN(I_KernelContext_ParallelFor))(c, fn, total, batch, data);
}

#define RETURN_IF(status)                 \
    do {                                  \
        OrtStatus* s_ = (status);         \
        if (s_ != NULL) return s_;        \
    } while (0)

#define MAX_DIMS 8

typedef struct {
    int64_t K, N, block;
    int bits; /* 4: Q4MatMul, 8: Q8MatMul */
} Kernel;

/* The message of a refusal: "Q4MatMul: <what>" or "Q8MatMul: <what>" (ORT prefixes its own context). */
static OrtStatus* refuse(const char* fmt, long long a, long long b, long long c) {
    char msg[320];
    snprintf(msg, sizeof msg, fmt, a, b, c);
    return create_status(ORT_INVALID_ARGUMENT, msg);
}

/* An input's shape as the graph states it (initializers: their stored dims); -1 where a dim is symbolic. */
static OrtStatus* declared_shape(const OrtKernelInfo* info, size_t index, int* type, int64_t* shape, size_t* rank) {
    OrtTypeInfo* ti = NULL;
    const OrtTensorTypeAndShapeInfo* t = NULL;
    RETURN_IF(input_type_info(info, index, &ti));
    OrtStatus* s = cast_tensor_info(ti, &t);
    if (s == NULL) s = element_type(t, type);
    if (s == NULL) s = dims_count(t, rank);
    if (s == NULL && *rank > MAX_DIMS) s = create_status(ORT_INVALID_ARGUMENT, "Q4MatMul/Q8MatMul: an input of rank > 8");
    if (s == NULL) s = dims(t, shape, *rank);
    release_type_info(ti);
    return s;
}

/* Q4MatMul (bits 4) or Q8MatMul (bits 8): the same checks, each op's shapes. */
static OrtStatus* create_kernel_bits(int bits, const OrtKernelInfo* info, void** out) {
    const char* name = bits == 4 ? "Q4MatMul" : "Q8MatMul";
    char fmt[320];
    int64_t K = 0, N = 0, block = 0;
    RETURN_IF(attr_int64(info, "K", &K));
    RETURN_IF(attr_int64(info, "N", &N));
    RETURN_IF(attr_int64(info, "block_size", &block));
    if (bits == 4 && block != 32) return refuse("Q4MatMul: block_size %lld is not supported (valid: 32)", block, 0, 0);
    if (bits == 8 && block != 32 && block != 64 && block != 128 && block != 256)
        return refuse("Q8MatMul: block_size %lld is not supported (valid: 32, 64, 128, 256)", block, 0, 0);
    if (K <= 0 || N <= 0 || K % block != 0) {
        snprintf(fmt, sizeof fmt, "%s: K=%%lld, N=%%lld: K must be a positive multiple of %%lld and N positive", name);
        return refuse(fmt, K, N, block);
    }
    /* The scalar path is a reference, 11-16x slower than MLAS (a decode ~10x slower): where it is all this CPU
     * has (no AVX2+FMA: arm64, x86 before Haswell) the session is refused, so the engine opens the MatMulNBits
     * decoder instead. Chosen on purpose (WS_Q4_ISA) or allowed (WS_Q4_ALLOW_SCALAR=1), tests and benchmarks run it. */
    const char* allow = getenv("WS_Q4_ALLOW_SCALAR");
    if (ws_q4_isa() == WS_Q4_ISA_SCALAR && getenv("WS_Q4_ISA") == NULL && !(allow && strcmp(allow, "1") == 0)) {
        snprintf(fmt, sizeof fmt,
                 "%s: this CPU has only the scalar reference path (no AVX2+FMA), %%lld-%%lldx slower than "
                 "MatMulNBits: not run (WS_Q4_ALLOW_SCALAR=1 runs it)",
                 name);
        return refuse(fmt, 11, 16, 0);
    }
    /* B per row: bits 4, K/32 blocks of 16 bytes; bits 8, K/block blocks of block bytes */
    int64_t nb = K / block, bb = bits == 4 ? 16 : block;
    int64_t shape[MAX_DIMS];
    size_t rank = 0;
    int type = 0;
    RETURN_IF(declared_shape(info, 1, &type, shape, &rank));
    if (type != ELEM_UINT8) {
        snprintf(fmt, sizeof fmt, "%s: B must be uint8 (element type %%lld)", name);
        return refuse(fmt, type, 0, 0);
    }
    if (rank != 3 || shape[0] != N || shape[1] != nb || shape[2] != bb) {
        snprintf(fmt, sizeof fmt,
                 "%s: B's shape does not match K=%%lld, N=%%lld (expected [N, K/%lld, %lld], rank %%lld given)", name,
                 (long long)block, (long long)bb);
        return refuse(fmt, K, N, (long long)rank);
    }
    RETURN_IF(declared_shape(info, 2, &type, shape, &rank));
    if (type != ELEM_FLOAT) {
        snprintf(fmt, sizeof fmt, "%s: scales must be float (element type %%lld)", name);
        return refuse(fmt, type, 0, 0);
    }
    if (rank != 2 || shape[0] != N || shape[1] != nb) {
        snprintf(fmt, sizeof fmt,
                 "%s: scales' shape does not match K=%%lld, N=%%lld (expected [N, K/%lld], rank %%lld given)", name,
                 (long long)block);
        return refuse(fmt, K, N, (long long)rank);
    }
    Kernel* k = (Kernel*)malloc(sizeof *k);
    if (k == NULL) return create_status(ORT_FAIL, "Q4MatMul/Q8MatMul: out of memory");
    k->K = K;
    k->N = N;
    k->block = block;
    k->bits = bits;
    *out = k;
    return NULL;
}

static OrtStatus* create_kernel(const OrtCustomOp* op, const OrtApi* api, const OrtKernelInfo* info, void** out) {
    (void)op;
    (void)api;
    return create_kernel_bits(4, info, out);
}

static OrtStatus* create_kernel_q8(const OrtCustomOp* op, const OrtApi* api, const OrtKernelInfo* info, void** out) {
    (void)op;
    (void)api;
    return create_kernel_bits(8, info, out);
}

/* One call's work for ParallelFor: a range of output columns per index. */
typedef struct {
    const void* qa;
    size_t M, K, N, step;
    const uint8_t* B;
    const float* scales;
    float* C;
    int bits;
} Work;

static void run_range(void* data, size_t i) {
    const Work* w = (const Work*)data;
    size_t begin = i * w->step, end = begin + w->step < w->N ? begin + w->step : w->N;
    if (w->bits == 8)
        ws_q8_matmul_q(w->qa, w->M, w->B, w->scales, w->N, w->C, begin, end);
    else
        ws_q4_matmul_q(w->qa, w->M, w->K, w->B, w->scales, w->N, w->C, begin, end);
}

/* A's quantized copy: a buffer per calling thread, grown as needed and kept (its size is bounded by the largest
 * M * K this thread has run; a fresh malloc per call of ~200 KB would be mmap'd and faulted in every time). */
static __thread void* t_scratch;
static __thread size_t t_scratch_size;

static void* scratch_for(size_t bytes) {
    if (bytes > t_scratch_size) {
        free(t_scratch);
        t_scratch_size = 0;
        if (posix_memalign(&t_scratch, 64, bytes) != 0) {
            t_scratch = NULL;
            return NULL;
        }
        t_scratch_size = bytes;
    }
    return t_scratch;
}

/* Columns per ParallelFor index: small enough that 2-4 threads share the largest layers evenly, large enough that
 * each index's fixed cost (one A pass per range) stays small; a multiple of 16 (the kernels' row blocking). */
#define COLUMNS_PER_TASK 256

static OrtStatus* compute(void* kernel, OrtKernelContext* ctx) {
    const Kernel* k = (const Kernel*)kernel;
    const OrtValue *a = NULL, *b = NULL, *sc = NULL;
    RETURN_IF(get_input(ctx, 0, &a));
    RETURN_IF(get_input(ctx, 1, &b));
    RETURN_IF(get_input(ctx, 2, &sc));
    OrtTensorTypeAndShapeInfo* t = NULL;
    RETURN_IF(value_shape(a, &t));
    int64_t shape[MAX_DIMS];
    size_t rank = 0;
    OrtStatus* s = dims_count(t, &rank);
    if (s == NULL && (rank < 1 || rank > MAX_DIMS))
        s = create_status(ORT_INVALID_ARGUMENT, k->bits == 8 ? "Q8MatMul: A must have rank 1 to 8"
                                                             : "Q4MatMul: A must have rank 1 to 8");
    if (s == NULL) s = dims(t, shape, rank);
    release_shape(t);
    RETURN_IF(s);
    if (shape[rank - 1] != k->K)
        return refuse(k->bits == 8 ? "Q8MatMul: A's last dimension %lld does not match K=%lld"
                                   : "Q4MatMul: A's last dimension %lld does not match K=%lld",
                      shape[rank - 1], k->K, 0);
    size_t M = 1;
    for (size_t i = 0; i + 1 < rank; i++) M *= (size_t)shape[i];
    shape[rank - 1] = k->N;
    OrtValue* y = NULL;
    RETURN_IF(get_output(ctx, 0, shape, rank, &y));
    void *pa = NULL, *pb = NULL, *ps = NULL, *py = NULL;
    RETURN_IF(tensor_data((OrtValue*)a, &pa));
    RETURN_IF(tensor_data((OrtValue*)b, &pb));
    RETURN_IF(tensor_data((OrtValue*)sc, &ps));
    RETURN_IF(tensor_data(y, &py));
    if (M == 0) return NULL;
    size_t K = (size_t)k->K, N = (size_t)k->N;
    size_t block = (size_t)k->block;
    void* qa = scratch_for(k->bits == 8 ? ws_q8_scratch_size(M, K, block) : ws_q4_scratch_size(M, K));
    if (qa == NULL) return create_status(ORT_FAIL, "Q4MatMul/Q8MatMul: out of memory for A's quantized copy");
    if (k->bits == 8)
        ws_q8_quantize_a((const float*)pa, M, K, block, qa);
    else
        ws_q4_quantize_a((const float*)pa, M, K, qa);
    Work w = {qa, M, K, N, COLUMNS_PER_TASK, (const uint8_t*)pb, (const float*)ps, (float*)py, k->bits};
    size_t tasks = (N + COLUMNS_PER_TASK - 1) / COLUMNS_PER_TASK;
    if (tasks == 1) {
        run_range(&w, 0);
        return NULL;
    }
    /* A session of one intra-op thread runs the indices in a loop on this thread. */
    return parallel_for(ctx, run_range, tasks, 0, &w);
}

static void destroy_kernel(void* kernel) { free(kernel); }
static const char* op_name(const OrtCustomOp* op) {
    (void)op;
    return "Q4MatMul";
}
static const char* op_name_q8(const OrtCustomOp* op) {
    (void)op;
    return "Q8MatMul";
}
static const char* op_provider(const OrtCustomOp* op) {
    (void)op;
    return "CPUExecutionProvider";
}
static int input_type(const OrtCustomOp* op, size_t i) {
    (void)op;
    return i == 1 ? ELEM_UINT8 : ELEM_FLOAT;
}
static size_t input_count(const OrtCustomOp* op) {
    (void)op;
    return 3;
}
static int output_type(const OrtCustomOp* op, size_t i) {
    (void)op;
    (void)i;
    return ELEM_FLOAT;
}
static size_t output_count(const OrtCustomOp* op) {
    (void)op;
    return 1;
}
static int required(const OrtCustomOp* op, size_t i) {
    (void)op;
    (void)i;
    return INPUT_OUTPUT_REQUIRED;
}
static int memory_default(const OrtCustomOp* op, size_t i) {
    (void)op;
    (void)i;
    return 0; /* OrtMemTypeDefault */
}
static int one(const OrtCustomOp* op) {
    (void)op;
    return 1;
}

static const OrtCustomOp q4_op = {
    .version = WS_ORT_API_VERSION,
    .GetName = op_name,
    .GetExecutionProviderType = op_provider,
    .GetInputType = input_type,
    .GetInputTypeCount = input_count,
    .GetOutputType = output_type,
    .GetOutputTypeCount = output_count,
    .KernelDestroy = destroy_kernel,
    .GetInputCharacteristic = required,
    .GetOutputCharacteristic = required,
    .GetInputMemoryType = memory_default,
    .GetVariadicInputMinArity = one,
    .GetVariadicInputHomogeneity = one,
    .GetVariadicOutputMinArity = one,
    .GetVariadicOutputHomogeneity = one,
    .CreateKernelV2 = create_kernel,
    .KernelComputeV2 = compute,
    .GetStartVersion = one,
    .GetEndVersion = NULL,
};

static int end_version(const OrtCustomOp* op) {
    (void)op;
    return 2147483647; /* INT_MAX: every opset of the domain */
}

/* The domain, made once per process and never released: every session registered with it keeps a pointer. */
static OrtCustomOpDomain* g_domain;
static OrtCustomOp g_op, g_op_q8;

WS_EXPORT OrtStatus* RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* base) {
    static volatile int lock;
    while (__atomic_test_and_set(&lock, __ATOMIC_ACQUIRE)) {
    }
    OrtStatus* s = NULL;
    if (g_domain == NULL) {
        g_api = base->GetApi(WS_ORT_API_VERSION);
        if (g_api == NULL) { /* an ONNX Runtime older than 1.17: no table to make a status with */
            __atomic_clear(&lock, __ATOMIC_RELEASE);
            fprintf(stderr, "ws_q4_op: ONNX Runtime %s lacks C API version %d\n", base->GetVersionString(),
                    WS_ORT_API_VERSION);
            return NULL; /* the session then refuses the graph: no kernel for ai.warmstart::Q4MatMul */
        }
        g_op = q4_op;
        g_op.GetEndVersion = end_version;
        g_op_q8 = g_op; /* the same op but for its name and kernel */
        g_op_q8.GetName = op_name_q8;
        g_op_q8.CreateKernelV2 = create_kernel_q8;
        s = ((OrtStatus * (*)(const char*, OrtCustomOpDomain**)) FN(I_CreateCustomOpDomain))("ai.warmstart", &g_domain);
        if (s == NULL) s = ((OrtStatus * (*)(OrtCustomOpDomain*, const OrtCustomOp*)) FN(I_CustomOpDomain_Add))(g_domain, &g_op);
        if (s == NULL) s = ((OrtStatus * (*)(OrtCustomOpDomain*, const OrtCustomOp*)) FN(I_CustomOpDomain_Add))(g_domain, &g_op_q8);
        if (s != NULL) g_domain = NULL;
    }
    if (s == NULL) s = ((OrtStatus * (*)(OrtSessionOptions*, OrtCustomOpDomain*)) FN(I_AddCustomOpDomain))(options, g_domain);
    __atomic_clear(&lock, __ATOMIC_RELEASE);
    return s;
}

/* The kernel's code path, for the benches' reports (ctypes). */
WS_EXPORT int ws_q4_op_isa(void) { return ws_q4_isa(); }
