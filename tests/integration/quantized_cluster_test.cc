// A quantized model (tandem quantize: int4 experts and attention in its default groups, 64 on this
// model) through real processes, on the default kernel level (int8 activations): a full
// disaggregated cluster — prefill and decode both holding the int4 checkpoint, KV over UCX — gives
// exactly the greedy tokens of colocated tandem-serve on the same checkpoint, and reports its
// weights on /metrics; a streamed, mixed-width, pruned decoder of the int4 checkpoint (experts read
// from an O_DIRECT pack of int4 bundles into a cache of a quarter of them) equals colocated
// resident serving with the same plan.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "tests/testing/cluster_client.h"
#include "tests/testing/mixed_width_model.h"
#include "tests/testing/subprocess.h"

namespace tandem {
namespace {

constexpr int kTokens = 24;

using testing::MetricValue;

class QuantizedClusterTest : public ::testing::Test {
 protected:
  // Disaggregated (with `decode_flags`) and colocated (with `serve_flags`) greedy tokens of
  // `model_dir`; the decode's tandem_engine_info{weights="int4"} and expert cache misses.
  void Compare(const std::string& model_dir, const std::vector<std::string>& decode_flags,
               const std::vector<std::string>& serve_flags, double* engine_info, double* misses) {
    std::vector<std::vector<int32_t>> disaggregated, colocated;
    {
      testing::ServiceSet set(model_dir);
      std::vector<std::string> flags = decode_flags;
      flags.push_back("--kv_blocks=160");
      auto cluster = set.StartCluster({}, flags);
      ASSERT_TRUE(cluster.ok()) << cluster.status();
      auto client = testing::ConnectClient(cluster->gateway);
      ASSERT_NE(client, nullptr);
      disaggregated = testing::GreedyContinuations(client.get(), manifest_, kTokens);
      *engine_info =
          MetricValue(cluster->decode.http_port, "tandem_engine_info", "weights=\"int4\"");
      *misses = MetricValue(cluster->decode.http_port, "tandem_expert_cache_requests_total",
                            "result=\"miss\"");
    }
    colocated = testing::ColocatedContinuations(model_dir, serve_flags, manifest_, kTokens);
    testing::ExpectSameContinuations(disaggregated, colocated, kTokens);
  }

  const nlohmann::json manifest_ = testing::LoadGoldenManifest();
};

TEST_F(QuantizedClusterTest, Int4ClusterEqualsColocatedServing) {
  testing::TempDir work;
  const std::string model = work.path() + "/tiny-moe-int4";
  const std::string command = absl::StrCat(testing::BinDir(), "/tandem quantize --model ",
                                           testing::SourceDir(), "/models/tiny-moe --bits 4 --out ",
                                           model, " > ", work.path(), "/quantize.log 2>&1");
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  double engine_info = -1, misses = -1;
  Compare(model, {}, {}, &engine_info, &misses);
  EXPECT_EQ(engine_info, 1);
}

TEST_F(QuantizedClusterTest, StreamedMixedWidthInt4DecoderEqualsColocatedResident) {
  testing::TempDir work;
  auto prepared = testing::MakeMixedWidthModel(work.path(), "tiny-moe", "reap-keep8.json", 4);
  ASSERT_TRUE(prepared.ok()) << prepared.status();
  const std::string plan = "--plan=" + prepared->plan;
  // 6 layers x 16 experts of int4 bundles (3 x 384 x 192 levels of half a byte, float16 scales
  // per 64: tandem quantize's default group on this model), a quarter of it.
  const int64_t expert_bytes = int64_t{3} * 384 * 192 / 2 + int64_t{3} * 384 * 192 / 64 * 2;
  const std::string cache = absl::StrCat("--expert_cache_bytes=", 6 * 16 * expert_bytes / 4);
  double engine_info = -1, misses = -1;
  Compare(prepared->model_dir, {plan, "--expert_pack=" + prepared->pack, cache}, {plan},
          &engine_info, &misses);
  EXPECT_EQ(engine_info, 1);
  EXPECT_GT(misses, 0);  // the experts really streamed
}

// A pack must hold the model's own format: a bf16 pack behind an int4 checkpoint stops the
// decoder at start-up, naming both.
TEST_F(QuantizedClusterTest, APackOfAnotherFormatStopsTheDecoder) {
  testing::TempDir work;
  const std::string source = testing::SourceDir() + "/models/tiny-moe";
  const std::string model = work.path() + "/tiny-moe-int4";
  const std::string pack =
      absl::StrCat(testing::BinDir(), "/quantized_cluster_test.", getpid(), ".bf16.pack");
  const std::string tandem = testing::BinDir() + "/tandem";
  ASSERT_EQ(std::system((tandem + " quantize --model " + source + " --bits 4 --out " + model +
                         " > /dev/null 2>&1 && " + tandem + " pack --model " + source + " --out " +
                         pack + " > /dev/null 2>&1")
                            .c_str()),
            0);
  testing::ServiceSet set(model);
  auto decode =
      set.Start("tandem-decode", {"--expert_pack=" + pack, "--expert_cache_bytes=50000000"});
  std::filesystem::remove(pack);
  EXPECT_EQ(decode.status().code(), absl::StatusCode::kFailedPrecondition) << decode.status();
  const std::string log = set.Log("tandem-decode");
  EXPECT_NE(log.find("16 bf16 experts"), std::string::npos) << log;
  EXPECT_NE(log.find("not this model's (int4, group 64)"), std::string::npos) << log;
}

}  // namespace
}  // namespace tandem
