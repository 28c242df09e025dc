// SHA-256 of files against the FIPS 180-2 test vectors, and a missing file.
#include "common/util/sha256.h"

#include <gtest/gtest.h>

#include <fstream>

#include "tests/testing/subprocess.h"

namespace tandem::util {
namespace {

TEST(Sha256Test, KnownVectorsAndAMissingFile) {
  testing::TempDir dir;
  std::ofstream(dir.path() + "/empty");
  std::ofstream(dir.path() + "/abc") << "abc";
  {
    std::ofstream million(dir.path() + "/million");
    million << std::string(1000000, 'a');  // more than one read buffer
  }
  EXPECT_EQ(*Sha256OfFile(dir.path() + "/empty"),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(*Sha256OfFile(dir.path() + "/abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(*Sha256OfFile(dir.path() + "/million"),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  EXPECT_EQ(Sha256OfFile(dir.path() + "/none").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace tandem::util
