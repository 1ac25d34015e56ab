// Small FP8 casts, a whole tensor to one block. Where a training step's layers are
// small, the host's time per launch sets the pace, not the GPU's: the usual kernels
// cost current scaling four launches a cast (a memset, the amax, the scale, the cast)
// and every cast at least one. Here one block reduces its tensor's amax, computes the
// scale and casts (current scaling), or casts with the given scale and raises the
// amax (delayed), and a group of casts (a layer's input and weight) shares one launch,
// a block each. Same arithmetic as the other cast kernels, bit for bit.
//
// Each block reads its job's dtypes at run time, so one launch takes jobs of any
// dtypes: an fp32 weight's cast next to a bf16 input's (fp32 parameters under
// torch.autocast), and plain conversions (a float output), such as the bias a
// layer's FP8 GEMM reads in bf16.
#include <algorithm>

#include "common/cuda_elements.cuh"
#include "common/cuda_reduce.cuh"
#include "common/cuda_utils.h"
#include "common/dtype.h"
#include "ops/quantize/quantize_params.h"
#include "ops/quantize/vector_cast.cuh"
#include "ops/recipe/scale_math.h"

namespace opente {
namespace {

// 16384 elements: 64 KiB of fp32 in, four 64 x 64 tiles of 512 threads a pass. Past
// that, a block alone takes longer than a launch of the many-block kernels costs.
constexpr int64_t kSmallQuantizeElements = 16384;
constexpr int kThreads = 512;
constexpr int kTile = 64;                  // a 64 x 64 tile a pass,
constexpr int kSegmentsPerRow = kTile / 8;  // each thread one row segment of 8 elements
static_assert(kThreads == kTile * kSegmentsPerRow, "one segment a thread");
// Jobs travel in the kernel's parameters (under 1 KiB of the 4 KiB allowed).
constexpr int kJobsPerLaunch = 8;

struct JobBatch {
  QuantizeJob jobs[kJobsPerLaunch];
};

// Shared memory of a block, declared once in the kernel: each dtype's instantiation
// of the job bodies would otherwise declare its own arrays, and three of them
// would pass the 48 KiB a kernel's static shared memory may take.
struct SmallJobScratch {
  float partial[kThreads * 8];  // column_sums: [groups][cols], groups * cols <= kThreads * 8
  // The transposed tile: row c holds column c of the tile, 8 bytes of padding keeping
  // the 8-byte reads of its rows aligned.
  alignas(8) uint8_t tile_t[kTile][kTile + 8];
};

// dbias[c] = the sum over rows of in[r, c], for the block's whole tensor (rows * cols
// <= kSmallQuantizeElements, cols a multiple of 8), in a fixed order: each thread adds
// up an 8-column segment over every groups-th row (at most four rows, as rows * cols is
// bounded), then the groups' partials of a column are added in group order with a
// compensated sum, so a long column loses no more than a few roundings.
template <class In>
__device__ void column_sums(const In* in, int64_t rows, int64_t cols, void* dbias, te_dtype dbias_dtype,
                            float* partial) {
  const int segments = int(cols / 8);  // <= 256: cols <= kSmallQuantizeElements / 8
  const int groups = kThreads / segments;
  const int segment = threadIdx.x % segments, group = threadIdx.x / segments;
  if (group < groups) {
    float sums[8] = {};
    for (int64_t r = group; r < rows; r += groups) {
      const Vec8<In> x = *reinterpret_cast<const Vec8<In>*>(in + r * cols + segment * 8);
#pragma unroll
      for (int k = 0; k < 8; ++k) sums[k] += to_float(x.v[k]);
    }
#pragma unroll
    for (int k = 0; k < 8; ++k) partial[group * cols + segment * 8 + k] = sums[k];
  }
  __syncthreads();
  for (int64_t c = threadIdx.x; c < cols; c += kThreads) {
    KahanSum total;
    for (int g = 0; g < groups; ++g) total.add(partial[g * cols + c]);
    if (dbias_dtype == TE_DTYPE_FLOAT32) {
      static_cast<float*>(dbias)[c] = total.sum;
    } else {
      static_cast<In*>(dbias)[c] = from_float<In>(total.sum);
    }
  }
}

template <class In, te_dtype Out>
__device__ void cast_job(const QuantizeJob& job, SmallJobScratch& scratch) {
  const QuantizeParams& p = job.cast;
  const auto* in = static_cast<const In*>(p.input);
  const int64_t rows = p.rows, cols = p.cols;
  float scale;
  if (job.scale_out) {  // current scaling: the amax first, then the scale from it
    float amax = 0.0f;
    const auto* vin = reinterpret_cast<const Vec8<In>*>(in);
    for (int64_t s = threadIdx.x; s < rows * cols / 8; s += kThreads) {
      const Vec8<In> x = vin[s];
#pragma unroll
      for (int k = 0; k < 8; ++k) amax = fmaxf(amax, fabsf(to_float(x.v[k])));  // fmaxf skips NaN
    }
    amax = block_max<kThreads>(amax);
    scale = current_scale(amax, job.fp8_max, job.epsilon, job.force_pow_2_scales);
    if (threadIdx.x == 0) {
      *job.amax_out = amax;
      *job.scale_out = scale;
    }
  } else {
    scale = *p.scale;
  }

  auto& tile_t = scratch.tile_t;
  auto* out = static_cast<uint8_t*>(p.output);
  auto* out_t = static_cast<uint8_t*>(p.output_t);
  const int tr = threadIdx.x / kSegmentsPerRow, tc = threadIdx.x % kSegmentsPerRow * 8;
  float local_amax = 0.0f;
  for (int64_t r0 = 0; r0 < rows; r0 += kTile) {
    for (int64_t c0 = 0; c0 < cols; c0 += kTile) {
      // rows and cols are multiples of 8: a segment is wholly inside or outside
      const int64_t r = r0 + tr, c = c0 + tc;
      uint2 q = make_uint2(0u, 0u);
      if (r < rows && c < cols) {
        q = cast8_to_fp8<Out>(*reinterpret_cast<const Vec8<In>*>(in + r * cols + c), scale, local_amax);
        if (out) *reinterpret_cast<uint2*>(out + r * cols + c) = q;
      }
      if (out_t) {
#pragma unroll
        for (int k = 0; k < 8; ++k) tile_t[tc + k][tr] = uint8_t((k < 4 ? q.x : q.y) >> (8 * (k % 4)));
        __syncthreads();
        // thread t writes 8 rows' bytes of transposed row (column) t / 8
        const int tcol = threadIdx.x / kSegmentsPerRow, trow = threadIdx.x % kSegmentsPerRow * 8;
        if (c0 + tcol < cols && r0 + trow < rows) {
          *reinterpret_cast<uint2*>(out_t + (c0 + tcol) * rows + r0 + trow) =
              *reinterpret_cast<const uint2*>(&tile_t[tcol][trow]);
        }
        __syncthreads();
      }
    }
  }
  if (job.dbias) column_sums(in, rows, cols, job.dbias, job.dbias_dtype, scratch.partial);
  if (p.amax) block_max_to_global<kThreads>(local_amax, p.amax);
  if (p.scale_inv && threadIdx.x == 0) *p.scale_inv = 1.0f / scale;
}

// A conversion job: eight elements a thread and pass (the count is a multiple of 8).
template <class In, class Out>
__device__ void convert_job(const QuantizeParams& p) {
  const auto* in = static_cast<const Vec8<In>*>(p.input);
  auto* out = static_cast<Vec8<Out>*>(p.output);
  for (int64_t s = threadIdx.x; s < p.rows * p.cols / 8; s += kThreads) {
    const Vec8<In> x = in[s];
    Vec8<Out> y;
#pragma unroll
    for (int k = 0; k < 8; ++k) y.v[k] = from_float<Out>(to_float(x.v[k]));
    out[s] = y;
  }
}

// The job's output dtype, as a type: one of the two FP8 casts or a conversion.
template <class In>
__device__ void run_job(const QuantizeJob& job, SmallJobScratch& scratch) {
  switch (job.cast.out_dtype) {
    case TE_DTYPE_FLOAT8_E4M3: return cast_job<In, TE_DTYPE_FLOAT8_E4M3>(job, scratch);
    case TE_DTYPE_FLOAT8_E5M2: return cast_job<In, TE_DTYPE_FLOAT8_E5M2>(job, scratch);
    case TE_DTYPE_FLOAT32: return convert_job<In, float>(job.cast);
    case TE_DTYPE_FLOAT16: return convert_job<In, __half>(job.cast);
    default: return convert_job<In, __nv_bfloat16>(job.cast);  // bfloat16 (checked on the host)
  }
}

__global__ void __launch_bounds__(kThreads) quantize_small_kernel(const __grid_constant__ JobBatch batch) {
  __shared__ SmallJobScratch scratch;
  const QuantizeJob& job = batch.jobs[blockIdx.x];
  switch (job.cast.in_dtype) {  // the same for every thread of the block
    case TE_DTYPE_FLOAT32: return run_job<float>(job, scratch);
    case TE_DTYPE_FLOAT16: return run_job<__half>(job, scratch);
    default: return run_job<__nv_bfloat16>(job, scratch);  // bfloat16 (checked on the host)
  }
}

}  // namespace

bool small_quantize_fits(const QuantizeParams& p) {
  const int64_t n = p.rows * p.cols;
  return n > 0 && n <= kSmallQuantizeElements && p.rows % 8 == 0 && p.cols % 8 == 0 && is_aligned(p.input, 16) &&
         is_aligned(p.output, 8) && is_aligned(p.output_t, 8);
}

bool small_job_fits(const QuantizeJob& job) {
  if (!is_conversion(job)) return small_quantize_fits(job.cast);
  const int64_t n = job.cast.rows * job.cast.cols;
  return n > 0 && n <= kSmallQuantizeElements && n % 8 == 0 && is_aligned(job.cast.input, 16) &&
         is_aligned(job.cast.output, 16);
}

void quantize_small_cuda(const QuantizeJob* jobs, int count, int device, void* stream) {
  if (count == 0) return;
  DeviceGuard guard(device);
  for (int begin = 0; begin < count; begin += kJobsPerLaunch) {
    const int n = std::min(kJobsPerLaunch, count - begin);
    JobBatch batch{};
    std::copy(jobs + begin, jobs + begin + n, batch.jobs);
    quantize_small_kernel<<<n, kThreads, 0, as_stream(stream)>>>(batch);
    check_launch("quantize_small_kernel");
  }
}

void multi_quantize_cuda(const QuantizeJob* jobs, int64_t count, int device, void* stream) {
  // The small jobs go together, whatever their dtypes; every other job is queued on
  // its own, in order.
  QuantizeJob small[kJobsPerLaunch];
  int num_small = 0;
  for (int64_t i = 0; i < count; ++i) {
    const QuantizeJob& job = jobs[i];
    if (small_job_fits(job)) {
      small[num_small++] = job;
      if (num_small == kJobsPerLaunch) {
        quantize_small_cuda(small, num_small, device, stream);
        num_small = 0;
      }
    } else if (is_conversion(job)) {
      convert_cuda(job.cast, device, stream);
    } else if (job.scale_out) {
      quantize_current_scaling_cuda(job, device, stream);
    } else {
      quantize_cuda(job.cast, device, stream);
    }
  }
  quantize_small_cuda(small, num_small, device, stream);
}

}  // namespace opente
