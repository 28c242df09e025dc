// The boundary between Tandem and libsentencepiece. Debian's libsentencepiece carries its own
// copy of protobuf 3.14 with exported symbols, and cannot share a process's global symbol
// scope with libprotobuf 3.21 (which gRPC needs): whichever loads first serves the other's
// calls, and the process aborts at start-up. So the SentencePiece calls live in a small shared
// library (libtandem_spm.so, built from spm_backend.cc) that Tokenizer loads with dlopen
// (RTLD_LOCAL | RTLD_DEEPBIND): its protobuf calls bind to its own copy, and its symbols never
// reach the global scope. Only this std-only virtual interface crosses the boundary.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace tandem::model {

class SpmBackend {
 public:
  virtual ~SpmBackend() = default;
  // false with `error` set on failure.
  virtual bool Encode(std::string_view text, std::vector<int>* ids, std::string* error) const = 0;
  virtual bool Decode(const std::vector<int>& ids, std::string* text, std::string* error) const = 0;
  virtual int PieceSize() const = 0;
  virtual int BosId() const = 0;
  virtual int EosId() const = 0;
  virtual int UnkId() const = 0;
  virtual int PadId() const = 0;
  virtual std::string IdToPiece(int id) const = 0;
  virtual bool IsControl(int id) const = 0;
  virtual bool IsByte(int id) const = 0;
};

// The one symbol libtandem_spm.so exports: loads `path`; nullptr with `error` set on failure.
// The caller owns the result.
using SpmBackendFactory = SpmBackend* (*)(const char* path, std::string* error);
inline constexpr char kSpmBackendFactorySymbol[] = "tandem_spm_backend_create";
inline constexpr char kSpmBackendLibrary[] = "libtandem_spm.so";

}  // namespace tandem::model
