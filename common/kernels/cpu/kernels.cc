// Dispatch: picks the kernel level for this CPU once, on first use (or as TANDEM_KERNELS says),
// and forwards every public kernel to its table. Also holds what all levels share (bf16
// conversion, Rope, the split of matrix products across threads, activation scratch).
#include "common/kernels/cpu/kernels.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/kernels/cpu/kernels_internal.h"
#include "common/kernels/cpu/thread_pool.h"

namespace tandem::kernels::cpu {

float Bf16ToF32(uint16_t bits) { return internal::Bf16BitsToF32(bits); }

uint16_t F32ToBf16(float value) { return internal::F32ToBf16Bits(value); }

namespace internal {

// Below this many multiply-adds (1 MB of bf16 weights at b = 1, about 30 us on one thread) a
// product runs inline. One thread streams weights at about 30 GB/s here, two at 52-55 GB/s
// (measured on 7-32 MB products), so everything larger is split; idle workers spin briefly
// between products (thread_pool.cc), which keeps the hand-off to a few microseconds.
constexpr int64_t kMinParallelWork = int64_t{1} << 19;
// Smallest share of a product handed to one thread.
constexpr int64_t kMinChunkWork = int64_t{1} << 17;

void QuantizeRowsWith(QuantizeRowFn row, const float* x, int b, const PackedMatrix& w,
                      ActivationScratch& s) {
  if (w.format == WeightFormat::kBf16) return;
  const int groups = w.cols / w.group;
  s.q.resize(static_cast<size_t>(b) * w.cols);
  s.scales.resize(static_cast<size_t>(b) * groups);
  s.sums.resize(s.scales.size());
  for (int m = 0; m < b; ++m) {
    row(x + int64_t{m} * w.cols, w.cols, w.group, s.q.data() + int64_t{m} * w.cols,
        s.scales.data() + int64_t{m} * groups, s.sums.data() + int64_t{m} * groups);
  }
}

// A product's share of a group: its prepared activations and its blocks of `align` panels,
// each `block_work` multiply-adds (the last may hold fewer), placed from `start` on the group's
// axis of work.
struct GroupPart {
  const ActivationScratch* scratch;
  int panels;
  int align;
  int64_t blocks;
  int64_t block_work;
  int64_t start;
};

void RunLinearGroup(const LinearProduct* products, int n, const LinearKernel& kernel) {
  // The calling thread's: prepared inputs stay put while the workers read them, and a nested
  // group (none today) would run inline on its own thread's buffers.
  thread_local std::vector<ActivationScratch> prepared_here;
  thread_local std::vector<GroupPart> parts_here;
  // Named apart: the workers' lambda must see this thread's buffers, not their own.
  std::vector<ActivationScratch>& prepared = prepared_here;
  std::vector<GroupPart>& parts = parts_here;
  if (prepared.size() < static_cast<size_t>(n)) prepared.resize(n);
  parts.assign(n, GroupPart{});
  int64_t work = 0, blocks = 0;
  for (int i = 0; i < n; ++i) {
    const LinearProduct& p = products[i];
    if (p.b <= 0 || p.w.rows <= 0) continue;
    GroupPart& part = parts[i];
    part.scratch = &prepared[i];
    if (kernel.prepare != nullptr) {
      // The input of the product before, prepared the same way, is shared (q, k, v; gate, up).
      const LinearProduct* o = i > 0 ? &products[i - 1] : nullptr;
      const bool bf16 = p.w.format == WeightFormat::kBf16;
      if (o != nullptr && parts[i - 1].scratch != nullptr && o->x == p.x && o->b == p.b &&
          o->w.cols == p.w.cols && (o->w.format == WeightFormat::kBf16) == bf16 &&
          (bf16 || o->w.group == p.w.group)) {
        part.scratch = parts[i - 1].scratch;
      } else {
        kernel.prepare(p.x, p.b, p.w, prepared[i]);
      }
    }
    part.panels = (p.w.rows + kPanelRows - 1) / kPanelRows;
    part.align = kernel.panel_align(p.b, p.w);
    part.blocks = (part.panels + part.align - 1) / part.align;
    part.block_work = std::max<int64_t>(1, int64_t{p.b} * p.w.cols * kPanelRows * part.align);
    part.start = work;
    work += part.blocks * part.block_work;
    blocks += part.blocks;
  }
  ThreadPool& pool = DefaultThreadPool();
  if (work < kMinParallelWork || pool.num_threads() == 1) {
    for (int i = 0; i < n; ++i) {
      if (parts[i].scratch != nullptr)
        kernel.panels(products[i], *parts[i].scratch, 0, parts[i].panels);
    }
    return;
  }
  // The axis of work in `blocks` equal slices; slices [begin, end) run the blocks that start
  // in their share of the axis, so that products of unequal rows (experts given more tokens
  // than others) split as evenly as their work.
  const int64_t slice = (work + blocks - 1) / blocks;
  pool.ParallelFor(
      blocks, std::max<int64_t>(1, kMinChunkWork / slice), [&](int64_t begin, int64_t end) {
        const int64_t lo = begin * slice, hi = std::min(work, end * slice);
        for (int i = 0; i < n; ++i) {
          const GroupPart& part = parts[i];
          if (part.scratch == nullptr) continue;
          // Blocks k with lo <= start + k * block_work < hi.
          const auto at_or_after = [&](int64_t at) {
            return std::clamp<int64_t>((at - part.start + part.block_work - 1) / part.block_work, 0,
                                       part.blocks);
          };
          const int64_t k0 = at_or_after(lo), k1 = at_or_after(hi);
          if (k0 >= k1) continue;
          kernel.panels(products[i], *part.scratch, static_cast<int>(k0 * part.align),
                        static_cast<int>(std::min<int64_t>(part.panels, k1 * part.align)));
        }
      });
}

void RopeSharedAngles(float* x, int heads, int head_dim, int pos, const RopeSpec& rope) {
  const int half = rope.rotary_dim / 2;
  for (int i = 0; i < half; ++i) {
    const float angle = static_cast<float>(pos) * rope.inv_freq[i];
    const float c = std::cos(angle);
    const float s = std::sin(angle);
    const int a = rope.interleaved ? 2 * i : i;
    const int b = rope.interleaved ? 2 * i + 1 : i + half;
    for (int64_t h = 0; h < heads; ++h) {
      float* head = x + h * head_dim;
      const float x1 = head[a];
      const float x2 = head[b];
      head[a] = x1 * c - x2 * s;
      head[b] = x2 * c + x1 * s;
    }
  }
}

namespace {

// For CPUs without AVX2 (and for testing the fast paths against it).
constexpr Backend kReferenceBackend =
    internal::WithStepOps<reference::Softmax, reference::TopK, reference::Axpy>({
        .name = "reference",
        .rounding = ActivationRounding::kNone,
        .linear = LinearWith<kReferenceLinear>,
        .linear_group = LinearGroupWith<kReferenceLinear>,
        .linear_f32 = LinearWith<kReferenceLinear>,
        .rms_norm = reference::RmsNorm,
        .rope = internal::RopeRows<reference::Rope>,
        .softmax = reference::Softmax,
        .log_sum_exp = reference::LogSumExp,
        .top_k = reference::TopK,
        .silu_mul = reference::SiluMul,
        .axpy = reference::Axpy,
        .paged_attention = reference::PagedAttentionRange,
        .causal_attention = internal::CausalByQuery<reference::PagedAttentionRange>,
        .causal_conv = reference::CausalConv,
        .gated_delta = reference::GatedDelta,
    });

// `elementwise` with the products of `Kernel` (and of `F32Kernel` for linear_f32).
template <const LinearKernel& Kernel, const LinearKernel& F32Kernel>
Backend WithLinear(const Backend& elementwise, const char* name, ActivationRounding rounding) {
  Backend backend = elementwise;
  backend.name = name;
  backend.rounding = rounding;
  backend.linear = LinearWith<Kernel>;
  backend.linear_group = LinearGroupWith<Kernel>;
  backend.linear_f32 = LinearWith<F32Kernel>;
  return backend;
}

Backend WithAttention(Backend backend, internal::PagedAttentionFn attention,
                      internal::CausalAttentionFn causal) {
  backend.paged_attention = attention;
  backend.causal_attention = causal;
  return backend;
}

// AMX-TILE, AMX-BF16 and AMX-INT8 by CPUID (leaf 7: EDX bits 24, 22, 25), the OS saving tile
// state (XCR0 bits 17 and 18), and Linux granting this process the tile data: without that
// permission the first tile instruction raises SIGILL.
bool AmxUsable() {
  unsigned eax, ebx, ecx, edx;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
  const unsigned amx = (1u << 22) | (1u << 24) | (1u << 25);
  if ((edx & amx) != amx) return false;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx) || (ecx & (1u << 27)) == 0) return false;  // OSXSAVE
  uint32_t xcr0_lo, xcr0_hi;
  __asm__("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  if ((xcr0_lo & (3u << 17)) != (3u << 17)) return false;
  constexpr int kArchReqXcompPerm = 0x1023;
  constexpr int kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

// F16C by CPUID (leaf 1: ECX bit 29); clang's __builtin_cpu_supports has no name for it.
bool CpuHasF16c() {
  unsigned eax, ebx, ecx, edx;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 29)) != 0;
}

bool CpuHasAvx512() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}

struct Level {
  Backend backend;
  bool supported;
};

// Every level, slowest first, built once (the tables of other files are complete by then:
// they are constant-initialised).
const std::vector<Level>& Levels() {
  static const std::vector<Level>* levels = [] {
    __builtin_cpu_init();
    const bool avx2 =
        __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && CpuHasF16c();
    const bool avx512 = CpuHasAvx512();
    const bool vnni = avx512 && __builtin_cpu_supports("avx512vnni");
    const bool bf16 = vnni && __builtin_cpu_supports("avx512bf16");
    const bool amx = bf16 && AmxUsable();
    return new std::vector<Level>{
        {kReferenceBackend, true},
        {WithLinear<kAvx2Linear, kAvx2Linear>(kAvx2Elementwise, "avx2", ActivationRounding::kNone),
         avx2},
        {WithLinear<kAvx2Int8Linear, kAvx2Linear>(kAvx2Elementwise, "avx2int8",
                                                  ActivationRounding::kInt8),
         avx2},
        {WithLinear<kAvx512Linear, kAvx512Linear>(kAvx512Elementwise, "avx512",
                                                  ActivationRounding::kNone),
         avx512},
        {WithLinear<kAvx512VnniLinear, kAvx512Linear>(kAvx512Elementwise, "avx512vnni",
                                                      ActivationRounding::kInt8),
         vnni},
        {WithAttention(WithLinear<kAvx512Bf16Linear, kAvx512Linear>(
                           kAvx512Elementwise, "avx512bf16", ActivationRounding::kBf16AndInt8),
                       kAvx512Bf16Attention, kAvx512Bf16CausalAttention),
         bf16},
        {WithAttention(WithLinear<kAmxLinear, kAvx512Linear>(kAvx512Elementwise, "amx",
                                                             ActivationRounding::kBf16AndInt8),
                       kAvx512Bf16Attention, kAvx512Bf16CausalAttention),
         amx},
    };
  }();
  return *levels;
}

const Backend* Find(const std::string& name) {
  const std::vector<Level>& levels = Levels();
  const Backend* found = nullptr;
  for (const Level& level : levels) {
    if (!level.supported) continue;
    if (name == "auto" || name == level.backend.name ||
        (name == "exact" && level.backend.rounding == ActivationRounding::kNone)) {
      found = &level.backend;  // the last match is the fastest
      if (name == level.backend.name) break;
    }
  }
  return found;
}

// The level TANDEM_KERNELS names, else the fastest; an unknown or unsupported name in the
// environment is reported once on stderr and ignored.
const Backend* Detect() {
  if (const char* forced = std::getenv("TANDEM_KERNELS"); forced != nullptr && *forced != 0) {
    if (const Backend* backend = Find(forced); backend != nullptr) return backend;
    std::fprintf(stderr,
                 "tandem: TANDEM_KERNELS=%s is not a kernel level this CPU can run (%s); using "
                 "the fastest\n",
                 forced, KernelIsaNames().c_str());
  }
  return Find("auto");
}

constinit std::atomic<const Backend*> g_backend{nullptr};

const Backend& Kernels() {
  const Backend* backend = g_backend.load(std::memory_order_acquire);
  if (backend == nullptr) {
    // Threads racing here all detect the same table.
    backend = Detect();
    g_backend.store(backend, std::memory_order_release);
  }
  return *backend;
}

}  // namespace
}  // namespace internal

const char* KernelIsa() { return internal::Kernels().name; }

const Backend& ActiveBackend() { return internal::Kernels(); }

std::vector<const Backend*> SupportedBackends() {
  std::vector<const Backend*> out;
  for (const internal::Level& level : internal::Levels()) {
    if (level.supported) out.push_back(&level.backend);
  }
  return out;
}

const Backend* FindBackend(const std::string& name) { return internal::Find(name); }

std::string KernelIsaNames() {
  std::string names = "auto, exact";
  for (const internal::Level& level : internal::Levels()) {
    names += std::string(", ") + level.backend.name;
  }
  return names;
}

const Backend* AmxEmulatedBackendForTesting() {
  static const Backend* const backend = [] {
    const Backend* bf16 = internal::Find("avx512bf16");
    if (bf16 == nullptr) return static_cast<const Backend*>(nullptr);
    return static_cast<const Backend*>(
        new Backend(internal::WithLinear<internal::kAmxEmulatedLinear, internal::kAvx512Linear>(
            internal::kAvx512Elementwise, "amx-emulated", ActivationRounding::kBf16AndInt8)));
  }();
  return backend;
}

bool SetKernelIsa(const std::string& name) {
  const Backend* backend = internal::Find(name);
  if (backend == nullptr) return false;
  internal::g_backend.store(backend, std::memory_order_release);
  return true;
}

void Linear(const float* x, int b, const PackedMatrix& w, float* y) {
  internal::Kernels().linear(x, b, w, y);
}

void LinearGroup(const LinearProduct* products, int n) {
  internal::Kernels().linear_group(products, n);
}

void LinearF32(const float* x, int b, const PackedMatrix& w, float* y) {
  internal::Kernels().linear_f32(x, b, w, y);
}

void RmsNorm(const float* x, int b, int n, const float* weight, float eps, float* out) {
  internal::Kernels().rms_norm(x, b, n, weight, eps, out);
}

void Rope(float* x, int heads, int head_dim, int pos, float theta) {
  const std::vector<float> inv_freq = DefaultRopeFrequencies(theta, head_dim);
  internal::Kernels().rope(x, 1, heads, head_dim, {inv_freq.data(), head_dim}, &pos);
}

void Softmax(float* x, int n) { internal::Kernels().softmax(x, n); }

double LogSumExp(const float* x, int n) { return internal::Kernels().log_sum_exp(x, n); }

void TopK(const float* x, int n, int k, int32_t* out) { internal::Kernels().top_k(x, n, k, out); }

void SiluMul(const float* gate, const float* up, int n, float* out) {
  internal::Kernels().silu_mul(gate, up, n, out);
}

void Axpy(float alpha, const float* x, int n, float* y) {
  internal::Kernels().axpy(alpha, x, n, y);
}

void PagedAttention(const float* q, int num_heads, const PagedKv& kv, int context_len, float scale,
                    float* out) {
  internal::Kernels().paged_attention(q, num_heads, kv, 0, context_len, scale, 0, kv.num_kv_heads,
                                      out, nullptr);
}

void PagedAttentionRange(const float* q, int num_heads, const PagedKv& kv, int context_begin,
                         int context_end, float scale, int kv_head_begin, int kv_head_end,
                         float* out, float* lse) {
  internal::Kernels().paged_attention(q, num_heads, kv, context_begin, context_end, scale,
                                      kv_head_begin, kv_head_end, out, lse);
}

void CausalConv(float* x, int m, int channels, int stride, const float* weight, int kernel,
                float* tail) {
  internal::Kernels().causal_conv(x, m, channels, stride, weight, kernel, tail);
}

void GatedDelta(const GatedDeltaHead& head) { internal::Kernels().gated_delta(head); }

void MergeAttentionParts(const float* const* parts_out, const float* parts_lse, int parts, int n,
                         float* out) {
  float max_lse = -INFINITY;
  for (int i = 0; i < parts; ++i) max_lse = std::max(max_lse, parts_lse[i]);
  std::fill(out, out + n, 0.0f);
  if (max_lse == -INFINITY) return;
  double total = 0;
  for (int i = 0; i < parts; ++i) total += std::exp(double{parts_lse[i]} - max_lse);
  for (int i = 0; i < parts; ++i) {
    if (parts_lse[i] == -INFINITY) continue;
    const float weight = static_cast<float>(std::exp(double{parts_lse[i]} - max_lse) / total);
    for (int j = 0; j < n; ++j) out[j] += weight * parts_out[i][j];
  }
}

}  // namespace tandem::kernels::cpu
