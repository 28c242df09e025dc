// libtandem_spm.so: SentencePiece behind SpmBackend (see spm_backend.h for why it is a
// separate library). Nothing here may use libprotobuf or Abseil.
#include "common/model/spm_backend.h"

#include <memory>

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

  bool Encode(std::string_view text, std::vector<int>* ids, std::string* error) const override {
    const auto status = processor_->Encode(text, ids);
    if (!status.ok()) *error = status.ToString();
    return status.ok();
  }
  bool Decode(const std::vector<int>& ids, std::string* text, std::string* error) const override {
    const auto status = processor_->Decode(ids, text);
    if (!status.ok()) *error = status.ToString();
    return status.ok();
  }
  int PieceSize() const override { return processor_->GetPieceSize(); }
  int BosId() const override { return processor_->bos_id(); }
  int EosId() const override { return processor_->eos_id(); }
  int UnkId() const override { return processor_->unk_id(); }
  int PadId() const override { return processor_->pad_id(); }
  std::string IdToPiece(int id) const override { return processor_->IdToPiece(id); }
  bool IsControl(int id) const override { return processor_->IsControl(id); }
  bool IsByte(int id) const override { return processor_->IsByte(id); }

 private:
  const std::unique_ptr<sentencepiece::SentencePieceProcessor> processor_;
};

}  // namespace
}  // namespace tandem::model

extern "C" __attribute__((visibility("default"))) tandem::model::SpmBackend*
tandem_spm_backend_create(const char* path, std::string* error) {
  auto processor = std::make_unique<sentencepiece::SentencePieceProcessor>();
  const auto status = processor->Load(path);
  if (!status.ok()) {
    *error = status.ToString();
    return nullptr;
  }
  return new tandem::model::SentencePieceBackend(std::move(processor));
}
