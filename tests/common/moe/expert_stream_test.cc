// Streaming experts into the forward pass: the shipped model (bf16, and quantized to int8 and
// int4) run with no expert weights of its own, its experts streamed from a pack through a cache
// holding a quarter of them, gives exactly the logits of the fully resident model — at full
// width and at mixed widths, with and without overlap, from host memory and from the file with
// O_DIRECT — while the cache bound holds and every byte the host backing reads is a bundle the
// schedule asked for.
#include "common/moe/expert_stream.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "common/engine/generator.h"
#include "common/engine/quantize.h"
#include "common/moe/pruning_plan.h"
#include "common/moe/tiers.h"
#include "nlohmann/json.hpp"
#include "tests/testing/model_dir.h"
#include "tests/testing/subprocess.h"

namespace tandem::moe {
namespace {

// Width by (layer, rank, expert): the first choice at full width, the second narrowed or
// skipped by a fixed rule, so experts are asked for at several widths across steps.
class VariedWidths : public engine::ExpertWidthPolicy {
 public:
  explicit VariedWidths(int inter) : inter_(inter) {}
  void Widths(int layer, absl::Span<const int32_t> experts, absl::Span<float>,
              absl::Span<int> widths) const override {
    widths[0] = inter_;
    const int rule = (experts[1] + layer) % 4;
    widths[1] = rule == 0 ? 0 : rule * inter_ / 4;
  }

 private:
  int inter_;
};

// The shipped model as it is (0) or quantized to int8 / int4 (its experts and attention, in
// groups of 32): its weights fully resident, the same without experts, and its expert pack.
struct StreamModel {
  engine::ModelWeights* full = nullptr;
  engine::ModelWeights* slim = nullptr;
  std::string pack;
};

class ExpertStreamTest : public ::testing::TestWithParam<int> {
 protected:
  static StreamModel* Model(int bits, const std::string& name = "tiny-moe") {
    static std::map<std::pair<std::string, int>, StreamModel*>* models =
        new std::map<std::pair<std::string, int>, StreamModel*>();
    if (auto it = models->find({name, bits}); it != models->end()) return it->second;
    std::string dir = testing::SourceDir() + "/models/" + name;
    if (bits != 0) {
      const std::string quantized = absl::StrCat(testing::BinDir(), "/expert_stream_test.",
                                                 getpid(), ".", name, ".int", bits);
      EXPECT_EQ(
          engine::QuantizeCheckpoint(dir, {.bits = bits, .group_size = 32}, quantized).status(),
          absl::OkStatus());
      dir = quantized;
      Cleanup().push_back(quantized);
    }
    auto full =
        engine::LoadModelWeights(*testing::OpenModelDir(dir), engine::LoadFormat::kSafetensors);
    EXPECT_TRUE(full.ok()) << full.status();
    if (!full.ok()) return nullptr;
    auto* model = new StreamModel;
    model->full = full->release();
    const auto& c = model->full->config;
    engine::ExpertMask none;
    none.retained.assign(c.num_hidden_layers, std::vector<bool>(c.num_local_experts, false));
    auto slim = engine::LoadModelWeights(*testing::OpenModelDir(dir),
                                         engine::LoadFormat::kSafetensors, 0, none);
    EXPECT_TRUE(slim.ok()) << slim.status();
    model->slim = slim->release();
    model->pack = absl::StrCat(testing::BinDir(), "/expert_stream_test.", getpid(), ".", name, ".",
                               bits, ".pack");
    EXPECT_EQ(WriteExpertPack(*model->full, model->pack), absl::OkStatus());
    Cleanup().push_back(model->pack);
    (*models)[{name, bits}] = model;
    return model;
  }
  static std::vector<std::string>& Cleanup() {
    static std::vector<std::string>* paths = new std::vector<std::string>();
    return *paths;
  }
  static void TearDownTestSuite() {
    for (const std::string& path : Cleanup()) std::filesystem::remove_all(path);
    Cleanup().clear();
  }

  void SetUp() override {
    StreamModel* model = Model(GetParam());
    ASSERT_NE(model, nullptr);
    full_ = model->full;
    slim_ = model->slim;
    pack_ = &model->pack;
  }

  // Prefill of golden prompts 0-3 together, then 6 decode steps; every step's logits.
  std::vector<std::vector<float>> Run(const engine::ModelWeights& weights,
                                      engine::ExpertProvider* provider,
                                      const engine::ExpertWidthPolicy* widths) {
    const auto& c = weights.config;
    auto pool = engine::KvBlockPool::Create({static_cast<int>(c.num_hidden_layers),
                                             static_cast<int>(c.num_key_value_heads),
                                             static_cast<int>(c.head_dim), 16, 128});
    EXPECT_TRUE(pool.ok());
    auto forward = engine::ForwardPass::Create(&weights, pool->get());
    EXPECT_TRUE(forward.ok());
    (*forward)->SetExpertProvider(provider);
    std::ifstream in(testing::SourceDir() + "/tests/golden/tiny-moe/manifest.json");
    const nlohmann::json manifest = nlohmann::json::parse(in);
    std::vector<std::vector<int32_t>> prompts;
    for (int k = 0; k < 4; ++k) {
      prompts.push_back(manifest["prompts"][k]["token_ids"].get<std::vector<int32_t>>());
    }
    std::vector<engine::BlockTable> tables(4);
    std::vector<engine::StepInput> batch;
    for (int s = 0; s < 4; ++s) {
      EXPECT_TRUE(tables[s].Reserve(pool->get(), static_cast<int>(prompts[s].size()) + 8).ok());
      batch.push_back({prompts[s], 0, &tables[s]});
    }
    std::vector<std::vector<float>> out, logits;
    EXPECT_EQ((*forward)->Step(batch, {.widths = widths}, &logits), absl::OkStatus());
    for (auto& l : logits) out.push_back(l);
    std::vector<int32_t> next(4);
    for (int step = 0; step < 6; ++step) {
      batch.clear();
      for (int s = 0; s < 4; ++s) {
        next[s] = static_cast<int32_t>(std::max_element(logits[s].begin(), logits[s].end()) -
                                       logits[s].begin());
        batch.push_back({absl::MakeConstSpan(&next[s], 1),
                         static_cast<int>(prompts[s].size()) + step, &tables[s]});
      }
      EXPECT_EQ((*forward)->Step(batch, {.widths = widths}, &logits), absl::OkStatus());
      for (auto& l : logits) out.push_back(l);
    }
    for (auto& t : tables) t.ReleaseAll(pool->get());
    return out;
  }

  // The bytes of every expert, as the cache counts them.
  int64_t ExpertBytes() const {
    const auto& c = full_->config;
    const PackLayout layout = PackLayout::For(c);
    return c.num_hidden_layers * c.num_local_experts * layout.bundles() * layout.bundle_bytes();
  }

  engine::ModelWeights* full_ = nullptr;
  engine::ModelWeights* slim_ = nullptr;
  const std::string* pack_ = nullptr;
};

TEST_P(ExpertStreamTest, StreamedEqualsResidentAtFullAndMixedWidth) {
  const int inter = static_cast<int>(full_->config.intermediate_size);
  const VariedWidths varied(inter);
  for (const engine::ExpertWidthPolicy* widths :
       {static_cast<const engine::ExpertWidthPolicy*>(nullptr),
        static_cast<const engine::ExpertWidthPolicy*>(&varied)}) {
    const auto resident = Run(*full_, nullptr, widths);
    for (bool overlap : {true, false}) {
      auto backing = HostBacking(*pack_);
      ASSERT_TRUE(backing.ok());
      auto stream = ExpertStream::Create(backing->get(), ExpertBytes() / 4, overlap);
      ASSERT_TRUE(stream.ok()) << stream.status();
      const auto streamed = Run(*slim_, stream->get(), widths);
      ASSERT_EQ(streamed.size(), resident.size());
      for (size_t i = 0; i < resident.size(); ++i) {
        EXPECT_EQ(streamed[i], resident[i])
            << "step output " << i << " overlap " << overlap << " mixed " << (widths != nullptr);
      }
      const StreamStats stats = (*stream)->stats();
      EXPECT_GT(stats.cache.misses, 0);
      EXPECT_GT(stats.cache.evictions, 0);  // a quarter of the experts: replacement happened
      // The host backing reads exactly the bundles the cache loaded.
      EXPECT_EQ(stats.backing_bytes_read, stats.cache.bytes_loaded);
      if (widths != nullptr) {
        EXPECT_GT(stats.cache.widenings, 0);
      }
    }
  }
}

TEST_P(ExpertStreamTest, DirectFileBackingStreamsTheSameLogits) {
  auto backing = DirectFileBacking(*pack_);
  if (backing.status().code() == absl::StatusCode::kFailedPrecondition) {
    GTEST_SKIP() << backing.status();
  }
  ASSERT_TRUE(backing.ok()) << backing.status();
  const VariedWidths varied(static_cast<int>(full_->config.intermediate_size));
  auto stream = ExpertStream::Create(backing->get(), ExpertBytes() / 4, true);
  ASSERT_TRUE(stream.ok());
  EXPECT_EQ(Run(*slim_, stream->get(), &varied), Run(*full_, nullptr, &varied));
  const StreamStats stats = (*stream)->stats();
  // Whole 4 KiB blocks: at least the bundles, at most two partial blocks more per load.
  EXPECT_GE(stats.backing_bytes_read, stats.cache.bytes_loaded);
  EXPECT_LE(stats.backing_bytes_read,
            stats.cache.bytes_loaded + 2 * 4096 * (stats.cache.misses + stats.cache.widenings));
  EXPECT_GT(stats.cache.load_seconds, 0);
}

// Wraps a provider and records what the forward pass asks of it.
class RecordingProvider : public engine::ExpertProvider {
 public:
  explicit RecordingProvider(engine::ExpertProvider* inner) : inner_(inner) {}
  absl::Status BeginLayer(int layer, absl::Span<const engine::ExpertLoad> loads) override {
    begun.emplace_back(loads.begin(), loads.end());
    return inner_->BeginLayer(layer, loads);
  }
  absl::StatusOr<engine::ExpertView> Wait(int layer, int expert, int width) override {
    waited.back().push_back(expert);
    return inner_->Wait(layer, expert, width);
  }
  void EndLayer(int layer) override {
    inner_->EndLayer(layer);
    waited.emplace_back();
  }
  std::vector<std::vector<engine::ExpertLoad>> begun;
  std::vector<std::vector<int>> waited = {{}};

 private:
  engine::ExpertProvider* inner_;
};

TEST_P(ExpertStreamTest, LayersAskForEachExpertOnceWidestFirstAndComputeInThatOrder) {
  auto backing = HostBacking(*pack_);
  ASSERT_TRUE(backing.ok());
  auto stream = ExpertStream::Create(backing->get(), ExpertBytes() / 4, true);
  ASSERT_TRUE(stream.ok());
  RecordingProvider recording(stream->get());
  const VariedWidths varied(static_cast<int>(full_->config.intermediate_size));
  Run(*slim_, &recording, &varied);
  ASSERT_FALSE(recording.begun.empty());
  for (size_t i = 0; i < recording.begun.size(); ++i) {
    const auto& loads = recording.begun[i];
    std::vector<int> experts;
    for (size_t j = 0; j < loads.size(); ++j) {
      experts.push_back(loads[j].expert);
      if (j > 0) {
        EXPECT_TRUE(loads[j - 1].width > loads[j].width ||
                    (loads[j - 1].width == loads[j].width && loads[j - 1].expert < loads[j].expert))
            << "layer call " << i << " position " << j;
      }
    }
    std::vector<int> sorted = experts;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(std::adjacent_find(sorted.begin(), sorted.end()), sorted.end()) << "repeated expert";
    EXPECT_EQ(recording.waited[i], experts) << "compute order differs from load order";
  }
}

// A backing that counts reads finished and, while closed, holds every read but those of
// `first` (so a test can see what happens before the other loads finish, however fast the
// machine is).
class GatedBacking : public ExpertBacking {
 public:
  GatedBacking(ExpertBacking* inner, int first, bool open)
      : inner_(inner), first_(first), open_(open) {}
  const PackLayout& layout() const override { return inner_->layout(); }
  absl::Status Read(int layer, int expert, int first, int count, std::byte* out) override {
    if (expert != first_) {
      absl::MutexLock lock(&mu_);
      auto open = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return open_; };
      if (!mu_.AwaitWithTimeout(absl::Condition(&open), absl::Seconds(30))) {
        return absl::DeadlineExceededError("the gate never opened");
      }
    }
    absl::Status status = inner_->Read(layer, expert, first, count, out);
    ++finished;
    return status;
  }
  int64_t bytes_read() const override { return inner_->bytes_read(); }
  void Open() {
    absl::MutexLock lock(&mu_);
    open_ = true;
  }
  std::atomic<int> finished{0};

 private:
  ExpertBacking* inner_;
  const int first_;
  absl::Mutex mu_;
  bool open_ ABSL_GUARDED_BY(mu_);
};

TEST_P(ExpertStreamTest, OverlapComputesBeforeTheLayersLoadsFinishWithoutItAfter) {
  auto host = HostBacking(*pack_);
  ASSERT_TRUE(host.ok());
  const std::vector<engine::ExpertLoad> loads = {{3, 384}, {7, 192}, {1, 96}, {5, 48}};
  for (bool overlap : {true, false}) {
    SCOPED_TRACE(overlap ? "overlap" : "no overlap");
    // Without overlap every load comes before any compute: nothing may be held back.
    GatedBacking gated(host->get(), /*first=*/3, /*open=*/!overlap);
    auto stream = ExpertStream::Create(&gated, ExpertBytes() / 4, overlap);
    ASSERT_TRUE(stream.ok());
    ASSERT_EQ((*stream)->BeginLayer(2, loads), absl::OkStatus());
    const int finished_at_begin = gated.finished;
    auto first = (*stream)->Wait(2, 3, 384);
    ASSERT_TRUE(first.ok()) << first.status();
    const int finished_at_first = gated.finished;
    gated.Open();
    for (const auto& load : loads) ASSERT_TRUE((*stream)->Wait(2, load.expert, load.width).ok());
    (*stream)->EndLayer(2);
    if (overlap) {
      // The widest expert is in, and computable, while the others still load.
      EXPECT_LE(finished_at_begin, 1);
      EXPECT_EQ(finished_at_first, 1);
    } else {
      EXPECT_EQ(finished_at_begin, 4);  // every load before any compute
    }
    EXPECT_EQ(gated.finished, 4);
    // Asking for an expert the layer did not begin with is a clear error.
    ASSERT_EQ((*stream)->BeginLayer(0, loads), absl::OkStatus());
    EXPECT_EQ((*stream)->Wait(0, 9, 10).status().code(), absl::StatusCode::kInvalidArgument);
    (*stream)->EndLayer(0);
  }
}

TEST_P(ExpertStreamTest, ACacheTooSmallForALayerIsAClearError) {
  auto backing = HostBacking(*pack_);
  ASSERT_TRUE(backing.ok());
  const PackLayout layout = PackLayout::For(full_->config);
  const int64_t one_expert = int64_t{layout.bundles()} * layout.bundle_bytes();
  auto stream = ExpertStream::Create(backing->get(), one_expert, true);
  ASSERT_TRUE(stream.ok());
  auto pool = engine::KvBlockPool::Create({6, 2, 32, 16, 8});
  ASSERT_TRUE(pool.ok());
  auto forward = engine::ForwardPass::Create(slim_, pool->get());
  ASSERT_TRUE(forward.ok());
  (*forward)->SetExpertProvider(stream->get());
  engine::BlockTable table;
  ASSERT_TRUE(table.Reserve(pool->get(), 40).ok());
  std::vector<int32_t> ids(40, 300);
  for (int i = 0; i < 40; ++i) ids[i] = 100 + 37 * i;
  engine::StepInput in{ids, 0, &table};
  std::vector<std::vector<float>> logits;
  EXPECT_EQ((*forward)->Step({&in, 1}, {}, &logits).code(), absl::StatusCode::kResourceExhausted);
  table.ReleaseAll(pool->get());
  // Without a provider the expert-less model refuses to run at all.
  (*forward)->SetExpertProvider(nullptr);
  ASSERT_TRUE(table.Reserve(pool->get(), 40).ok());
  EXPECT_EQ((*forward)->Step({&in, 1}, {}, &logits).code(), absl::StatusCode::kInvalidArgument);
  table.ReleaseAll(pool->get());
}

INSTANTIATE_TEST_SUITE_P(Formats, ExpertStreamTest, ::testing::Values(0, 8, 4),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return info.param == 0 ? std::string("bf16")
                                                  : absl::StrCat("int", info.param);
                         });

// The fine-grained model (64 experts, top-8, a shared expert), bf16 and int4, decoding with
// top-k tiers whose widths by rank narrow and skip ranks in every tier (a plan from its own
// calibration statistics): streamed from the O_DIRECT pack through a cache of a quarter of the
// experts, the logits equal the resident model's with the same plan, bit for bit. With int4 a
// narrow width is a prefix of whole quantized bundles (32 neurons).
class FineGrainedStreamTest : public ExpertStreamTest {
 protected:
  void SetUp() override {
    StreamModel* model = Model(GetParam(), "tiny-fg-moe");
    ASSERT_NE(model, nullptr);
    full_ = model->full;
    slim_ = model->slim;
    pack_ = &model->pack;
  }
};

TEST_P(FineGrainedStreamTest, TopKTiersStreamedEqualResident) {
  const model::ModelConfig& c = full_->config;
  ASSERT_EQ(c.num_experts_per_tok, 8);
  auto calibration = LoadCalibrationStats(testing::SourceDir() +
                                          "/models/tiny-fg-moe/pruning/calibration-valid.json");
  ASSERT_TRUE(calibration.ok()) << calibration.status();
  auto plan = MakePlan(*calibration, tandem::v1::PRUNING_CRITERION_FREQUENCY, 64);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(AssignTiers(*calibration,
                        {.hot_share = 0.3,
                         .warm_share = 0.4,
                         .warm_width = 32,
                         .hot_widths = {96, 96, 96, 96, 96, 96, 64, 64},
                         .warm_widths = {96, 96, 96, 96, 64, 64, 32, 0},
                         .cold_widths = {96, 0, 96, 64, 32, 0, 0, 0}},
                        nullptr, c, &*plan),
            absl::OkStatus());
  auto tiers = TierWidthPolicy::Create(*plan, c);
  ASSERT_TRUE(tiers.ok()) << tiers.status();
  const auto resident = Run(*full_, nullptr, tiers->get());
  const TierWidthPolicy::Counts counts = (*tiers)->counts();
  EXPECT_GT(counts.hot, 0);
  EXPECT_GT(counts.warm, 0);
  EXPECT_GT(counts.cold, 0);
  auto backing = DirectFileBacking(*pack_);
  if (backing.status().code() == absl::StatusCode::kFailedPrecondition) {
    backing = HostBacking(*pack_);  // no O_DIRECT on this file system: the same bytes from memory
  }
  ASSERT_TRUE(backing.ok()) << backing.status();
  auto stream = ExpertStream::Create(backing->get(), ExpertBytes() / 4, true);
  ASSERT_TRUE(stream.ok()) << stream.status();
  EXPECT_EQ(Run(*slim_, stream->get(), tiers->get()), resident);
  const StreamStats stats = (*stream)->stats();
  EXPECT_GT(stats.cache.evictions, 0);
  EXPECT_GT(stats.cache.widenings, 0);  // narrow copies were widened
}

// Published layouts' experts streamed through a cache of three eighths of them (a layer's
// eight, and one): gpt-oss's (MXFP4 loaded as int8, with biases and the clamped SwiGLU; the
// biases stay resident with the router) and Gemma 4's (stacked, GeGLU, beside a dense MLP in
// every layer, their per-expert scales with the router): the slim model's logits equal the
// resident model's, prompt and decode, bit for bit.
class StackedExpertsStreamTest : public ::testing::TestWithParam<const char*> {};

TEST_P(StackedExpertsStreamTest, StreamedEqualResident) {
  const std::string dir = testing::SourceDir() + "/tests/golden/arch/" + GetParam();
  auto full =
      engine::LoadModelWeights(*testing::OpenModelDir(dir), engine::LoadFormat::kSafetensors);
  ASSERT_TRUE(full.ok()) << full.status();
  const model::ModelConfig& c = (*full)->config;
  engine::ExpertMask none;
  none.retained.assign(c.num_hidden_layers, std::vector<bool>(c.num_local_experts, false));
  auto slim = engine::LoadModelWeights(*testing::OpenModelDir(dir),
                                       engine::LoadFormat::kSafetensors, 0, none);
  ASSERT_TRUE(slim.ok()) << slim.status();
  EXPECT_EQ((*slim)->layers[1].moe.experts[3].down_bias.empty(), !c.expert_bias);
  testing::TempDir tmp;
  const std::string pack = tmp.path() + "/experts.pack";
  ASSERT_EQ(WriteExpertPack(**full, pack), absl::OkStatus());
  std::ifstream golden(dir + "/golden.json");
  const auto ids = nlohmann::json::parse(golden)["token_ids"].get<std::vector<int32_t>>();
  // The first 16 tokens as a prompt, then the rest one at a time.
  auto run = [&](const engine::ModelWeights& weights, engine::ExpertProvider* provider) {
    auto pool = engine::KvBlockPool::Create(
        engine::KvCacheConfigFor(c, 16, static_cast<int>(ids.size() + 15) / 16,
                                 kernels::KvDtype::kF32, /*max_sequences=*/1));
    EXPECT_TRUE(pool.ok());
    auto forward = engine::ForwardPass::Create(&weights, pool->get());
    EXPECT_TRUE(forward.ok());
    (*forward)->SetExpertProvider(provider);
    engine::BlockTable table;
    EXPECT_TRUE(table.Reserve(pool->get(), static_cast<int>(ids.size())).ok());
    std::vector<std::vector<float>> out, logits;
    for (size_t begin = 0; begin < ids.size(); begin = begin == 0 ? 16 : begin + 1) {
      const size_t end = begin == 0 ? 16 : begin + 1;
      engine::StepInput in{absl::MakeConstSpan(ids).subspan(begin, end - begin),
                           static_cast<int>(begin), &table};
      EXPECT_EQ((*forward)->Step({&in, 1}, {}, &logits), absl::OkStatus());
      out.push_back(logits[0]);
    }
    table.ReleaseAll(pool->get());
    return out;
  };
  const auto resident = run(**full, nullptr);
  auto backing = HostBacking(pack);
  ASSERT_TRUE(backing.ok()) << backing.status();
  const PackLayout layout = PackLayout::For(c);
  const int64_t all =
      c.num_hidden_layers * c.num_local_experts * layout.bundles() * layout.bundle_bytes();
  auto stream = ExpertStream::Create(backing->get(), all * 3 / 8, /*overlap=*/true);
  ASSERT_TRUE(stream.ok()) << stream.status();
  EXPECT_EQ(run(**slim, stream->get()), resident);
  EXPECT_GT((*stream)->stats().cache.evictions, 0);
}

INSTANTIATE_TEST_SUITE_P(Published, StackedExpertsStreamTest,
                         ::testing::Values("gpt_oss_mxfp4", "gemma4_moe"));

INSTANTIATE_TEST_SUITE_P(Formats, FineGrainedStreamTest, ::testing::Values(0, 4),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return info.param == 0 ? std::string("bf16")
                                                  : absl::StrCat("int", info.param);
                         });

}  // namespace
}  // namespace tandem::moe
