// The Jinja engine (common/chat/jinja.h) on arbitrary templates and contexts: Parse and Render
// must never crash or hang, and fail only with the codes jinja.h names.
// Input: the template, a NUL byte, then the context as JSON (an empty object when absent or
// not a JSON object).
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/chat/jinja.h"
#include "common/util/clock.h"
#include "nlohmann/json.hpp"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using tandem::chat::JinjaTemplate;
  using tandem::chat::RenderLimits;
  const std::string_view input = tandem::fuzz::AsText(data, size);
  const size_t nul = input.find('\0');
  const std::string_view source = input.substr(0, nul);
  nlohmann::ordered_json context = nlohmann::ordered_json::object();
  if (nul != std::string_view::npos) {
    nlohmann::ordered_json parsed =
        nlohmann::ordered_json::parse(input.substr(nul + 1), nullptr, /*allow_exceptions=*/false);
    if (parsed.is_object()) context = std::move(parsed);
  }
  absl::StatusOr<JinjaTemplate> tmpl = JinjaTemplate::Parse(source);
  if (!tmpl.ok()) {
    FUZZ_CHECK(tmpl.status().code() == absl::StatusCode::kInvalidArgument);
    FUZZ_CHECK(tmpl.status().message().substr(0, 5) == "line ");
    return 0;
  }
  RenderLimits limits;
  limits.max_output_bytes = 64 << 10;
  limits.max_steps = 200'000;
  limits.max_depth = 64;
  limits.deadline = tandem::util::Instant::Now() + absl::Seconds(2);
  limits.now = [] { return absl::FromUnixSeconds(1767225600); };
  absl::StatusOr<std::string> out = tmpl->Render(context, limits);
  if (out.ok()) {
    FUZZ_CHECK(out->size() <= limits.max_output_bytes);
  } else {
    const absl::StatusCode code = out.status().code();
    FUZZ_CHECK(code == absl::StatusCode::kInvalidArgument ||
               code == absl::StatusCode::kResourceExhausted ||
               code == absl::StatusCode::kDeadlineExceeded);
  }
  // Rendering is deterministic.
  absl::StatusOr<std::string> again = tmpl->Render(context, limits);
  FUZZ_CHECK(again.ok() == out.ok());
  if (out.ok()) FUZZ_CHECK(*again == *out);
  return 0;
}
