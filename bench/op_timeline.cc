#include "bench/op_timeline.h"

#include <array>
#include <atomic>
#include <chrono>

namespace tandem::bench {
namespace {

using kernels::Backend;

enum Op : int {
  kLinear,
  kLinearGroup,
  kLinearF32,
  kRmsNorm,
  kRope,
  kSoftmax,
  kLogSumExp,
  kTopK,
  kSiluMul,
  kAxpy,
  kPagedAttention,
  kCausalAttention,
  kCausalConv,
  kGatedDelta,
  kEmbed,
  kGatherRows,
  kAddRows,
  kAddBias,
  kSigmoid,
  kMul,
  kL2Norm,
  kDeltaGates,
  kRoute,
  kMergeAttention,
  kKvStore,
  kClampedSwiglu,
  kAttentionSinks,
  kGeluTanhMul,
  kSoftCap,
  kScale,
  kNumOps
};
constexpr const char* kNames[kNumOps] = {
    "linear",          "linear_group",     "linear_f32",    "rms_norm",        "rope",
    "softmax",         "log_sum_exp",      "top_k",         "silu_mul",        "axpy",
    "paged_attention", "causal_attention", "causal_conv",   "gated_delta",     "embed",
    "gather_rows",     "add_rows",         "add_bias",      "sigmoid",         "mul",
    "l2_norm",         "delta_gates",      "route",         "merge_attention", "kv_store",
    "clamped_swiglu",  "attention_sinks",  "gelu_tanh_mul", "soft_cap",        "scale"};
// Called by the forward pass from its worker threads.
constexpr bool InWorkers(int op) {
  return op == kPagedAttention || op == kCausalAttention || op == kCausalConv || op == kGatedDelta;
}

struct Totals {
  std::atomic<int64_t> calls{0}, nanos{0}, bytes{0};
};
std::array<Totals, kNumOps> g_totals;
const Backend* g_inner = nullptr;

class Timed {
 public:
  explicit Timed(int op, int64_t bytes = 0)
      : op_(op), bytes_(bytes), start_(std::chrono::steady_clock::now()) {}
  ~Timed() {
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                        std::chrono::steady_clock::now() - start_)
                        .count();
    g_totals[op_].calls.fetch_add(1, std::memory_order_relaxed);
    g_totals[op_].nanos.fetch_add(ns, std::memory_order_relaxed);
    g_totals[op_].bytes.fetch_add(bytes_, std::memory_order_relaxed);
  }

 private:
  const int op_;
  const int64_t bytes_;
  const std::chrono::steady_clock::time_point start_;
};

// Backend field `Field`'s timed stand-in: calls the inner table's op inside a Timed.
template <auto Field, int Id, class F>
struct Wrap;
template <auto Field, int Id, class R, class... Args>
struct Wrap<Field, Id, R (*)(Args...)> {
  static R Call(Args... args) {
    Timed timed(Id);
    return (g_inner->*Field)(args...);
  }
};

template <class Member>
struct FieldType;
template <class F>
struct FieldType<F Backend::*> {
  using type = F;
};

template <auto Field, int Id>
constexpr auto Timer() {
  return &Wrap<Field, Id, typename FieldType<decltype(Field)>::type>::Call;
}

// The products also count the weight bytes they read.
template <auto Field, int Id>
void TimedLinear(const float* x, int b, const kernels::PackedMatrix& w, float* y) {
  Timed timed(Id, w.bytes_read());
  (g_inner->*Field)(x, b, w, y);
}

void TimedLinearGroup(const kernels::LinearProduct* products, int n) {
  int64_t bytes = 0;
  for (int i = 0; i < n; ++i) bytes += products[i].w.bytes_read();
  Timed timed(kLinearGroup, bytes);
  g_inner->linear_group(products, n);
}

}  // namespace

const Backend& TimedBackend(const Backend& inner) {
  g_inner = &inner;
  static Backend timed = [&inner] {
    // The inner table's ops, each one timed here replaced by its timed stand-in (an op added
    // to Backend and not yet listed here runs untimed rather than as a null pointer).
    Backend t = inner;
    t.name = "timed";
    t.linear = TimedLinear<&Backend::linear, kLinear>;
    t.linear_group = TimedLinearGroup;
    t.linear_f32 = TimedLinear<&Backend::linear_f32, kLinearF32>;
    t.rms_norm = Timer<&Backend::rms_norm, kRmsNorm>();
    t.rope = Timer<&Backend::rope, kRope>();
    t.softmax = Timer<&Backend::softmax, kSoftmax>();
    t.log_sum_exp = Timer<&Backend::log_sum_exp, kLogSumExp>();
    t.top_k = Timer<&Backend::top_k, kTopK>();
    t.silu_mul = Timer<&Backend::silu_mul, kSiluMul>();
    t.axpy = Timer<&Backend::axpy, kAxpy>();
    t.paged_attention = Timer<&Backend::paged_attention, kPagedAttention>();
    t.causal_attention = Timer<&Backend::causal_attention, kCausalAttention>();
    t.causal_conv = Timer<&Backend::causal_conv, kCausalConv>();
    t.gated_delta = Timer<&Backend::gated_delta, kGatedDelta>();
    t.embed = Timer<&Backend::embed, kEmbed>();
    t.gather_rows = Timer<&Backend::gather_rows, kGatherRows>();
    t.add_rows = Timer<&Backend::add_rows, kAddRows>();
    t.add_bias = Timer<&Backend::add_bias, kAddBias>();
    t.sigmoid = Timer<&Backend::sigmoid, kSigmoid>();
    t.mul = Timer<&Backend::mul, kMul>();
    t.l2_norm = Timer<&Backend::l2_norm, kL2Norm>();
    t.delta_gates = Timer<&Backend::delta_gates, kDeltaGates>();
    t.route = Timer<&Backend::route, kRoute>();
    t.merge_attention = Timer<&Backend::merge_attention, kMergeAttention>();
    t.kv_store = Timer<&Backend::kv_store, kKvStore>();
    t.clamped_swiglu = Timer<&Backend::clamped_swiglu, kClampedSwiglu>();
    t.attention_sinks = Timer<&Backend::attention_sinks, kAttentionSinks>();
    t.gelu_tanh_mul = Timer<&Backend::gelu_tanh_mul, kGeluTanhMul>();
    t.soft_cap = Timer<&Backend::soft_cap, kSoftCap>();
    t.scale = Timer<&Backend::scale, kScale>();
    return t;
  }();
  timed.rounding = inner.rounding;  // the inner products', for anything that reads it
  return timed;
}

std::vector<OpTime> OpTimes() {
  std::vector<OpTime> out;
  for (int op = 0; op < kNumOps; ++op) {
    const Totals& t = g_totals[op];
    const int64_t calls = t.calls.load(std::memory_order_relaxed);
    if (calls == 0) continue;
    out.push_back({kNames[op], calls, t.nanos.load(std::memory_order_relaxed) * 1e-9,
                   t.bytes.load(std::memory_order_relaxed), InWorkers(op)});
  }
  return out;
}

void ResetOpTimes() {
  for (Totals& t : g_totals) {
    t.calls.store(0, std::memory_order_relaxed);
    t.nanos.store(0, std::memory_order_relaxed);
    t.bytes.store(0, std::memory_order_relaxed);
  }
}

}  // namespace tandem::bench
