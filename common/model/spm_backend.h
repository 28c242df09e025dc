// The boundary between Tandem and libsentencepiece. Debian's libsentencepiece carries its own
// copy of protobuf 3.14 with exported symbols, and cannot share a process's global symbol
// scope with libprotobuf 3.21 (which gRPC needs): whichever loads first serves the other's
// calls, and the process aborts at start-up. So the SentencePiece calls live in a small shared
// library (libtandem_spm.so, built from spm_backend.cc) that Tokenizer loads with dlopen
// (RTLD_LOCAL | RTLD_DEEPBIND): its protobuf calls bind to its own copy, and its symbols never
// reach the global scope. Only this std-only virtual interface crosses the boundary.
//
// The sanitizers refuse RTLD_DEEPBIND (it would bind the library's malloc past theirs), so in a
// sanitizer build (TANDEM_SPM_DLMOPEN) the library is loaded with dlmopen into a link-map
// namespace of its own, with its own libc and allocator, and is built without sanitizers.
// Hence no heap memory may change hands across the interface: results come back through an
// SpmSink that the caller implements, which copies them into the caller's memory.
#pragma once

#include <cstddef>
#include <string_view>

namespace tandem::model {

// Receives what a backend call produces; valid only during the call.
class SpmSink {
 public:
  virtual void Ids(const int* ids, size_t count) = 0;
  virtual void Text(std::string_view text) = 0;  // a result, or an error message

 protected:
  ~SpmSink() = default;
};

class SpmBackend {
 public:
  virtual ~SpmBackend() = default;
  // The ids of `text` into out->Ids; false with the error in out->Text.
  virtual bool Encode(std::string_view text, SpmSink* out) const = 0;
  // The text of ids[0, count) into out->Text; false with the error there instead.
  virtual bool Decode(const int* ids, size_t count, SpmSink* out) const = 0;
  virtual int PieceSize() const = 0;
  virtual int BosId() const = 0;
  virtual int EosId() const = 0;
  virtual int UnkId() const = 0;
  virtual int PadId() const = 0;
  virtual void IdToPiece(int id, SpmSink* out) const = 0;
  virtual bool IsControl(int id) const = 0;
  virtual bool IsByte(int id) const = 0;
};

// The one symbol libtandem_spm.so exports: loads `path`; nullptr with the error in
// error->Text on failure. The caller owns the result (deleting it frees it on the library's
// side, through its virtual destructor).
using SpmBackendFactory = SpmBackend* (*)(const char* path, SpmSink* error);
inline constexpr char kSpmBackendFactorySymbol[] = "tandem_spm_backend_create";
inline constexpr char kSpmBackendLibrary[] = "libtandem_spm.so";

}  // namespace tandem::model
