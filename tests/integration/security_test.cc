// The internal APIs closed: prefill and decode served over mutual TLS and requiring the
// cluster's shared secret; the gateway dials them with its client certificate and the secret
// and serves as before. Anyone else is refused: plaintext, TLS without a client certificate,
// a certificate from another CA, a good certificate without the secret. Real processes, real
// certificates (made here with openssl).
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "tandem/client.h"
#include "tandem/v1/decode.grpc.pb.h"
#include "tandem/v1/prefill.grpc.pb.h"
#include "tests/testing/subprocess.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;

std::string Read(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A CA, a server certificate for 127.0.0.1 and the name "tandem-internal", a client
// certificate from that CA, and a client certificate from another CA.
class Pki {
 public:
  explicit Pki(const std::string& dir) : dir_(dir) {}
  bool Make() {
    const std::string d = dir_;
    const std::string log = " >> " + d + "/openssl.log 2>&1";
    const std::string ext = d + "/server.ext";
    std::ofstream(ext) << "subjectAltName=IP:127.0.0.1,DNS:tandem-internal\n";
    for (const char* ca : {"ca", "rogue"}) {
      if (std::system(
              absl::StrCat("openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=", ca,
                           " -keyout ", d, "/", ca, ".key -out ", d, "/", ca, ".pem", log)
                  .c_str()) != 0) {
        return false;
      }
    }
    struct Leaf {
      const char* name;
      const char* ca;
      bool server;
    };
    for (const Leaf& leaf : {Leaf{"server", "ca", true}, Leaf{"client", "ca", false},
                             Leaf{"intruder", "rogue", false}}) {
      const std::string base = d + "/" + leaf.name;
      if (std::system(absl::StrCat("openssl req -newkey rsa:2048 -nodes -subj /CN=", leaf.name,
                                   " -keyout ", base, ".key -out ", base, ".csr", log)
                          .c_str()) != 0 ||
          std::system(absl::StrCat("openssl x509 -req -in ", base, ".csr -CA ", d, "/", leaf.ca,
                                   ".pem -CAkey ", d, "/", leaf.ca, ".key -CAcreateserial -days 1",
                                   leaf.server ? " -extfile " + ext : std::string(), " -out ", base,
                                   ".pem", log)
                          .c_str()) != 0) {
        return false;
      }
    }
    std::ofstream(d + "/secret") << "correct-horse-battery-staple-42\n";
    return true;
  }
  std::string path(const std::string& file) const { return dir_ + "/" + file; }

 private:
  std::string dir_;
};

class SecurityTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    set_ = new testing::ServiceSet();
    pki_ = new Pki(set_->dir());
    ASSERT_TRUE(pki_->Make()) << "openssl failed (scripts/setup.sh installs it)";
    const std::vector<std::string> server = {"--tls_cert_file=" + pki_->path("server.pem"),
                                             "--tls_key_file=" + pki_->path("server.key"),
                                             "--tls_client_ca_file=" + pki_->path("ca.pem"),
                                             "--internal_secret_file=" + pki_->path("secret")};
    auto decode = set_->Start("tandem-decode", server);
    ASSERT_TRUE(decode.ok()) << decode.status();
    decode_ = *decode;
    auto prefill = set_->Start("tandem-prefill", server);
    ASSERT_TRUE(prefill.ok()) << prefill.status();
    prefill_ = *prefill;
    auto gateway =
        set_->Start("tandem-gateway", {absl::StrCat("--prefill=127.0.0.1:", prefill_.grpc_port),
                                       absl::StrCat("--decode=127.0.0.1:", decode_.grpc_port),
                                       "--internal_tls_root_certs_file=" + pki_->path("ca.pem"),
                                       "--internal_tls_cert_file=" + pki_->path("client.pem"),
                                       "--internal_tls_key_file=" + pki_->path("client.key"),
                                       "--internal_tls_server_name=tandem-internal",
                                       "--internal_secret_file=" + pki_->path("secret")});
    ASSERT_TRUE(gateway.ok()) << gateway.status();
    gateway_ = *gateway;
  }
  static void TearDownTestSuite() {
    delete pki_;
    delete set_;
  }

  // GetInfo on decode with these credentials and, if set, the secret.
  static grpc::Status DecodeInfo(std::shared_ptr<grpc::ChannelCredentials> credentials,
                                 const std::string& secret) {
    grpc::ChannelArguments args;
    args.SetSslTargetNameOverride("tandem-internal");
    auto channel =
        grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", decode_.grpc_port), credentials, args);
    auto stub = v1::Decode::NewStub(channel);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    if (!secret.empty()) context.AddMetadata("authorization", "Bearer " + secret);
    v1::InstanceInfo info;
    return stub->GetInfo(&context, {}, &info);
  }
  static std::shared_ptr<grpc::ChannelCredentials> Tls(const std::string& client) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = Read(pki_->path("ca.pem"));
    if (!client.empty()) {
      ssl.pem_cert_chain = Read(pki_->path(client + ".pem"));
      ssl.pem_private_key = Read(pki_->path(client + ".key"));
    }
    return grpc::SslCredentials(ssl);
  }

  static testing::ServiceSet* set_;
  static Pki* pki_;
  static testing::Ports decode_, prefill_, gateway_;
};

testing::ServiceSet* SecurityTest::set_ = nullptr;
Pki* SecurityTest::pki_ = nullptr;
testing::Ports SecurityTest::decode_, SecurityTest::prefill_, SecurityTest::gateway_;

TEST_F(SecurityTest, TheGatewayGeneratesThroughMutualTlsAndTheSecret) {
  auto client = sdk::Client::Connect(absl::StrCat("127.0.0.1:", gateway_.grpc_port));
  ASSERT_TRUE(client.ok()) << client.status();
  v1::GenerateRequest request;
  request.set_prompt("The jury said");
  request.mutable_sampling()->set_max_tokens(8);
  auto response = (*client)->Generate(request);
  ASSERT_TRUE(response.ok()) << response.status() << set_->Log("tandem-gateway");
  EXPECT_EQ(response->token_ids_size(), 8);
}

TEST_F(SecurityTest, EveryoneElseIsRefused) {
  const std::string secret = "correct-horse-battery-staple-42";
  // Plaintext: no TLS handshake, no call.
  EXPECT_EQ(DecodeInfo(grpc::InsecureChannelCredentials(), secret).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  // TLS without a client certificate, and with one from another CA.
  EXPECT_EQ(DecodeInfo(Tls(""), secret).error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(DecodeInfo(Tls("intruder"), secret).error_code(), grpc::StatusCode::UNAVAILABLE);
  // A good certificate, but no secret or a wrong one.
  grpc::Status no_secret = DecodeInfo(Tls("client"), "");
  EXPECT_EQ(no_secret.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(no_secret.error_message(), HasSubstr("shared secret"));
  EXPECT_EQ(DecodeInfo(Tls("client"), secret + "x").error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  // Prefill too.
  grpc::ChannelArguments args;
  args.SetSslTargetNameOverride("tandem-internal");
  auto prefill = v1::Prefill::NewStub(grpc::CreateCustomChannel(
      absl::StrCat("127.0.0.1:", prefill_.grpc_port), Tls("client"), args));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::PrefillRequest request;
  v1::PrefillResponse response;
  EXPECT_EQ(prefill->Prefill(&context, request, &response).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  // Both: accepted.
  EXPECT_TRUE(DecodeInfo(Tls("client"), secret).ok());
}

TEST_F(SecurityTest, AGatewayWithoutTheCredentialsCannotUseTheCluster) {
  testing::ServiceSet plain;
  auto gateway =
      plain.Start("tandem-gateway", {absl::StrCat("--prefill=127.0.0.1:", prefill_.grpc_port),
                                     absl::StrCat("--decode=127.0.0.1:", decode_.grpc_port)});
  ASSERT_TRUE(gateway.ok()) << gateway.status();
  auto client = sdk::Client::Connect(absl::StrCat("127.0.0.1:", gateway->grpc_port));
  ASSERT_TRUE(client.ok());
  v1::GenerateRequest request;
  request.set_prompt("The jury said");
  auto response = (*client)->Generate(request);
  ASSERT_FALSE(response.ok());
  EXPECT_EQ(response.status().code(), absl::StatusCode::kUnavailable) << response.status();
}

}  // namespace
}  // namespace tandem
