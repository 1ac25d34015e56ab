// Global -> shared copies that do not pass through registers (cp.async, Ampere and
// later): a kernel can have the next data in flight while it works on the current,
// at no cost in registers. PTX, not __pipeline_memcpy_async: the compiler turned
// that back into plain loads.
#pragma once

#include <stdint.h>

namespace opente {

// 16 bytes, both addresses 16-byte aligned; cached in L2 only (.cg).
__device__ __forceinline__ void copy_async_16(void* smem_dst, const void* global_src) {
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(global_src) : "memory");
}

// As copy_async_16 where `valid`; else the 16 bytes at smem_dst become zeros and
// nothing is read (global_src must still be a mapped address: the caller passes a
// fallback there, so no out-of-bounds address ever reaches the instruction).
__device__ __forceinline__ void copy_async_16_or_zero(void* smem_dst, const void* global_src, bool valid) {
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem_dst));
  const uint32_t src_bytes = valid ? 16u : 0u;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(global_src), "r"(src_bytes)
               : "memory");
}

// Closes the group of this thread's copies issued since the last commit.
__device__ __forceinline__ void commit_async_copies() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

// Waits until at most kPending of this thread's committed groups are still in
// flight; the data of the others is then visible to this thread (to others only
// after a barrier).
template <int kPending>
__device__ __forceinline__ void wait_async_copies() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

__device__ __forceinline__ void wait_all_async_copies() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

}  // namespace opente
