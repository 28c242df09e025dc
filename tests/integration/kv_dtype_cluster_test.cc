// The KV cache in bf16 and int8 through real processes (docs/kv-cache.md): a disaggregated
// cluster whose prefill and decode both store `--kv_dtype` — the smaller blocks moving over UCX
// unchanged — gives exactly the greedy tokens of colocated tandem-serve with the same dtype
// (tiny-moe in bf16 and int8; the hybrid in int8, its recurrent state float32 beside), and
// reports the dtype and the pool's bytes on /metrics; a prefill and a decode configured with
// different dtypes refuse the request, naming both dtypes, and a bad --kv_dtype stops a service
// at start-up.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "tandem/v1/gateway.pb.h"
#include "tests/testing/cluster_client.h"
#include "tests/testing/subprocess.h"

namespace tandem {
namespace {

constexpr int kTokens = 24;

using testing::MetricValue;

// (shipped model, dtype): the hybrid's recurrent state stays float32 whatever the KV dtype.
struct DtypeCase {
  const char* model;
  const char* dtype;
};

class KvDtypeClusterTest : public ::testing::TestWithParam<DtypeCase> {};

TEST_P(KvDtypeClusterTest, ClusterEqualsColocatedServingWithTheSameDtype) {
  const std::string dtype = GetParam().dtype;
  const std::string flag = "--kv_dtype=" + dtype;
  const std::string model = testing::SourceDir() + "/models/" + GetParam().model;
  const nlohmann::json manifest = testing::LoadGoldenManifest(GetParam().model);
  std::vector<std::vector<int32_t>> disaggregated, colocated;
  {
    testing::ServiceSet set(model);
    auto cluster = set.StartCluster({flag}, {flag, "--kv_blocks=160"});
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    auto client = testing::ConnectClient(cluster->gateway);
    ASSERT_NE(client, nullptr);
    disaggregated = testing::GreedyContinuations(client.get(), manifest, kTokens);
    EXPECT_EQ(
        MetricValue(cluster->decode.http_port, "tandem_kv_cache_info", "dtype=\"" + dtype + "\""),
        1);
    EXPECT_GT(MetricValue(cluster->decode.http_port, "tandem_kv_cache_bytes", ""), 0);
  }
  colocated = testing::ColocatedContinuations(model, {flag}, manifest, kTokens);
  testing::ExpectSameContinuations(disaggregated, colocated, kTokens);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, KvDtypeClusterTest,
                         ::testing::Values(DtypeCase{"tiny-moe", "bf16"},
                                           DtypeCase{"tiny-moe", "int8"},
                                           DtypeCase{"tiny-hybrid-moe", "int8"}),
                         [](const auto& info) {
                           std::string name =
                               std::string(info.param.model) + "_" + info.param.dtype;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

TEST(KvDtypeMismatchTest, PrefillAndDecodeOfDifferentDtypesRefuseTheRequest) {
  testing::ServiceSet set(testing::SourceDir() + "/models/tiny-moe");
  auto cluster = set.StartCluster({"--kv_dtype=bf16"}, {"--kv_dtype=f32"});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto client = testing::ConnectClient(cluster->gateway);
  ASSERT_NE(client, nullptr);
  v1::GenerateRequest request;
  request.set_prompt("Once upon a time");
  request.mutable_sampling()->set_max_tokens(4);
  auto response = client->Generate(request);
  // The gateway finds no prefill instance that can serve the decode instance it chose.
  ASSERT_FALSE(response.ok());
  EXPECT_EQ(response.status().code(), absl::StatusCode::kUnavailable) << response.status();
  EXPECT_NE(response.status().message().find("KV geometry mismatch in dtype"), std::string::npos)
      << response.status();
  EXPECT_NE(response.status().message().find("KV_DTYPE_F32"), std::string::npos)
      << response.status();
  EXPECT_NE(response.status().message().find("KV_DTYPE_BF16"), std::string::npos)
      << response.status();
}

TEST(KvDtypeMismatchTest, AnUnknownDtypeStopsTheServiceNamingTheFlag) {
  testing::ServiceSet set(testing::SourceDir() + "/models/tiny-moe");
  auto decode = set.Start("tandem-decode", {"--kv_dtype=fp8"});
  EXPECT_FALSE(decode.ok());
  const std::string log = set.Log("tandem-decode");
  EXPECT_NE(log.find("--kv_dtype"), std::string::npos) << log;
  EXPECT_NE(log.find("fp8"), std::string::npos) << log;
}

}  // namespace
}  // namespace tandem
