// Decoder overlays (common/engine/overlay.h) on the shipped tiny model: what loads, what is
// refused (another checkpoint, another plan, a tensor that is not always-on, a wrong shape, a
// file that is not an overlay), and how the forward pass uses one: only for the sequences whose
// options name it (a prompt keeps the model's weights while a generated token in the same step
// runs the overlay's), never touching the model's own tensors.
#include "common/engine/overlay.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/engine/forward.h"
#include "common/kernels/cpu/kernels.h"
#include "common/model/safetensors.h"
#include "common/moe/pruning_plan.h"
#include "common/util/sha256.h"
#include "nlohmann/json.hpp"
#include "tests/testing/model_dir.h"
#include "tests/testing/subprocess.h"

namespace tandem::engine {
namespace {

using model::DType;
using model::TensorView;

// Tensors to write, owning their bytes.
struct Tensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<std::byte> bytes;
};

Tensor F32(const std::string& name, std::vector<int64_t> shape, float value) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<float> v(n, value);
  Tensor t{name, DType::kF32, std::move(shape), std::vector<std::byte>(n * 4)};
  std::memcpy(t.bytes.data(), v.data(), t.bytes.size());
  return t;
}

class OverlayTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_dir_ = new std::string(testing::SourceDir() + "/models/tiny-moe");
    auto weights = LoadModelWeights(*testing::OpenModelDir(*model_dir_), LoadFormat::kSafetensors);
    ASSERT_TRUE(weights.ok()) << weights.status();
    weights_ = weights->release();
    auto sha = CheckpointSha256(*model_dir_);
    ASSERT_TRUE(sha.ok()) << sha.status();
    base_sha_ = new std::string(*sha);
  }
  static void TearDownTestSuite() {
    delete weights_;
    delete model_dir_;
    delete base_sha_;
  }

  void SetUp() override {
    const auto& c = weights_->config;
    // Keep experts 0..7 of every layer.
    plan_.retained.assign(c.num_hidden_layers, std::vector<bool>(c.num_local_experts, false));
    for (auto& layer : plan_.retained) std::fill(layer.begin(), layer.begin() + 8, true);
  }

  std::map<std::string, std::string> Metadata() const {
    return {{"format", kOverlayFormat},
            {"version", kOverlayVersion},
            {"base_model", "tiny-moe"},
            {"base_sha256", *base_sha_},
            {"plan", "first-eight.json"},
            {"plan_sha256", PlanSha256(plan_, weights_->config)},
            {"recipe", "{}"}};
  }

  // Writes `tensors` with `metadata` to a file in the test's directory.
  std::string Write(const std::vector<Tensor>& tensors,
                    const std::map<std::string, std::string>& metadata) {
    std::vector<TensorView> views;
    for (const Tensor& t : tensors) {
      views.push_back({t.name, t.dtype, t.shape, t.bytes.data(), t.bytes.size()});
    }
    const std::string path = absl::StrCat(dir_.path(), "/overlay-", ++files_, ".safetensors");
    EXPECT_TRUE(model::WriteSafetensors(path, views, metadata).ok());
    return path;
  }

  // A small valid overlay: layer 0's router, layer 2's attention norm and the final norm.
  std::vector<Tensor> Valid() const {
    return {F32("model.layers.0.block_sparse_moe.gate.weight", {16, 192}, 0.01f),
            F32("model.layers.2.input_layernorm.weight", {192}, 1.5f),
            F32("model.norm.weight", {192}, 0.75f)};
  }

  absl::StatusOr<std::unique_ptr<DecoderOverlay>> Load(const std::string& path) {
    return LoadDecoderOverlay(path, *testing::OpenModelDir(*model_dir_), *weights_, plan_);
  }

  static std::string* model_dir_;
  static ModelWeights* weights_;
  static std::string* base_sha_;
  ExpertMask plan_;
  testing::TempDir dir_;
  int files_ = 0;
};

std::string* OverlayTest::model_dir_ = nullptr;
ModelWeights* OverlayTest::weights_ = nullptr;
std::string* OverlayTest::base_sha_ = nullptr;

TEST_F(OverlayTest, LoadsTheFilesTensorsAndTheModelsForTheRest) {
  const std::string path = Write(Valid(), Metadata());
  auto overlay = Load(path);
  ASSERT_TRUE(overlay.ok()) << overlay.status();
  const DecoderOverlay& o = **overlay;
  EXPECT_EQ(o.tensors.size(), 3u);
  EXPECT_EQ(o.name, "overlay-1");
  EXPECT_EQ(o.sha256, *util::Sha256OfFile(path));
  ASSERT_EQ(o.layers.size(), 6u);
  // The router is held as bf16, as the model's are.
  EXPECT_EQ(o.layers[0].moe.router.rows(), 16);
  EXPECT_EQ(o.layers[0].moe.router.format(), kernels::WeightFormat::kBf16);
  EXPECT_EQ(o.layers[0].moe.router.at(0, 0),
            kernels::cpu::Bf16ToF32(kernels::cpu::F32ToBf16(0.01f)));
  EXPECT_EQ(o.layers[2].attn_norm, std::vector<float>(192, 1.5f));
  EXPECT_EQ(o.final_norm, std::vector<float>(192, 0.75f));
  // What the file does not hold is the model's.
  EXPECT_TRUE(o.layers[1].moe.router.data == weights_->layers[1].moe.router.data);
  EXPECT_EQ(o.layers[0].attn_norm, weights_->layers[0].attn_norm);
  EXPECT_EQ(o.layers[2].ffn_norm, weights_->layers[2].ffn_norm);
  // Only always-on fields: no attention or experts.
  EXPECT_TRUE(o.layers[0].attention.q.data.empty());
  EXPECT_TRUE(o.layers[0].moe.experts.empty());
}

TEST_F(OverlayTest, RefusesAnOverlayMadeForAnotherCheckpoint) {
  auto metadata = Metadata();
  metadata["base_sha256"] = std::string(64, '0');
  auto overlay = Load(Write(Valid(), metadata));
  ASSERT_EQ(overlay.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(overlay.status().message().find("made for base model \"tiny-moe\""), std::string::npos)
      << overlay.status();
  EXPECT_NE(overlay.status().message().find(base_sha_->substr(0, 12)), std::string::npos);
}

TEST_F(OverlayTest, RefusesAnOverlayMadeForAnotherPlanOrUsedWithoutOne) {
  const std::string path = Write(Valid(), Metadata());
  plan_.retained[3][0] = false;  // another plan: expert 8 for expert 0 in layer 3
  plan_.retained[3][8] = true;
  auto other = Load(path);
  ASSERT_EQ(other.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(other.status().message().find("made for pruning plan \"first-eight.json\""),
            std::string::npos)
      << other.status();
  plan_.retained.clear();  // the full model
  auto none = Load(path);
  ASSERT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(none.status().message().find("not the full model (no --plan)"), std::string::npos)
      << none.status();
}

TEST_F(OverlayTest, RefusesTensorsThatAreNotAlwaysOnOrNotOfTheModelsShape) {
  for (const char* frozen : {"model.layers.1.self_attn.q_proj.weight",
                             "model.layers.1.block_sparse_moe.experts.3.w1.weight",
                             "lm_head.weight", "model.embed_tokens.weight", "model.layers.9.x"}) {
    auto tensors = Valid();
    tensors.push_back(F32(frozen, {4}, 0.0f));
    auto overlay = Load(Write(tensors, Metadata()));
    ASSERT_EQ(overlay.status().code(), absl::StatusCode::kInvalidArgument) << frozen;
    EXPECT_NE(overlay.status().message().find(
                  absl::StrCat("tensor ", frozen, " is not an always-on tensor")),
              std::string::npos)
        << overlay.status();
  }
  auto tensors = Valid();
  tensors[1] = F32("model.layers.2.input_layernorm.weight", {191}, 1.0f);
  auto overlay = Load(Write(tensors, Metadata()));
  ASSERT_EQ(overlay.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(overlay.status().message().find("has shape [191], the model's is [192]"),
            std::string::npos)
      << overlay.status();
  auto empty = Load(Write({}, Metadata()));
  EXPECT_NE(empty.status().message().find("holds no tensors"), std::string::npos) << empty.status();
}

TEST_F(OverlayTest, RefusesFilesThatAreNotOverlays) {
  auto checkpoint = Load(*model_dir_ + "/model.safetensors");
  ASSERT_EQ(checkpoint.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(checkpoint.status().message().find("not a decoder overlay"), std::string::npos)
      << checkpoint.status();
  auto metadata = Metadata();
  metadata.erase("version");  // (assigning a literal trips a GCC 12 -Wrestrict false positive)
  metadata.emplace("version", "2");
  auto later = Load(Write(Valid(), metadata));
  EXPECT_NE(later.status().message().find("overlay version \"2\""), std::string::npos)
      << later.status();
  EXPECT_EQ(Load(dir_.path() + "/absent.safetensors").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(OverlayTest, PlanHashIsOfTheRetainedExpertsLineByLayer) {
  ExpertMask two;
  two.retained.assign(6, std::vector<bool>(16, false));
  for (auto& layer : two.retained) layer[1] = layer[5] = true;
  std::string text;
  for (int l = 0; l < 6; ++l) text += "1,5\n";
  EXPECT_EQ(PlanSha256(two, weights_->config), util::Sha256Hex(text));
  std::string all;
  for (int l = 0; l < 6; ++l) all += "0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15\n";
  EXPECT_EQ(PlanSha256({}, weights_->config), util::Sha256Hex(all));
}

// The forward pass runs an overlay only for the sequences whose options carry it; a prompt
// chunk and a generated token in one step each get the weights they would get alone, and the
// model's own tensors are left as they were.
TEST_F(OverlayTest, ForwardPassUsesTheOverlayPerSequenceAndLeavesTheModelUnchanged) {
  auto overlay = Load(Write(Valid(), Metadata()));
  ASSERT_TRUE(overlay.ok()) << overlay.status();
  const std::vector<float> norm_before = weights_->final_norm;
  const auto router_before = weights_->layers[0].moe.router.data;
  KvCacheConfig kv{6, 2, 32, /*block_size=*/8, /*num_blocks=*/32};
  auto pool = KvBlockPool::Create(kv);
  ASSERT_TRUE(pool.ok());
  auto forward = ForwardPass::Create(weights_, pool->get());
  ASSERT_TRUE(forward.ok());
  const MoeOptions full{};
  const MoeOptions pruned{.mask = &plan_};
  const MoeOptions distilled{.mask = &plan_, .overlay = overlay->get()};
  const std::vector<int32_t> prompt = {1, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49};
  const std::vector<int32_t> next = {50};

  // Alone: a prompt (the model's weights), then a generated token with `decode`.
  auto alone = [&](const MoeOptions& decode, std::vector<float>* prompt_logits) {
    BlockTable table;
    EXPECT_TRUE(table.Reserve(pool->get(), 12).ok());
    std::vector<std::vector<float>> logits;
    StepInput a{prompt, 0, &table, LogitRows::kLast, &full};
    EXPECT_TRUE((*forward)->Step({&a, 1}, full, &logits).ok());
    if (prompt_logits != nullptr) *prompt_logits = logits[0];
    StepInput b{next, 11, &table, LogitRows::kLast, &decode};
    EXPECT_TRUE((*forward)->Step({&b, 1}, full, &logits).ok());
    table.ReleaseAll(pool->get());
    return logits[0];
  };
  std::vector<float> prompt_alone;
  const std::vector<float> with_overlay = alone(distilled, &prompt_alone);
  const std::vector<float> without = alone(pruned, nullptr);
  EXPECT_NE(with_overlay, without) << "the overlay changed nothing";

  // Together: sequence 1 decodes its token with the overlay while sequence 2 prefills the same
  // prompt with the model's weights, in one step.
  BlockTable t1, t2;
  ASSERT_TRUE(t1.Reserve(pool->get(), 12).ok());
  ASSERT_TRUE(t2.Reserve(pool->get(), 12).ok());
  std::vector<std::vector<float>> logits;
  StepInput first{prompt, 0, &t1, LogitRows::kLast, &full};
  ASSERT_TRUE((*forward)->Step({&first, 1}, full, &logits).ok());
  StepInput batch[] = {{next, 11, &t1, LogitRows::kLast, &distilled},
                       {prompt, 0, &t2, LogitRows::kLast, &full}};
  ASSERT_TRUE((*forward)->Step(batch, full, &logits).ok());
  EXPECT_EQ(logits[0], with_overlay);
  EXPECT_EQ(logits[1], prompt_alone);
  // The step's own options carry it to sequences without their own.
  StepInput again{next, 11, &t2, LogitRows::kLast};
  ASSERT_TRUE((*forward)->Step({&again, 1}, distilled, &logits).ok());
  EXPECT_EQ(logits[0], with_overlay);
  t1.ReleaseAll(pool->get());
  t2.ReleaseAll(pool->get());

  EXPECT_EQ(weights_->final_norm, norm_before);
  EXPECT_EQ(weights_->layers[0].moe.router.data, router_before);
}

// Every overlay shipped in models/*/distill loads for the plan its name gives
// (CRITERION-keepK-{handoff,split0}), holds only always-on tensors, and says in its recipe how
// it was made; one made for another plan of the same model is refused.
TEST(ShippedOverlays, EachLoadsForItsPlanAndOnlyForIt) {
  int checked = 0;
  for (const char* name : {"tiny-moe", "tiny-fg-moe"}) {
    const std::string model_dir = testing::SourceDir() + "/models/" + name;
    const std::filesystem::path dir = model_dir + "/distill";
    if (!std::filesystem::exists(dir)) continue;
    auto weights = LoadModelWeights(*testing::OpenModelDir(model_dir), LoadFormat::kSafetensors);
    ASSERT_TRUE(weights.ok()) << weights.status();
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
      const std::string file = entry.path().filename().string();
      const absl::string_view kHandoff = "-handoff.safetensors", kSplit0 = "-split0.safetensors";
      const bool handoff = absl::EndsWith(file, kHandoff);
      ASSERT_TRUE(handoff || absl::EndsWith(file, kSplit0)) << file;
      const std::string plan_name(  // e.g. reap-keep8
          absl::string_view(file).substr(0, file.size() - (handoff ? kHandoff : kSplit0).size()));
      auto loaded = moe::LoadPlanMask(model_dir + "/pruning/" + plan_name + ".json",
                                      *testing::OpenModelDir(model_dir));
      ASSERT_TRUE(loaded.ok()) << file << ": " << loaded.status();
      ExpertMask plan = *std::move(loaded);
      auto overlay = LoadDecoderOverlay(entry.path().string(), *testing::OpenModelDir(model_dir),
                                        **weights, plan);
      ASSERT_TRUE(overlay.ok()) << overlay.status();
      const nlohmann::json recipe = nlohmann::json::parse((*overlay)->recipe);
      EXPECT_EQ(recipe["split"], handoff ? "uniform" : "zero") << file;
      EXPECT_EQ(recipe["alpha"], 0.1) << file;
      EXPECT_EQ(recipe["teacher_topk"], 64) << file;
      EXPECT_GT(recipe["tokens"].get<int64_t>(), 0) << file;
      // Another plan of the same model: refused.
      plan.retained[0].flip();
      EXPECT_EQ(LoadDecoderOverlay(entry.path().string(), *testing::OpenModelDir(model_dir),
                                   **weights, plan)
                    .status()
                    .code(),
                absl::StatusCode::kInvalidArgument)
          << file;
      ++checked;
    }
  }
  EXPECT_GE(checked, 8);
}

}  // namespace
}  // namespace tandem::engine
