// The GEMM on the GPU: one cuBLASLt matmul with its epilogue.
//
// Row-major D[m, n] = op_B(B) @ op_A(A) is, read column-major, the cuBLAS product
// D^T (n x m) = op(A) (n x k) * op(B) (k x m) with cuBLAS's transa/transb equal
// to ours: the storage of A and B is handed over as is (Transformer Engine's
// convention). FP8 operands arrive already in cuBLASLt's "TN" form (gemm.cpp
// picked the column-wise copies).
#include <cuda_runtime.h>

#include <array>
#include <cstring>
#include <initializer_list>
#include <list>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "common/cuda_utils.h"
#include "common/dtype.h"
#include "ops/gemm/cublaslt_api.h"
#include "ops/gemm/gemm_params.h"

namespace opente {
namespace {

cudaDataType_t cuda_dtype(te_dtype d) {
  switch (d) {
    case TE_DTYPE_FLOAT32: return CUDA_R_32F;
    case TE_DTYPE_FLOAT16: return CUDA_R_16F;
    case TE_DTYPE_BFLOAT16: return CUDA_R_16BF;
    case TE_DTYPE_FLOAT8_E4M3: return CUDA_R_8F_E4M3;
    case TE_DTYPE_FLOAT8_E5M2: return CUDA_R_8F_E5M2;
    default: fail(TE_ERROR_INTERNAL, concat("gemm: no cudaDataType for ", dtype_name(d)));
  }
}

cublasLtEpilogue_t cublas_epilogue(te_gemm_epilogue e) {
  switch (e) {
    case TE_GEMM_EPILOGUE_NONE: return CUBLASLT_EPILOGUE_DEFAULT;
    case TE_GEMM_EPILOGUE_BIAS: return CUBLASLT_EPILOGUE_BIAS;
    case TE_GEMM_EPILOGUE_GELU_AUX: return CUBLASLT_EPILOGUE_GELU_AUX;
    case TE_GEMM_EPILOGUE_GELU_AUX_BIAS: return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case TE_GEMM_EPILOGUE_DGELU: return CUBLASLT_EPILOGUE_DGELU;
    case TE_GEMM_EPILOGUE_DGELU_BGRAD: return CUBLASLT_EPILOGUE_DGELU_BGRAD;
    case TE_GEMM_EPILOGUE_BGRAD: return CUBLASLT_EPILOGUE_BGRADB;
  }
  fail(TE_ERROR_INTERNAL, "gemm: unknown epilogue");
}

// Largest power of two (up to 256) dividing the address: cuBLASLt picks kernels by
// operand alignment, so it is part of the algorithm cache key.
int alignment_of(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  int align = 256;
  while (align > 1 && a % align != 0) align /= 2;
  return align;
}

// cuBLASLt handles, one per device, created on first use and kept for the process.
cublasLtHandle_t handle_for(int device) {
  constexpr int kMaxDevices = 64;
  static std::mutex mutex;
  static std::array<cublasLtHandle_t, kMaxDevices> handles{};
  OPENTE_CHECK_ARG(device >= 0 && device < kMaxDevices, "device index ", device, " is out of range");
  std::lock_guard<std::mutex> lock(mutex);
  if (!handles[device]) cublas_check(cublaslt_api().create(&handles[device]), "cublasLtCreate");
  return handles[device];
}

// Everything that decides which cuBLASLt algorithm is valid and fast. Plain
// bytes (zero-initialised, no padding surprises): hashed and compared as such.
struct AlgoKey {
  int32_t device;
  int32_t a_dtype, b_dtype, d_dtype, bias_dtype, aux_dtype;
  int32_t transa, transb, epilogue, fast_accum, beta_nonzero;
  int32_t align_a, align_b, align_d;
  int32_t has_d_amax;   // the descriptor of a cached plan carries an amax pointer or not
  int32_t zero_padding; // keeps the int64s aligned without compiler padding; always 0
  int64_t m, n, k;
  uint64_t workspace_size;
  bool operator==(const AlgoKey& o) const { return std::memcmp(this, &o, sizeof(AlgoKey)) == 0; }
};
static_assert(sizeof(AlgoKey) == 16 * 4 + 4 * 8, "AlgoKey must have no padding");

struct AlgoKeyHash {
  size_t operator()(const AlgoKey& key) const {
    const auto* bytes = reinterpret_cast<const unsigned char*>(&key);
    uint64_t h = 1469598103934665603ull;  // FNV-1a
    for (size_t i = 0; i < sizeof(AlgoKey); ++i) h = (h ^ bytes[i]) * 1099511628211ull;
    return size_t(h);
  }
};

// Destroys a cuBLASLt preference at scope exit, also when a check throws.
template <class T, cublasStatus_t (*Destroy)(T)>
struct Owned {
  T value = nullptr;
  ~Owned() {
    if (value) Destroy(value);
  }
};
cublasStatus_t destroy_pref(cublasLtMatmulPreference_t p) { return cublaslt_api().pref_destroy(p); }
using OwnedPref = Owned<cublasLtMatmulPreference_t, destroy_pref>;

template <class T>
void set_desc(const CublasLtApi& api, cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const T& value,
              const char* what) {
  cublas_check(api.desc_set(desc, attr, &value, sizeof(value)), what);
}

// The problem in words, for error messages only: built when a call fails, not on
// every call (a dozen string appends per GEMM showed in the host time of small layers).
std::string describe_problem(const GemmParams& p) {
  return concat(dtype_name(p.a.dtype), " x ", dtype_name(p.b.dtype), " -> ", dtype_name(p.d_dtype), ", m=", p.m,
                " n=", p.n, " k=", p.k, ", transa=", int(p.a.trans), " transb=", int(p.b.trans), ", epilogue ",
                int(p.epilogue), p.bias ? concat(", bias ", dtype_name(p.bias_dtype)) : std::string(),
                p.aux ? concat(", aux ", dtype_name(p.aux_dtype)) : std::string(),
                p.bias_grad ? concat(", bias_grad ", dtype_name(p.bias_grad_dtype)) : std::string());
}

// cublas_check naming the problem, which is described only if the call failed.
void cublas_check_problem(cublasStatus_t status, const char* call, const GemmParams& p) {
  if (status != CUBLAS_STATUS_SUCCESS) cublas_check(status, call, describe_problem(p).c_str());
}

// The heuristic's first choice for this key, queried once and then cached.
cublasLtMatmulAlgo_t pick_algo(const CublasLtApi& api, cublasLtHandle_t handle, const AlgoKey& key,
                               cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                               cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d, const GemmParams& p) {
  static std::mutex mutex;
  static std::unordered_map<AlgoKey, cublasLtMatmulAlgo_t, AlgoKeyHash> cache;
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
  }
  OwnedPref pref;
  cublas_check(api.pref_create(&pref.value), "cublasLtMatmulPreferenceCreate");
  const uint64_t workspace = key.workspace_size;
  cublas_check(api.pref_set(pref.value, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof(workspace)),
               "cublasLtMatmulPreferenceSetAttribute");
  const uint32_t aligns[3] = {uint32_t(key.align_a), uint32_t(key.align_b), uint32_t(key.align_d)};
  const cublasLtMatmulPreferenceAttributes_t align_attrs[3] = {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                               CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                               CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  for (int i = 0; i < 3; ++i) {
    cublas_check(api.pref_set(pref.value, align_attrs[i], &aligns[i], sizeof(aligns[i])),
                 "cublasLtMatmulPreferenceSetAttribute");
  }
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t status = api.heuristic(handle, desc, a, b, c, d, pref.value, 1, &result, &found);
  if (status == CUBLAS_STATUS_INVALID_VALUE) {
    // The heuristic sees the descriptors, no data: a value it calls invalid is a combination
    // of dtypes and epilogue cuBLASLt does not take (a bf16 GEMM's dGELU epilogue with an
    // fp16 bias, found by test_bad_input_fuzz.py), refused by name like one it does not support.
    fail(TE_ERROR_NOT_IMPLEMENTED, concat("cuBLASLt does not take ", describe_problem(p),
                                          " (cublasLtMatmulAlgoGetHeuristic: ", api.status_string(status), ")"));
  }
  cublas_check_problem(status, "cublasLtMatmulAlgoGetHeuristic", p);
  if (found == 0) fail(TE_ERROR_NOT_IMPLEMENTED, concat("cuBLASLt has no algorithm for ", describe_problem(p)));
  std::lock_guard<std::mutex> lock(mutex);
  cache.emplace(key, result.algo);
  return result.algo;
}

// The cuBLASLt handle of `device` for this thread: handle_for's, remembered without its mutex.
cublasLtHandle_t thread_handle_for(int device) {
  constexpr int kMaxDevices = 64;
  thread_local std::array<cublasLtHandle_t, kMaxDevices> handles{};
  if (device >= 0 && device < kMaxDevices && handles[device]) return handles[device];
  const cublasLtHandle_t handle = handle_for(device);  // checks the index
  handles[device] = handle;
  return handle;
}

AlgoKey algo_key(const GemmParams& p, int device, size_t workspace_size) {
  AlgoKey key{};
  key.device = device;
  key.a_dtype = p.a.dtype;
  key.b_dtype = p.b.dtype;
  key.d_dtype = p.d_dtype;
  key.bias_dtype = p.bias ? p.bias_dtype : p.bias_grad ? p.bias_grad_dtype : -1;
  key.aux_dtype = p.aux ? p.aux_dtype : -1;
  key.transa = p.a.trans;
  key.transb = p.b.trans;
  key.epilogue = p.epilogue;
  key.fast_accum = is_fp8(p.a.dtype) && !p.split_accumulator;
  key.beta_nonzero = p.beta != 0.0f;
  key.align_a = alignment_of(p.a.data);
  key.align_b = alignment_of(p.b.data);
  key.align_d = alignment_of(p.d);
  key.has_d_amax = is_fp8(p.d_dtype) && p.d_amax != nullptr;
  key.m = p.m;
  key.n = p.n;
  key.k = p.k;
  key.workspace_size = workspace_size;
  return key;
}

// Everything of one matmul that depends only on its AlgoKey: the descriptor with its
// non-pointer attributes, the four layouts and the algorithm (picked by the first call,
// once the descriptor has its pointers, as the heuristic always saw it). Building these
// took more host time than the launch itself for small GEMMs, so they are made once per
// key; a call only sets the pointer attributes (scales, bias, aux, amax) before the matmul.
// cublasLtMatmul reads the descriptor when it is called, so changing the pointers for
// the next call cannot affect a matmul already queued (nor one captured in a graph).
struct MatmulPlan {
  const CublasLtApi* api = nullptr;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool has_algo = false;

  MatmulPlan() = default;
  MatmulPlan(const MatmulPlan&) = delete;
  MatmulPlan& operator=(const MatmulPlan&) = delete;
  ~MatmulPlan() {
    for (cublasLtMatrixLayout_t layout : {a, b, c, d}) {
      if (layout) api->layout_destroy(layout);
    }
    if (desc) api->desc_destroy(desc);
  }
};

std::unique_ptr<MatmulPlan> make_plan(const CublasLtApi& api, const GemmParams& p) {
  auto plan = std::make_unique<MatmulPlan>();
  plan->api = &api;  // the loaded library stays for the process
  cublas_check(api.desc_create(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
  const cublasLtMatmulDesc_t desc = plan->desc;
  const cublasOperation_t ta = p.a.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = p.b.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  set_desc(api, desc, CUBLASLT_MATMUL_DESC_TRANSA, ta, "set TRANSA");
  set_desc(api, desc, CUBLASLT_MATMUL_DESC_TRANSB, tb, "set TRANSB");
  set_desc(api, desc, CUBLASLT_MATMUL_DESC_EPILOGUE, cublas_epilogue(p.epilogue), "set EPILOGUE");
  if (is_fp8(p.a.dtype)) {
    // split accumulator = cuBLASLt's precise mode; fast accumulation skips the promotions
    const int8_t fast_accum = p.split_accumulator ? 0 : 1;
    set_desc(api, desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, fast_accum, "set FAST_ACCUM");
  }
  if (p.bias || p.bias_grad) {
    const int32_t bias_type = cuda_dtype(p.bias ? p.bias_dtype : p.bias_grad_dtype);
    set_desc(api, desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, bias_type, "set BIAS_DATA_TYPE");
  }
  if (p.aux) {
    const int64_t aux_ld = p.n;  // aux is [m, n] row-major: n x m column-major
    set_desc(api, desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, aux_ld, "set EPILOGUE_AUX_LD");
    const int32_t aux_type = cuda_dtype(p.aux_dtype);
    set_desc(api, desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, aux_type, "set EPILOGUE_AUX_DATA_TYPE");
  }

  // Column-major views of the row-major storage (see the top of this file).
  const int64_t a_rows = p.a.trans ? p.k : p.n, a_cols = p.a.trans ? p.n : p.k;
  const int64_t b_rows = p.b.trans ? p.m : p.k, b_cols = p.b.trans ? p.k : p.m;
  cublas_check(api.layout_create(&plan->a, cuda_dtype(p.a.dtype), a_rows, a_cols, a_rows), "layout A");
  cublas_check(api.layout_create(&plan->b, cuda_dtype(p.b.dtype), b_rows, b_cols, b_rows), "layout B");
  cublas_check(api.layout_create(&plan->d, cuda_dtype(p.d_dtype), p.n, p.m, p.n), "layout D");
  // C is D (beta accumulates in place). An FP8 D takes a bf16 C type, which
  // cuBLASLt requires there, and no C pointer: beta is 0, so C is never read, and
  // C may alias D only when their layouts match.
  const cudaDataType_t c_type = is_fp8(p.d_dtype) ? CUDA_R_16BF : cuda_dtype(p.d_dtype);
  cublas_check(api.layout_create(&plan->c, c_type, p.n, p.m, p.n), "layout C");
  return plan;
}

// This thread's plans, the most recently used first, at most kMaxPlans (the least
// recently used is destroyed beyond that). Per thread, so neither a lock nor a race on
// the pointer attributes set per call; the algorithms are still found once per process
// (pick_algo's shared cache).
class PlanCache {
 public:
  static constexpr size_t kMaxPlans = 64;

  MatmulPlan& get(const CublasLtApi& api, const AlgoKey& key, const GemmParams& p) {
    auto it = index_.find(key);
    if (it != index_.end()) {
      if (it->second != plans_.begin()) plans_.splice(plans_.begin(), plans_, it->second);
      return *it->second->second;
    }
    std::unique_ptr<MatmulPlan> plan = make_plan(api, p);  // throws before anything is stored
    if (plans_.size() >= kMaxPlans) {
      index_.erase(plans_.back().first);
      plans_.pop_back();
    }
    plans_.emplace_front(key, std::move(plan));
    index_.emplace(key, plans_.begin());
    return *plans_.front().second;
  }

 private:
  using Entry = std::pair<AlgoKey, std::unique_ptr<MatmulPlan>>;
  std::list<Entry> plans_;
  std::unordered_map<AlgoKey, std::list<Entry>::iterator, AlgoKeyHash> index_;
};

MatmulPlan& thread_plan_for(const CublasLtApi& api, const AlgoKey& key, const GemmParams& p) {
  thread_local PlanCache cache;
  return cache.get(api, key, p);
}

// A product over k = 0 is zero, so D is the epilogue of beta * D. cuBLASLt runs that for
// float operands, but refuses FP8 operands and the bias-gradient epilogue at k = 0 (a
// batch with no tokens reaches the wgrad GEMM so). Written here where it is only zeros
// or D left as it is: returns false for what needs arithmetic (a bias, or an epilogue
// over an accumulated D), which cuBLASLt then runs or names.
bool gemm_over_empty_k(const GemmParams& p, cudaStream_t s) {
  if (epilogue_has_bias(p.epilogue)) return false;
  const bool keeps_d = p.beta == 1.0f;  // accumulating: D = D (+ an epilogue of it)
  if (!keeps_d && p.beta != 0.0f) return false;
  if (keeps_d && p.epilogue != TE_GEMM_EPILOGUE_NONE && p.epilogue != TE_GEMM_EPILOGUE_BGRAD) return false;
  const auto zero = [s](void* ptr, size_t bytes) { cuda_check(cudaMemsetAsync(ptr, 0, bytes, s), "cudaMemsetAsync"); };
  const size_t mn = size_t(p.m) * size_t(p.n);
  // P = 0: D = 0, gelu(0) = 0 and 0 * gelu'(aux) = 0; FP8 zero is the zero byte.
  if (!keeps_d) zero(p.d, mn * dtype_size(p.d_dtype));
  if (epilogue_writes_aux(p.epilogue)) zero(p.aux, mn * dtype_size(p.aux_dtype));
  if (p.bias_grad) {  // sums over no rows (BGRAD: over k; DGELU_BGRAD: of D's zero rows)
    const int64_t len = p.epilogue == TE_GEMM_EPILOGUE_BGRAD ? p.m : p.n;
    zero(p.bias_grad, size_t(len) * dtype_size(p.bias_grad_dtype));
  }
  if (p.d_amax) zero(p.d_amax, sizeof(float));  // an FP8 D has beta 0: all zeros
  return true;
}

}  // namespace

void gemm_cuda(const GemmParams& p, int device, void* workspace, size_t workspace_size, void* stream) {
  DeviceGuard guard(device);
  const cudaStream_t s = as_stream(stream);
  if (p.m == 0 || p.n == 0) {
    // Nothing to multiply; a DGELU bias gradient over no rows is zero, while BGRAD
    // over an empty D would still sum B, which cuBLASLt cannot do without a D.
    if (p.epilogue == TE_GEMM_EPILOGUE_DGELU_BGRAD && p.n > 0) {
      cuda_check(cudaMemsetAsync(p.bias_grad, 0, size_t(p.n) * dtype_size(p.bias_grad_dtype), s), "cudaMemsetAsync");
    }
    if (p.d_amax) cuda_check(cudaMemsetAsync(p.d_amax, 0, sizeof(float), s), "cudaMemsetAsync");  // max over nothing
    if (p.epilogue == TE_GEMM_EPILOGUE_BGRAD && p.m > 0) {
      fail(TE_ERROR_NOT_IMPLEMENTED,
           "te_gemm on CUDA: epilogue bgrad with an empty D (out has n = 0 columns; cuBLASLt sums B only into a D)");
    }
    return;
  }
  if (p.k == 0 && (is_fp8(p.a.dtype) || p.epilogue == TE_GEMM_EPILOGUE_BGRAD) && gemm_over_empty_k(p, s)) return;
  const CublasLtApi& api = cublaslt_api();
  const cublasLtHandle_t handle = thread_handle_for(device);
  const AlgoKey key = algo_key(p, device, workspace_size);
  MatmulPlan& plan = thread_plan_for(api, key, p);

  // The per-call pointers; everything else in the descriptor belongs to the key.
  if (is_fp8(p.a.dtype)) {
    set_desc(api, plan.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, p.a.scale_inv, "set A_SCALE_POINTER");
    set_desc(api, plan.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, p.b.scale_inv, "set B_SCALE_POINTER");
  }
  const bool fp8_out = is_fp8(p.d_dtype);
  if (fp8_out) {
    set_desc(api, plan.desc, CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, p.d_scale, "set D_SCALE_POINTER");
    if (p.d_amax) set_desc(api, plan.desc, CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, p.d_amax, "set AMAX_D_POINTER");
  }
  const void* bias_or_grad = p.bias ? p.bias : p.bias_grad;
  if (bias_or_grad) set_desc(api, plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias_or_grad, "set BIAS_POINTER");
  if (p.aux) set_desc(api, plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, p.aux, "set EPILOGUE_AUX_POINTER");

  if (!plan.has_algo) {  // a failed pick leaves the plan without one: the next call asks again
    plan.algo = pick_algo(api, handle, key, plan.desc, plan.a, plan.b, plan.c, plan.d, p);
    plan.has_algo = true;
  }
  // An FP8 D has no C pointer (see make_plan).
  const void* c_data = fp8_out ? nullptr : p.d;
  cublas_check_problem(api.matmul(handle, plan.desc, &p.alpha, p.a.data, plan.a, p.b.data, plan.b, &p.beta, c_data,
                                  plan.c, p.d, plan.d, &plan.algo, workspace, workspace_size, s),
                       "cublasLtMatmul", p);
}

}  // namespace opente
