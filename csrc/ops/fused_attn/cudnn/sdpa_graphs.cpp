// cuDNN SDPA graphs through cudnn-frontend's graph API: one graph per
// configuration (shapes, strides, dtype, mask band, padding, bias, dropout, stats,
// device), built once - cuDNN's plan building takes milliseconds - and kept in an
// LRU cache together with cuDNN's refusals, so an unsupported configuration is
// not rebuilt on every call either. Tensors carry fixed UIDs, so running a graph
// needs only the data pointers.
#include "ops/fused_attn/cudnn/sdpa_graphs.h"

#include <cudnn_frontend.h>
#include <string.h>

#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/cuda_utils.h"
#include "common/dtype.h"
#include "common/error.h"
#include "ops/fused_attn/cudnn/cudnn_library.h"

namespace fe = cudnn_frontend;

namespace opente {
namespace {

using TensorPtr = std::shared_ptr<fe::graph::Tensor_attributes>;

enum Uid : int64_t {
  kQ = 1,
  kK,
  kV,
  kO,
  kStats,
  kBias,
  kSeqlensQ,
  kSeqlensKV,
  kSeed,
  kOffset,
  kScale,
  kDO,
  kDQ,
  kDK,
  kDV,
  kDBias,
};

// Graphs kept at most; a long run over many shapes (varying sequence lengths)
// evicts the least recently used.
constexpr size_t kMaxGraphs = 512;

using GraphKey = std::vector<int64_t>;

struct GraphEntry {
  std::shared_ptr<fe::graph::Graph> graph;  // null: cuDNN refused the configuration
  int64_t workspace = 0;
  std::string refusal;  // cuDNN's reason, when graph is null
};

GraphKey graph_key(const SdpaParams& p) {
  uint32_t dropout_bits;
  memcpy(&dropout_bits, &p.dropout, sizeof(dropout_bits));
  GraphKey key = {p.backward, p.device, p.dtype, p.b, p.h, p.hg, p.sq, p.skv, p.head_dim_qk, p.head_dim_v};
  const SdpaBand& band = p.band;
  key.insert(key.end(), {band.has_left, band.left_bound, band.has_right, band.right_bound, band.bottom_right});
  key.insert(key.end(), {p.padding, p.has_bias, p.bias_b, p.bias_h, p.has_dbias, p.has_stats, p.deterministic});
  key.push_back(int64_t(dropout_bits));
  const AttnOperand* operands[] = {&p.q, &p.k, &p.v, &p.o, &p.d_o, &p.dq, &p.dk, &p.dv};
  for (const AttnOperand* op : operands) key.insert(key.end(), op->strides, op->strides + 4);
  return key;
}

std::vector<int64_t> dims_of(const AttnOperand& op) { return {op.dims[0], op.dims[1], op.dims[2], op.dims[3]}; }
std::vector<int64_t> strides_of(const AttnOperand& op) {
  return {op.strides[0], op.strides[1], op.strides[2], op.strides[3]};
}

TensorPtr operand(fe::graph::Graph& g, const char* name, Uid uid, const AttnOperand& op) {
  return g.tensor(
      fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(dims_of(op)).set_stride(strides_of(op)));
}

// An output of a node: where it goes and how it is laid out.
void place(const TensorPtr& t, Uid uid, const AttnOperand& op) {
  t->set_output(true).set_uid(uid).set_dim(dims_of(op)).set_stride(strides_of(op));
}

TensorPtr small_tensor(fe::graph::Graph& g, const char* name, Uid uid, int64_t count, fe::DataType_t dtype) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_uid(uid)
                      .set_dim({count, 1, 1, 1})
                      .set_stride({1, 1, 1, 1})
                      .set_data_type(dtype));
}

std::vector<int64_t> bias_dims(const SdpaParams& p) { return {p.bias_b, p.bias_h, p.sq, p.skv}; }
std::vector<int64_t> bias_strides(const SdpaParams& p) { return {p.bias_h * p.sq * p.skv, p.sq * p.skv, p.skv, 1}; }

// What the forward and backward attributes share: scale, band, padding, bias, dropout.
template <class Attributes>
void set_common(fe::graph::Graph& g, const SdpaParams& p, Attributes& options) {
  options.set_attn_scale(g.tensor(fe::graph::Tensor_attributes()
                                      .set_name("attn_scale")
                                      .set_uid(kScale)
                                      .set_dim({1, 1, 1, 1})
                                      .set_stride({1, 1, 1, 1})
                                      .set_is_pass_by_value(true)
                                      .set_data_type(fe::DataType_t::FLOAT)));
  if (p.band.has_left) options.set_diagonal_band_left_bound(static_cast<int>(p.band.left_bound));
  if (p.band.has_right) options.set_diagonal_band_right_bound(static_cast<int>(p.band.right_bound));
  options.set_diagonal_alignment(p.band.bottom_right ? fe::DiagonalAlignment_t::BOTTOM_RIGHT
                                                     : fe::DiagonalAlignment_t::TOP_LEFT);
  if (p.padding) {
    options.set_padding_mask(true)
        .set_seq_len_q(small_tensor(g, "seqlens_q", kSeqlensQ, p.b, fe::DataType_t::INT32))
        .set_seq_len_kv(small_tensor(g, "seqlens_kv", kSeqlensKV, p.b, fe::DataType_t::INT32));
  }
  if (p.has_bias) {
    options.set_bias(g.tensor(fe::graph::Tensor_attributes()
                                  .set_name("bias")
                                  .set_uid(kBias)
                                  .set_dim(bias_dims(p))
                                  .set_stride(bias_strides(p))));
  }
  if (p.dropout > 0.0f) {
    options.set_dropout(p.dropout, small_tensor(g, "dropout_seed", kSeed, 1, fe::DataType_t::INT64),
                        small_tensor(g, "dropout_offset", kOffset, 1, fe::DataType_t::INT64));
  }
}

TensorPtr stats_tensor_attributes(const SdpaParams& p, TensorPtr t) {
  t->set_uid(kStats)
      .set_dim({p.b, p.h, p.sq, 1})
      .set_stride({p.h * p.sq, p.sq, 1, 1})
      .set_data_type(fe::DataType_t::FLOAT);
  return t;
}

std::shared_ptr<fe::graph::Graph> describe_graph(const SdpaParams& p) {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(p.dtype == TE_DTYPE_FLOAT16 ? fe::DataType_t::HALF : fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  TensorPtr q = operand(*g, "q", kQ, p.q);
  TensorPtr k = operand(*g, "k", kK, p.k);
  TensorPtr v = operand(*g, "v", kV, p.v);
  if (!p.backward) {
    fe::graph::SDPA_attributes options;
    options.set_name("sdpa_fwd").set_generate_stats(p.has_stats);
    set_common(*g, p, options);
    auto [o, stats] = g->sdpa(q, k, v, options);
    place(o, kO, p.o);
    if (p.has_stats) stats_tensor_attributes(p, stats)->set_output(true);
    return g;
  }
  TensorPtr o = operand(*g, "o", kO, p.o);
  TensorPtr d_o = operand(*g, "d_o", kDO, p.d_o);
  TensorPtr stats = stats_tensor_attributes(p, g->tensor(fe::graph::Tensor_attributes().set_name("stats")));
  fe::graph::SDPA_backward_attributes options;
  options.set_name("sdpa_bwd").set_deterministic_algorithm(p.deterministic);
  set_common(*g, p, options);
  if (p.has_dbias) {
    options.set_dbias(g->tensor(fe::graph::Tensor_attributes()
                                    .set_name("dbias")
                                    .set_uid(kDBias)
                                    .set_dim(bias_dims(p))
                                    .set_stride(bias_strides(p))));
  }
  auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, d_o, stats, options);
  place(dq, kDQ, p.dq);
  place(dk, kDK, p.dk);
  place(dv, kDV, p.dv);
  return g;
}

std::string describe_config(const SdpaParams& p) {
  const auto dims = [](const AttnOperand& op) {
    return concat("[", op.dims[0], ", ", op.dims[1], ", ", op.dims[2], ", ", op.dims[3], "]");
  };
  return concat(p.backward ? "backward" : "forward", ", q ", dims(p.q), " k ", dims(p.k), " v ", dims(p.v), " ",
                dtype_name(p.dtype), p.padding ? ", padding" : "",
                p.band.has_left ? concat(", left bound ", p.band.left_bound) : std::string(),
                p.band.has_right ? concat(", right bound ", p.band.right_bound) : std::string(),
                p.band.bottom_right ? " bottom-right" : "", p.has_bias ? ", bias" : "",
                p.dropout > 0.0f ? concat(", dropout ", double(p.dropout)) : std::string());
}

// Builds the graph of p. Refusals (a configuration cuDNN's kernels lack) come back
// in the entry; CUDA / handle failures throw, and are not cached.
GraphEntry build_entry(const SdpaParams& p, cudnnHandle_t handle) {
  GraphEntry entry;
  std::shared_ptr<fe::graph::Graph> g;
  fe::error_t status;
  try {
    g = describe_graph(p);
    status = g->build(handle, {fe::HeurMode_t::A});
    if (status.is_good()) status = g->get_workspace_size(entry.workspace);
  } catch (const std::exception& e) {
    fail(TE_ERROR_CUDA,
         concat("cudnn-frontend failed building the attention graph (", describe_config(p), "): ", e.what()));
  }
  if (status.is_good()) {
    entry.graph = std::move(g);
    return entry;
  }
  switch (status.get_code()) {
    case fe::error_code_t::CUDA_API_FAILED:
    case fe::error_code_t::INVALID_CUDA_DEVICE:
    case fe::error_code_t::HANDLE_ERROR:
      fail(TE_ERROR_CUDA,
           concat("cuDNN failed building the attention graph (", describe_config(p), "): ", status.get_message()));
    default:
      entry.refusal = concat("cuDNN ", cudnn_runtime_version(), " cannot run this attention (", describe_config(p),
                             "): ", status.get_message());
      return entry;
  }
}

class GraphCache {
 public:
  // The entry of p, built on a miss. Call with mutex() held.
  const GraphEntry& get(const SdpaParams& p, cudnnHandle_t handle) {
    GraphKey key = graph_key(p);
    auto found = index_.find(key);
    if (found != index_.end()) {
      entries_.splice(entries_.begin(), entries_, found->second);  // most recently used first
      return found->second->second;
    }
    GraphEntry entry = build_entry(p, handle);
    entries_.emplace_front(key, std::move(entry));
    index_[std::move(key)] = entries_.begin();
    if (entries_.size() > kMaxGraphs) {
      index_.erase(entries_.back().first);
      entries_.pop_back();
    }
    return entries_.front().second;
  }

  std::mutex& mutex() { return mutex_; }

 private:
  std::mutex mutex_;
  std::list<std::pair<GraphKey, GraphEntry>> entries_;
  std::map<GraphKey, std::list<std::pair<GraphKey, GraphEntry>>::iterator> index_;
};

GraphCache& cache() {
  static GraphCache* instance = new GraphCache;  // never destroyed: cuDNN may be unloaded first at exit
  return *instance;
}

const GraphEntry& supported_entry(const SdpaParams& p, cudnnHandle_t handle) {
  const GraphEntry& entry = cache().get(p, handle);
  if (!entry.graph) fail(TE_ERROR_NOT_IMPLEMENTED, entry.refusal);
  return entry;
}

}  // namespace

size_t sdpa_workspace_size(const SdpaParams& p) {
  const cudnnHandle_t handle = cudnn_handle(p.device);
  DeviceGuard guard(p.device);
  std::lock_guard<std::mutex> lock(cache().mutex());
  return size_t(supported_entry(p, handle).workspace);
}

void sdpa_run(const SdpaParams& p, void* workspace, size_t workspace_size, void* stream) {
  const cudnnHandle_t handle = cudnn_handle(p.device);
  DeviceGuard guard(p.device);
  // One lock over lookup, stream and launch: the handle of a device is shared, and
  // its stream must not change between cudnnSetStream and the launch.
  std::lock_guard<std::mutex> lock(cache().mutex());
  const GraphEntry& entry = supported_entry(p, handle);
  OPENTE_CHECK_ARG(workspace_size >= size_t(entry.workspace), "workspace must be at least ", entry.workspace,
                   " bytes (the workspace size query), got ", workspace_size);
  if (entry.workspace > 0) OPENTE_CHECK_ARG(workspace != nullptr, "workspace must not be null");

  float scale = p.softmax_scale;  // passed by value: read by the launch below
  std::unordered_map<int64_t, void*> pack = {
      {kQ, p.q.data}, {kK, p.k.data}, {kV, p.v.data}, {kO, p.o.data}, {kScale, &scale}};
  if (p.has_stats) pack[kStats] = p.stats;
  if (p.has_bias) pack[kBias] = const_cast<void*>(p.bias);
  if (p.padding) {
    pack[kSeqlensQ] = const_cast<void*>(p.seqlens_q);
    pack[kSeqlensKV] = const_cast<void*>(p.seqlens_kv);
  }
  if (p.dropout > 0.0f) {
    pack[kSeed] = const_cast<int64_t*>(p.rng_state);
    pack[kOffset] = const_cast<int64_t*>(p.rng_state + 1);
  }
  if (p.backward) {
    pack[kDO] = p.d_o.data;
    pack[kDQ] = p.dq.data;
    pack[kDK] = p.dk.data;
    pack[kDV] = p.dv.data;
    if (p.has_dbias) pack[kDBias] = p.dbias;
  }
  cudnn_set_stream(handle, stream);
  fe::error_t status;
  try {
    status = entry.graph->execute(handle, pack, workspace);
  } catch (const std::exception& e) {
    fail(TE_ERROR_CUDA, concat("cuDNN attention failed to launch (", describe_config(p), "): ", e.what()));
  }
  if (!status.is_good()) {
    fail(TE_ERROR_CUDA, concat("cuDNN attention failed to launch (", describe_config(p), "): ", status.get_message()));
  }
}

}  // namespace opente
