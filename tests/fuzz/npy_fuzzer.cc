// .npy files as the golden tests read them (model::ReadNpy): header parsing and validation,
// every element conversion, and the writer: a parsed array written again (np.save's bytes)
// must parse back to the same array.
#include "common/model/npy.h"
#include "tests/fuzz/fuzz_util.h"

namespace tandem::model {
namespace {

void CheckValid(const NpyArray& a) {
  int64_t elements = 1;
  for (int64_t d : a.shape) {
    FUZZ_CHECK(d >= 0);
    FUZZ_CHECK(!__builtin_mul_overflow(elements, d, &elements));
  }
  FUZZ_CHECK(a.num_elements() == elements);
  // Each conversion either succeeds with one value per element or says why not.
  auto check = [&](const auto& converted) {
    if (converted.ok()) {
      FUZZ_CHECK(static_cast<int64_t>(converted->size()) == elements);
    } else {
      FUZZ_CHECK(converted.status().code() == absl::StatusCode::kInvalidArgument);
    }
  };
  check(a.AsFloat32());
  check(a.AsFloat64());
  check(a.AsInt32());
  check(a.AsInt64());

  absl::StatusOr<std::string> bytes = SerializeNpy(a);
  FUZZ_CHECK(bytes.ok());
  absl::StatusOr<NpyArray> again = ParseNpy(*bytes);
  FUZZ_CHECK(again.ok());
  FUZZ_CHECK(again->dtype == a.dtype);
  FUZZ_CHECK(again->shape == a.shape);
  FUZZ_CHECK(again->data == a.data);
}

}  // namespace
}  // namespace tandem::model

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static tandem::fuzz::MemFile* file = new tandem::fuzz::MemFile();
  absl::StatusOr<tandem::model::NpyArray> array = tandem::model::ReadNpy(file->Write(data, size));
  if (array.ok()) {
    tandem::model::CheckValid(*array);
  } else {
    FUZZ_CHECK(array.status().code() == absl::StatusCode::kInvalidArgument);
  }
  return 0;
}
