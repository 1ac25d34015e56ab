// te_activation_fwd / te_activation_bwd against the float64 reference of
// activation_reference.h (written from the formulas of opente/activation.h, with
// its per-element error bounds), and their bad-input handling.
// FP8 outputs: each code must be the cast of some value within the bound of
// y * scale, amax within the bound of max|y|, scale_inv exactly 1/scale.
#include <algorithm>
#include <functional>

#include "activation_reference.h"
#include "test_util.h"

namespace {

using namespace tt;

const te_status INV = TE_ERROR_INVALID_ARGUMENT;
const te_status NIMP = TE_ERROR_NOT_IMPLEMENTED;
constexpr uint32_t kPoisonBits = 0xABABABABu;

TEST(Activation, ForwardEveryKindAndDtype) {
  const int64_t d0 = 3, d1 = 5, h = 37, rows = d0 * d1;
  for (const Kind& k : kKinds) {
    const int64_t cols = k.gated ? 2 * h : h;
    for (te_dtype in_t : kFloatTypes) {
      for (te_dtype out_t : kFloatTypes) {
        SCOPED_TRACE(::testing::Message() << k.name << " " << dtype_str(in_t) << " -> " << dtype_str(out_t));
        Buffer xb(rows * cols * elem_size(in_t)), yb(rows * h * elem_size(out_t));
        const std::vector<float> x = random_inputs(xb, in_t, rows * cols, 11 + k.kind);
        te_tensor in = make_tensor(in_t, {d0, d1, cols}, xb.data());
        te_tensor out = make_tensor(out_t, {d0, d1, h}, yb.data());
        ASSERT_EQ(te_activation_fwd(k.kind, &in, &out, nullptr), TE_SUCCESS) << last_error();
        ASSERT_TRUE(yb.guard_intact());
        int bad = 0;
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t c = 0; c < h; ++c) {
            const Ref ref = ref_forward(k, x, r, c, h);
            const double got = value_at(yb, out_t, r * h + c);
            if (!(std::fabs(got - ref.v) <= with_rounding(ref, out_t)) && bad++ < 5) {
              ADD_FAILURE() << "(" << r << ", " << c << "): got " << got << ", want " << ref.v << " +- "
                            << with_rounding(ref, out_t);
            }
          }
        }
        EXPECT_EQ(bad, 0);
      }
    }
  }
}

TEST(Activation, BackwardEveryKindAndDtype) {
  const int64_t d0 = 4, d1 = 6, h = 29, rows = d0 * d1;
  for (const Kind& k : kKinds) {
    const int64_t cols = k.gated ? 2 * h : h;
    for (te_dtype t : kFloatTypes) {
      SCOPED_TRACE(::testing::Message() << k.name << " " << dtype_str(t));
      const size_t es = elem_size(t);
      Buffer xb(rows * cols * es), gb(rows * h * es), db(rows * cols * es);
      const std::vector<float> x = random_inputs(xb, t, rows * cols, 101 + k.kind);
      const std::vector<float> g = random_inputs(gb, t, rows * h, 201 + k.kind);
      te_tensor grad = make_tensor(t, {d0, d1, h}, gb.data());
      te_tensor in = make_tensor(t, {d0, d1, cols}, xb.data());
      te_tensor din = make_tensor(t, {d0, d1, cols}, db.data());
      ASSERT_EQ(te_activation_bwd(k.kind, &grad, &in, &din, nullptr), TE_SUCCESS) << last_error();
      ASSERT_TRUE(db.guard_intact());
      int bad = 0;
      auto check = [&](size_t i, const Ref& ref) {
        const double got = value_at(db, t, i);
        if (!(std::fabs(got - ref.v) <= with_rounding(ref, t)) && bad++ < 5) {
          ADD_FAILURE() << "element " << i << ": got " << got << ", want " << ref.v << " +- "
                        << with_rounding(ref, t);
        }
      };
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < h; ++c) {
          const double gr = g[r * h + c];
          if (!k.gated) {
            check(r * h + c, times(gr, ref_der(k.base, x[r * h + c])));
          } else {
            const double a = x[r * cols + c], b = x[r * cols + h + c];
            Ref da = times(gr * b, ref_der(k.base, a));  // gr * b is exact in double, one fp32 rounding
            da.err += 2 * kU * std::fabs(gr * b * ref_der(k.base, a).v);
            check(r * cols + c, da);
            check(r * cols + h + c, times(gr, ref_act(k.base, a)));
          }
        }
      }
      EXPECT_EQ(bad, 0);
    }
  }
}

TEST(Activation, KnownValues) {
  // gelu(1) = 0.5 (1 + tanh(sqrt(2/pi) * 1.044715)), qgelu(1) = sigmoid(1.702), silu(1) = sigmoid(1)
  const float x[] = {1.0f, -0.0f, -2.0f, 3.0f, NAN};
  const struct {
    te_activation kind;
    double want[4];
  } cases[] = {
      {TE_ACTIVATION_GELU, {0.8411919906082768, 0.0, -0.04540230591222, 2.9963627388}},
      {TE_ACTIVATION_QGELU, {0.8457957659328212, 0.0, -2.0 / (1 + std::exp(3.404)), 3.0 / (1 + std::exp(-5.106))}},
      {TE_ACTIVATION_RELU, {1.0, 0.0, 0.0, 3.0}},
      {TE_ACTIVATION_SRELU, {1.0, 0.0, 0.0, 9.0}},
      {TE_ACTIVATION_SILU, {0.7310585786300049, 0.0, -2.0 / (1 + std::exp(2.0)), 3.0 / (1 + std::exp(-3.0))}},
  };
  for (const auto& c : cases) {
    float y[5];
    te_tensor in = make_tensor(TE_DTYPE_FLOAT32, {5}, const_cast<float*>(x));
    te_tensor out = make_tensor(TE_DTYPE_FLOAT32, {5}, y);
    ASSERT_EQ(te_activation_fwd(c.kind, &in, &out, nullptr), TE_SUCCESS) << last_error();
    for (int i = 0; i < 4; ++i) EXPECT_NEAR(y[i], c.want[i], 1e-6 * (1 + std::fabs(c.want[i]))) << c.kind << " " << i;
    // relu and srelu map -0 to +0; x * (...) keeps the sign of a zero
    const bool relu_like = c.kind == TE_ACTIVATION_RELU || c.kind == TE_ACTIVATION_SRELU;
    EXPECT_EQ(std::signbit(y[1]), !relu_like) << "sign of act(-0) for kind " << c.kind;
    EXPECT_TRUE(std::isnan(y[4])) << "NaN must propagate for kind " << c.kind;
  }
}

TEST(Activation, Fp8Output) {
  const int64_t rows = 9, h = 40;
  for (const Kind& k : kKinds) {
    const int64_t cols = k.gated ? 2 * h : h;
    for (te_dtype out_t : {TE_DTYPE_FLOAT8_E4M3, TE_DTYPE_FLOAT8_E5M2}) {
      for (int layout = 0; layout < 3; ++layout) {  // rowwise, columnwise, both
        SCOPED_TRACE(::testing::Message() << k.name << " " << dtype_str(out_t) << " layout " << layout);
        const Format& f = format_of(out_t);
        Buffer xb(rows * cols * 2), yb(rows * h), ytb(rows * h);
        const std::vector<float> x = random_inputs(xb, TE_DTYPE_BFLOAT16, rows * cols, 7 + k.kind);
        const float scale = out_t == TE_DTYPE_FLOAT8_E4M3 ? 4.0f : 0.5f;
        float scale_inv = f32(kPoisonBits), amax = 0.25f;
        float scale_v = scale;
        te_tensor in = make_tensor(TE_DTYPE_BFLOAT16, {rows, cols}, xb.data());
        te_tensor out = make_tensor(out_t, {rows, h}, layout != 1 ? yb.data() : nullptr, cpu(), TE_SCALING_PER_TENSOR);
        out.columnwise_data = layout != 0 ? ytb.data() : nullptr;
        out.scale = &scale_v;
        out.scale_inv = &scale_inv;
        out.amax = &amax;
        ASSERT_EQ(te_activation_fwd(k.kind, &in, &out, nullptr), TE_SUCCESS) << last_error();
        EXPECT_EQ(scale_inv, 1.0f / scale);
        EXPECT_EQ(yb.all_poison(), layout == 1);
        EXPECT_EQ(ytb.all_poison(), layout == 0);
        EXPECT_TRUE(yb.guard_intact() && ytb.guard_intact());
        double max_abs = 0.25, max_err = 0;
        int bad = 0;
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t c = 0; c < h; ++c) {
            const Ref ref = ref_forward(k, x, r, c, h);
            if (std::fabs(ref.v) >= max_abs) max_abs = std::fabs(ref.v), max_err = ref.err;
            // the code is the cast of some value in [lo, hi]
            const double e = ref.err * scale + kU * std::fabs(ref.v * scale);
            const int lo = fp8_ordinal(ref_encode(f, ref.v * scale - e));
            const int hi = fp8_ordinal(ref_encode(f, ref.v * scale + e));
            for (int which = 0; which < 2; ++which) {
              if ((which == 0 && layout == 1) || (which == 1 && layout == 0)) continue;
              const uint32_t code = which == 0 ? yb.get<uint8_t>(r * h + c) : ytb.get<uint8_t>(c * rows + r);
              const int o = fp8_ordinal(code);
              if (!(o >= lo && o <= hi) && bad++ < 5) {
                ADD_FAILURE() << (which ? "columnwise" : "rowwise") << " (" << r << ", " << c << "): code " << code
                              << ", want ordinal in [" << lo << ", " << hi << "] for y*scale " << ref.v * scale;
              }
            }
          }
        }
        EXPECT_EQ(bad, 0);
        EXPECT_NEAR(amax, max_abs, max_err + 1e-30);
        if (layout == 2) {
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t c = 0; c < h; ++c) ASSERT_EQ(yb.get<uint8_t>(r * h + c), ytb.get<uint8_t>(c * rows + r));
        }
      }
    }
  }
}

TEST(Activation, Fp8AmaxKeepsLargerPriorAndSkipsNan) {
  float x[4] = {1.0f, -3.0f, NAN, 2.0f};
  uint8_t y[4];
  float scale = 1.0f, scale_inv = 0, amax = 100.0f;
  te_tensor in = make_tensor(TE_DTYPE_FLOAT32, {4}, x);
  te_tensor out = make_tensor(TE_DTYPE_FLOAT8_E4M3, {4}, y, cpu(), TE_SCALING_PER_TENSOR);
  out.scale = &scale;
  out.scale_inv = &scale_inv;
  out.amax = &amax;
  ASSERT_EQ(te_activation_fwd(TE_ACTIVATION_RELU, &in, &out, nullptr), TE_SUCCESS) << last_error();
  EXPECT_EQ(amax, 100.0f);
  amax = 0.0f;
  ASSERT_EQ(te_activation_fwd(TE_ACTIVATION_SRELU, &in, &out, nullptr), TE_SUCCESS) << last_error();
  EXPECT_EQ(amax, 4.0f);
  EXPECT_EQ(y[0], ref_encode(kE4M3, 1.0));
  EXPECT_EQ(y[1], ref_encode(kE4M3, 0.0));
  EXPECT_EQ(y[3], ref_encode(kE4M3, 4.0));
}

TEST(Activation, EmptyTensors) {
  for (const Kind& k : kKinds) {
    Buffer y(16), d(16);
    float dummy = 0;
    te_tensor in = make_tensor(TE_DTYPE_FLOAT32, {0, k.gated ? 8 : 4}, &dummy);
    te_tensor out = make_tensor(TE_DTYPE_FLOAT32, {0, 4}, y.data());
    EXPECT_EQ(te_activation_fwd(k.kind, &in, &out, nullptr), TE_SUCCESS) << last_error();
    te_tensor din = make_tensor(TE_DTYPE_FLOAT32, {0, k.gated ? 8 : 4}, d.data());
    EXPECT_EQ(te_activation_bwd(k.kind, &out, &in, &din, nullptr), TE_SUCCESS) << last_error();
    EXPECT_TRUE(y.all_poison() && d.all_poison());
  }
}

// ---------------------------------------------------------------------------
// Bad input: status, "<op>: " prefix, named argument, and nothing written.
// ---------------------------------------------------------------------------

// Valid arguments around swiglu (gated) on fp32 [3, 2*8], output fp32 or E4M3 [3, 8].
struct Args {
  int32_t kind = TE_ACTIVATION_SWIGLU;
  std::vector<float> x = std::vector<float>(48, 0.5f), g = std::vector<float>(24, 1.0f);
  Buffer y{3 * 8 * 4}, yt{3 * 8}, dx{48 * 4};
  float scale = 2.0f, scale_inv = f32(kPoisonBits), amax = 1.5f;
  te_tensor in, out, grad, din;
  const te_tensor *in_ptr = &in, *out_ptr = &out, *grad_ptr = &grad, *din_ptr = &din;
  explicit Args(bool fp8) {
    in = make_tensor(TE_DTYPE_FLOAT32, {3, 16}, x.data());
    grad = make_tensor(TE_DTYPE_FLOAT32, {3, 8}, g.data());
    din = make_tensor(TE_DTYPE_FLOAT32, {3, 16}, dx.data());
    if (fp8) {
      out = make_tensor(TE_DTYPE_FLOAT8_E4M3, {3, 8}, y.data(), cpu(), TE_SCALING_PER_TENSOR);
      out.columnwise_data = yt.data();
      out.scale = &scale;
      out.scale_inv = &scale_inv;
      out.amax = &amax;
    } else {
      out = make_tensor(TE_DTYPE_FLOAT32, {3, 8}, y.data());
    }
  }
  Args(const Args&) = delete;
  te_status fwd() { return te_activation_fwd(kind, in_ptr, out_ptr, nullptr); }
  te_status bwd() { return te_activation_bwd(kind, grad_ptr, in_ptr, din_ptr, nullptr); }
  bool untouched() const {
    return y.all_poison() && yt.all_poison() && dx.all_poison() && bits_of(scale_inv) == kPoisonBits &&
           amax == 1.5f;
  }
};

TEST(ActivationBadInput, BaselinesSucceed) {
  for (bool fp8 : {false, true}) {
    Args a(fp8);
    ASSERT_EQ(a.fwd(), TE_SUCCESS) << last_error();
    EXPECT_FALSE(a.y.all_poison());
    EXPECT_EQ(a.yt.all_poison(), !fp8);
  }
  Args b(false);
  ASSERT_EQ(b.bwd(), TE_SUCCESS) << last_error();
  EXPECT_FALSE(b.dx.all_poison());
}

struct Bad {
  const char* what;
  bool fwd;
  bool fp8;
  std::function<void(Args&)> mutate;
  te_status want;
  std::vector<std::string> parts;
};

TEST(ActivationBadInput, Rejected) {
  const Bad cases[] = {
      {"kind -1", true, false, [](Args& a) { a.kind = -1; }, INV, {"kind must be a te_activation", "got -1"}},
      {"kind 10", false, false, [](Args& a) { a.kind = 10; }, INV, {"kind must be a te_activation", "got 10"}},
      {"odd gated input", true, false, [](Args& a) { a.in.shape[1] = 15; }, INV,
       {"input last dim must be even", "swiglu", "[3, 15]"}},
      {"odd gated input bwd", false, false, [](Args& a) { a.in.shape[1] = 15; }, INV,
       {"input last dim must be even", "swiglu"}},
      {"scalar input", true, false, [](Args& a) { a.in.ndim = 0; }, INV, {"input must have at least one dimension"}},
      {"gated output of full width", true, false, [](Args& a) { a.out.shape[1] = 16; }, INV,
       {"output shape must be", "last dim 8", "got [3, 16]"}},
      {"plain output of half width", true, false,
       [](Args& a) { a.kind = TE_ACTIVATION_SILU; a.out.shape[1] = 8; }, INV, {"output shape", "last dim 16"}},
      {"output rows", true, false, [](Args& a) { a.out.shape[0] = 4; }, INV, {"output shape", "got [4, 8]"}},
      {"output ndim", true, false, [](Args& a) { a.out.ndim = 3; a.out.shape[0] = 1; a.out.shape[1] = 3;
                                               a.out.shape[2] = 8; }, INV, {"output shape", "got [1, 3, 8]"}},
      {"input dtype int32", true, false, [](Args& a) { a.in.dtype = TE_DTYPE_INT32; }, INV,
       {"input", "float32, float16 or bfloat16", "int32"}},
      {"input dtype fp8", false, false, [](Args& a) { a.in.dtype = TE_DTYPE_FLOAT8_E4M3; }, INV,
       {"input", "float32, float16 or bfloat16"}},
      {"output dtype uint8", true, false, [](Args& a) { a.out.dtype = TE_DTYPE_UINT8; }, INV,
       {"output", "float8_e4m3 or float8_e5m2", "uint8"}},
      {"grad dtype", false, false, [](Args& a) { a.grad.dtype = TE_DTYPE_BFLOAT16; }, INV,
       {"grad dtype must equal input dtype float32", "bfloat16"}},
      {"dinput dtype", false, false, [](Args& a) { a.din.dtype = TE_DTYPE_FLOAT16; }, INV,
       {"dinput dtype must equal input dtype"}},
      {"grad shape", false, false, [](Args& a) { a.grad.shape[1] = 16; }, INV, {"grad shape must be", "got [3, 16]"}},
      {"dinput shape", false, false, [](Args& a) { a.din.shape[1] = 8; }, INV, {"dinput"}},
      {"block scaling", true, true, [](Args& a) { a.out.scaling_mode = TE_SCALING_BLOCK_1D; }, NIMP, {"output"}},
      {"fp8 without scaling mode", true, true, [](Args& a) { a.out.scaling_mode = TE_SCALING_NONE; }, INV,
       {"output"}},
      {"fp8 null scale", true, true, [](Args& a) { a.out.scale = nullptr; }, INV, {"output", "scale"}},
      {"fp8 no data at all", true, true, [](Args& a) { a.out.data = nullptr; a.out.columnwise_data = nullptr; },
       INV, {"output.data and output.columnwise_data must not both be null"}},
      {"columnwise on float output", true, false, [](Args& a) { a.out.columnwise_data = a.yt.data(); }, INV,
       {"output.columnwise_data must be null"}},
      {"null input", true, false, [](Args& a) { a.in_ptr = nullptr; }, INV, {"input must not be null"}},
      {"null output", true, false, [](Args& a) { a.out_ptr = nullptr; }, INV, {"output must not be null"}},
      {"null grad", false, false, [](Args& a) { a.grad_ptr = nullptr; }, INV, {"grad must not be null"}},
      {"null dinput", false, false, [](Args& a) { a.din_ptr = nullptr; }, INV, {"dinput must not be null"}},
      {"null input data", true, false, [](Args& a) { a.in.data = nullptr; }, INV, {"input", "data"}},
      {"null output data", true, false, [](Args& a) { a.out.data = nullptr; }, INV, {"output", "data"}},
      {"null grad data", false, false, [](Args& a) { a.grad.data = nullptr; }, INV, {"grad", "data"}},
      {"null dinput data", false, false, [](Args& a) { a.din.data = nullptr; }, INV, {"dinput", "data"}},
      {"bad device type", true, false, [](Args& a) { a.out.device.type = 3; }, INV,
       {"output device type must be cpu (0) or cuda (1), got 3"}},
  };
  for (const Bad& c : cases) {
    SCOPED_TRACE(c.what);
    Args a(c.fp8);
    c.mutate(a);
    const te_status st = c.fwd ? a.fwd() : a.bwd();
    EXPECT_TRUE(is_error(st, c.want, c.fwd ? "te_activation_fwd" : "te_activation_bwd", c.parts));
    EXPECT_TRUE(a.untouched());
  }
}

// One tensor on a GPU: a CPU-only build refuses the CUDA tensor itself; a CUDA
// build reports the mismatch. All on the GPU (nothing is dereferenced: validation
// fails first): a CPU-only build refuses the CUDA input; a CUDA build still checks
// the arguments before it launches anything.
TEST(ActivationBadInput, Devices) {
  const struct {
    const char* arg;
    bool fwd;
    std::function<te_tensor&(Args&)> pick;
  } cases[] = {
      {"output", true, [](Args& a) -> te_tensor& { return a.out; }},
      {"grad", false, [](Args& a) -> te_tensor& { return a.grad; }},
      {"dinput", false, [](Args& a) -> te_tensor& { return a.din; }},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.arg);
    Args a(false);
    c.pick(a).device = cuda(0);
    const te_status st = c.fwd ? a.fwd() : a.bwd();
    const char* op = c.fwd ? "te_activation_fwd" : "te_activation_bwd";
    if (te_built_with_cuda()) {
      EXPECT_TRUE(is_error(st, INV, op, {std::string(c.arg) + " is on cuda:0 but input is on cpu"}));
    } else {
      EXPECT_TRUE(is_error(st, NIMP, op, {c.arg, "CUDA"}));
    }
    EXPECT_TRUE(a.untouched());
  }
  for (bool fwd : {true, false}) {
    Args a(false);
    for (te_tensor* t : {&a.in, &a.out, &a.grad, &a.din}) t->device = cuda(0);
    a.out.shape[1] = 16;  // wrong for swiglu: [3, 8] expected
    a.grad.dtype = TE_DTYPE_BFLOAT16;
    const te_status st = fwd ? a.fwd() : a.bwd();
    const char* op = fwd ? "te_activation_fwd" : "te_activation_bwd";
    if (te_built_with_cuda()) {
      EXPECT_TRUE(is_error(st, INV, op, {fwd ? "output shape must be" : "grad dtype must equal input dtype"}));
    } else {
      EXPECT_TRUE(is_error(st, NIMP, op, {"input is a CUDA tensor"}));
    }
    EXPECT_TRUE(a.untouched());
  }
}

}  // namespace
