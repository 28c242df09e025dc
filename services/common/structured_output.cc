#include "services/common/structured_output.h"

#include "common/util/status.h"

namespace tandem::serving {

absl::StatusOr<std::optional<structured::OutputConstraint>> ConstraintFromProto(
    const tandem::v1::StructuredOutput& proto) {
  using Kind = structured::OutputConstraint::Kind;
  structured::OutputConstraint c;
  switch (proto.kind_case()) {
    case tandem::v1::StructuredOutput::KIND_NOT_SET:
      return std::nullopt;
    case tandem::v1::StructuredOutput::kJsonSchema:
      if (proto.json_schema().empty()) {
        return absl::InvalidArgumentError("structured.json_schema is empty");
      }
      c.kind = Kind::kJsonSchema;
      c.text = proto.json_schema();
      break;
    case tandem::v1::StructuredOutput::kJsonObject:
      if (!proto.json_object()) {
        return absl::InvalidArgumentError("structured.json_object must be true when set");
      }
      c.kind = Kind::kJsonObject;
      break;
    case tandem::v1::StructuredOutput::kRegex:
      if (proto.regex().empty()) return absl::InvalidArgumentError("structured.regex is empty");
      c.kind = Kind::kRegex;
      c.text = proto.regex();
      break;
    case tandem::v1::StructuredOutput::kChoice:
      c.kind = Kind::kChoice;
      c.choices.assign(proto.choice().choices().begin(), proto.choice().choices().end());
      break;
  }
  return c;
}

absl::Status CheckConstraint(const tandem::v1::StructuredOutput& proto) {
  ASSIGN_OR_RETURN(std::optional<structured::OutputConstraint> c, ConstraintFromProto(proto));
  if (!c.has_value()) return absl::OkStatus();
  return structured::CompileConstraint(*c).status();
}

}  // namespace tandem::serving
