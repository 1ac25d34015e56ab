// Fused attention ops of transformer_engine._core (see opente/fused_attn.h).
// Optional tensors are None; strides travel as flat lists of ints (q's, k's, v's
// and o's [b, h, s, d] strides: 16 values) to keep the per-call overhead low.
#include <nanobind/nanobind.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <string>
#include <vector>

#include "binding/binding_util.h"
#include "opente/opente.h"

namespace nb = nanobind;
using opente_binding::as_ptr;
using opente_binding::call_core;

namespace {

te_attn_strides strides_from(const std::vector<int64_t>& flat, const char* name) {
  if (flat.size() != 16) {
    throw nb::value_error((std::string(name) + " must hold 16 ints (the [b, h, s, d] strides of 4 operands), got " +
                           std::to_string(flat.size()))
                              .c_str());
  }
  te_attn_strides s{};
  for (int i = 0; i < 4; ++i) {
    s.q[i] = flat[i];
    s.k[i] = flat[4 + i];
    s.v[i] = flat[8 + i];
    s.o[i] = flat[12 + i];
  }
  return s;
}

te_fused_attn_config config_from(int32_t mask_type, int32_t bias_type, int64_t window_left, int64_t window_right,
                                 float softmax_scale, float dropout, bool deterministic) {
  return te_fused_attn_config{mask_type,     bias_type, window_left,          window_right,
                              softmax_scale, dropout,   deterministic ? 1 : 0};
}

#define OPENTE_CONFIG_ARGS                                                                     \
  nb::arg("mask_type"), nb::arg("bias_type"), nb::arg("window_left"), nb::arg("window_right"), \
      nb::arg("softmax_scale"), nb::arg("dropout"), nb::arg("deterministic")

}  // namespace

void bind_fused_attn(nb::module_& m) {
  nb::enum_<te_attn_mask_type>(m, "AttnMaskType", nb::is_arithmetic(), "Mask types (NVTE_Mask_Type numbering)")
      .value("NO_MASK", TE_ATTN_MASK_NO_MASK)
      .value("PADDING", TE_ATTN_MASK_PADDING)
      .value("CAUSAL", TE_ATTN_MASK_CAUSAL)
      .value("PADDING_CAUSAL", TE_ATTN_MASK_PADDING_CAUSAL)
      .value("CAUSAL_BOTTOM_RIGHT", TE_ATTN_MASK_CAUSAL_BOTTOM_RIGHT)
      .value("PADDING_CAUSAL_BOTTOM_RIGHT", TE_ATTN_MASK_PADDING_CAUSAL_BOTTOM_RIGHT);
  nb::enum_<te_attn_bias_type>(m, "AttnBiasType", nb::is_arithmetic(), "Bias types (NVTE_Bias_Type numbering)")
      .value("NO_BIAS", TE_ATTN_BIAS_NONE)
      .value("PRE_SCALE_BIAS", TE_ATTN_BIAS_PRE_SCALE)
      .value("POST_SCALE_BIAS", TE_ATTN_BIAS_POST_SCALE)
      .value("ALIBI", TE_ATTN_BIAS_ALIBI);

  m.def(
      "cudnn_frontend_version", [] { return te_cudnn_frontend_version(); },
      "The cudnn-frontend version this build has (e.g. 13200), 0 without cuDNN fused attention");
  m.def(
      "cudnn_version",
      [] {
        int64_t version = 0;
        call_core([&] { return te_cudnn_version(&version); });
        return version;
      },
      "Loads cuDNN and returns its version (e.g. 91900); raises when it cannot be loaded");

  m.def(
      "fused_attn_fwd_workspace_size",
      [](int32_t mask_type, int32_t bias_type, int64_t window_left, int64_t window_right, float softmax_scale,
         float dropout, bool deterministic, const te_tensor& q, const te_tensor& k, const te_tensor& v,
         const te_tensor* bias, const te_tensor* seqlens_q, const te_tensor* seqlens_kv, const te_tensor* rng_state,
         const te_tensor& o, const te_tensor* stats, const std::vector<int64_t>& strides) {
        const te_fused_attn_config config =
            config_from(mask_type, bias_type, window_left, window_right, softmax_scale, dropout, deterministic);
        const te_attn_strides s = strides_from(strides, "strides");
        size_t size = 0;
        call_core([&] {
          return te_fused_attn_fwd_workspace_size(&config, &q, &k, &v, bias, seqlens_q, seqlens_kv, rng_state, &o,
                                                  stats, &s, &size);
        });
        return size;
      },
      OPENTE_CONFIG_ARGS, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("bias").none(), nb::arg("seqlens_q").none(),
      nb::arg("seqlens_kv").none(), nb::arg("rng_state").none(), nb::arg("o"), nb::arg("stats").none(),
      nb::arg("strides"));

  m.def(
      "fused_attn_fwd",
      [](int32_t mask_type, int32_t bias_type, int64_t window_left, int64_t window_right, float softmax_scale,
         float dropout, bool deterministic, const te_tensor& q, const te_tensor& k, const te_tensor& v,
         const te_tensor* bias, const te_tensor* seqlens_q, const te_tensor* seqlens_kv, const te_tensor* rng_state,
         const te_tensor& o, const te_tensor* stats, const std::vector<int64_t>& strides, uintptr_t workspace,
         size_t workspace_size, uintptr_t stream) {
        const te_fused_attn_config config =
            config_from(mask_type, bias_type, window_left, window_right, softmax_scale, dropout, deterministic);
        const te_attn_strides s = strides_from(strides, "strides");
        call_core([&] {
          return te_fused_attn_fwd(&config, &q, &k, &v, bias, seqlens_q, seqlens_kv, rng_state, &o, stats, &s,
                                   as_ptr<void>(workspace), workspace_size, as_ptr<void>(stream));
        });
      },
      OPENTE_CONFIG_ARGS, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("bias").none(), nb::arg("seqlens_q").none(),
      nb::arg("seqlens_kv").none(), nb::arg("rng_state").none(), nb::arg("o"), nb::arg("stats").none(),
      nb::arg("strides"), nb::arg("workspace") = 0, nb::arg("workspace_size") = 0, nb::arg("stream") = 0);

  m.def(
      "fused_attn_bwd_workspace_size",
      [](int32_t mask_type, int32_t bias_type, int64_t window_left, int64_t window_right, float softmax_scale,
         float dropout, bool deterministic, const te_tensor& q, const te_tensor& k, const te_tensor& v,
         const te_tensor& o, const te_tensor& d_o, const te_tensor& stats, const te_tensor* bias,
         const te_tensor* seqlens_q, const te_tensor* seqlens_kv, const te_tensor* rng_state, const te_tensor& dq,
         const te_tensor& dk, const te_tensor& dv, const te_tensor* dbias, const std::vector<int64_t>& strides,
         const std::vector<int64_t>& grad_strides) {
        const te_fused_attn_config config =
            config_from(mask_type, bias_type, window_left, window_right, softmax_scale, dropout, deterministic);
        const te_attn_strides s = strides_from(strides, "strides");
        const te_attn_strides gs = strides_from(grad_strides, "grad_strides");
        size_t size = 0;
        call_core([&] {
          return te_fused_attn_bwd_workspace_size(&config, &q, &k, &v, &o, &d_o, &stats, bias, seqlens_q, seqlens_kv,
                                                  rng_state, &dq, &dk, &dv, dbias, &s, &gs, &size);
        });
        return size;
      },
      OPENTE_CONFIG_ARGS, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("o"), nb::arg("d_o"), nb::arg("stats"),
      nb::arg("bias").none(), nb::arg("seqlens_q").none(), nb::arg("seqlens_kv").none(), nb::arg("rng_state").none(),
      nb::arg("dq"), nb::arg("dk"), nb::arg("dv"), nb::arg("dbias").none(), nb::arg("strides"),
      nb::arg("grad_strides"));

  m.def(
      "fused_attn_bwd",
      [](int32_t mask_type, int32_t bias_type, int64_t window_left, int64_t window_right, float softmax_scale,
         float dropout, bool deterministic, const te_tensor& q, const te_tensor& k, const te_tensor& v,
         const te_tensor& o, const te_tensor& d_o, const te_tensor& stats, const te_tensor* bias,
         const te_tensor* seqlens_q, const te_tensor* seqlens_kv, const te_tensor* rng_state, const te_tensor& dq,
         const te_tensor& dk, const te_tensor& dv, const te_tensor* dbias, const std::vector<int64_t>& strides,
         const std::vector<int64_t>& grad_strides, uintptr_t workspace, size_t workspace_size, uintptr_t stream) {
        const te_fused_attn_config config =
            config_from(mask_type, bias_type, window_left, window_right, softmax_scale, dropout, deterministic);
        const te_attn_strides s = strides_from(strides, "strides");
        const te_attn_strides gs = strides_from(grad_strides, "grad_strides");
        call_core([&] {
          return te_fused_attn_bwd(&config, &q, &k, &v, &o, &d_o, &stats, bias, seqlens_q, seqlens_kv, rng_state, &dq,
                                   &dk, &dv, dbias, &s, &gs, as_ptr<void>(workspace), workspace_size,
                                   as_ptr<void>(stream));
        });
      },
      OPENTE_CONFIG_ARGS, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("o"), nb::arg("d_o"), nb::arg("stats"),
      nb::arg("bias").none(), nb::arg("seqlens_q").none(), nb::arg("seqlens_kv").none(), nb::arg("rng_state").none(),
      nb::arg("dq"), nb::arg("dk"), nb::arg("dv"), nb::arg("dbias").none(), nb::arg("strides"), nb::arg("grad_strides"),
      nb::arg("workspace") = 0, nb::arg("workspace_size") = 0, nb::arg("stream") = 0);
}
