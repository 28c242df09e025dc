// libtandem_spm.so: SentencePiece behind SpmBackend (see spm_backend.h for why it is a
// separate library). Nothing here may use libprotobuf or Abseil.
#include "common/model/spm_backend.h"

#include <memory>
#include <string>
#include <vector>

// SentencePiece 0.1.9x declares `namespace absl { using std::string_view; }`; keep it out of
// the way of any Abseil header a reader might add later.
#define absl tandem_sentencepiece_absl
#include <sentencepiece_processor.h>
#undef absl

namespace tandem::model {
namespace {

class SentencePieceBackend final : public SpmBackend {
 public:
  explicit SentencePieceBackend(std::unique_ptr<sentencepiece::SentencePieceProcessor> processor)
      : processor_(std::move(processor)) {}

  bool Encode(std::string_view text, SpmSink* out) const override {
    std::vector<int> ids;
    const auto status = processor_->Encode(text, &ids);
    if (!status.ok()) {
      out->Text(status.ToString());
      return false;
    }
    out->Ids(ids.data(), ids.size());
    return true;
  }
  bool Decode(const int* ids, size_t count, SpmSink* out) const override {
    std::string text;
    const auto status = processor_->Decode(std::vector<int>(ids, ids + count), &text);
    out->Text(status.ok() ? text : status.ToString());
    return status.ok();
  }
  int PieceSize() const override { return processor_->GetPieceSize(); }
  int BosId() const override { return processor_->bos_id(); }
  int EosId() const override { return processor_->eos_id(); }
  int UnkId() const override { return processor_->unk_id(); }
  int PadId() const override { return processor_->pad_id(); }
  void IdToPiece(int id, SpmSink* out) const override { out->Text(processor_->IdToPiece(id)); }
  bool IsControl(int id) const override { return processor_->IsControl(id); }
  bool IsByte(int id) const override { return processor_->IsByte(id); }

 private:
  const std::unique_ptr<sentencepiece::SentencePieceProcessor> processor_;
};

}  // namespace
}  // namespace tandem::model

extern "C" __attribute__((visibility("default"))) tandem::model::SpmBackend*
tandem_spm_backend_create(const char* path, tandem::model::SpmSink* error) {
  auto processor = std::make_unique<sentencepiece::SentencePieceProcessor>();
  const auto status = processor->Load(path);
  if (!status.ok()) {
    error->Text(status.ToString());
    return nullptr;
  }
  return new tandem::model::SentencePieceBackend(std::move(processor));
}
