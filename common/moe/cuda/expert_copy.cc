#include "common/moe/cuda/expert_copy.h"

#include <cuda_runtime.h>

#include <cstdio>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/util/status.h"

namespace tandem::moe {
namespace {

absl::Status CudaError(const char* what, cudaError_t error) {
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(error)));
}

}  // namespace

struct CudaExpertCopier::Copy {
  int expert = 0;
  int64_t device_offset = 0;
  cudaEvent_t done = nullptr;
};

absl::StatusOr<std::unique_ptr<CudaExpertCopier>> CudaExpertCopier::Create(
    const std::string& pack_path, int64_t device_bytes) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    cudaGetLastError();  // clear the sticky "no device" error
    return absl::UnavailableError("no CUDA device");
  }
  // The pack's layout comes from the host backing, which also checks the file.
  ASSIGN_OR_RETURN(std::unique_ptr<ExpertBacking> backing, HostBacking(pack_path));
  std::unique_ptr<CudaExpertCopier> c(new CudaExpertCopier());
  c->layout_ = backing->layout();
  const int64_t file_bytes = c->layout_.file_bytes();
  if (cudaError_t e = cudaHostAlloc(&c->host_, file_bytes, cudaHostAllocDefault);
      e != cudaSuccess) {
    return absl::ResourceExhaustedError(
        absl::StrCat("pinning ", file_bytes, " bytes: ", cudaGetErrorString(e)));
  }
  std::ifstream in(pack_path, std::ios::binary);
  in.read(static_cast<char*>(c->host_), static_cast<std::streamsize>(file_bytes));
  if (in.gcount() != static_cast<std::streamsize>(file_bytes)) {
    return absl::DataLossError(absl::StrCat("cannot read all of ", pack_path));
  }
  if (cudaError_t e = cudaMalloc(&c->device_, device_bytes); e != cudaSuccess) {
    return absl::ResourceExhaustedError(
        absl::StrCat("allocating ", device_bytes, " device bytes: ", cudaGetErrorString(e)));
  }
  c->device_bytes_ = device_bytes;
  cudaStream_t stream;
  if (cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking); e != cudaSuccess) {
    return CudaError("creating the copy stream", e);
  }
  c->stream_ = stream;
  return c;
}

CudaExpertCopier::~CudaExpertCopier() {
  if (stream_ != nullptr) cudaStreamSynchronize(static_cast<cudaStream_t>(stream_));
  for (Copy& copy : copies_) cudaEventDestroy(copy.done);
  if (stream_ != nullptr) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
  if (device_ != nullptr) cudaFree(device_);
  if (host_ != nullptr) cudaFreeHost(host_);
}

absl::Status CudaExpertCopier::BeginLayer(int layer, absl::Span<const engine::ExpertLoad> loads) {
  for (Copy& copy : copies_) cudaEventDestroy(copy.done);
  copies_.clear();
  int64_t offset = 0;
  for (const engine::ExpertLoad& load : loads) {
    if (layer < 0 || layer >= layout_.layers || load.expert < 0 || load.expert >= layout_.experts ||
        load.width < 1 || load.width > layout_.intermediate) {
      return absl::InvalidArgumentError(absl::StrCat("expert ", load.expert, " of layer ", layer,
                                                     " at width ", load.width,
                                                     " is outside the pack"));
    }
    const int64_t bytes = load.width * layout_.bundle_bytes();
    if (offset + bytes > device_bytes_) {
      return absl::ResourceExhaustedError(absl::StrCat("layer ", layer,
                                                       "'s expert loads need more than the ",
                                                       device_bytes_, "-byte device arena"));
    }
    Copy copy;
    copy.expert = load.expert;
    copy.device_offset = offset;
    if (cudaError_t e = cudaEventCreateWithFlags(&copy.done, cudaEventDisableTiming);
        e != cudaSuccess) {
      return CudaError("creating an event", e);
    }
    const auto stream = static_cast<cudaStream_t>(stream_);
    const char* src = static_cast<const char*>(host_) + layout_.offset(layer, load.expert);
    if (cudaError_t e = cudaMemcpyAsync(static_cast<char*>(device_) + offset, src, bytes,
                                        cudaMemcpyHostToDevice, stream);
        e != cudaSuccess) {
      cudaEventDestroy(copy.done);
      return CudaError("queueing a copy", e);
    }
    cudaEventRecord(copy.done, stream);
    copies_.push_back(copy);
    offset += bytes;
    bytes_copied_ += bytes;
  }
  return absl::OkStatus();
}

absl::StatusOr<const void*> CudaExpertCopier::Wait(int expert, absl::Duration deadline) {
  for (const Copy& copy : copies_) {
    if (copy.expert != expert) continue;
    const absl::Time end = absl::Now() + deadline;
    while (true) {
      const cudaError_t state = cudaEventQuery(copy.done);
      if (state == cudaSuccess) return static_cast<const char*>(device_) + copy.device_offset;
      if (state != cudaErrorNotReady) return CudaError("copying an expert", state);
      if (absl::Now() > end) {
        return absl::DeadlineExceededError(absl::StrCat(
            "the copy of expert ", expert, " took over ", absl::FormatDuration(deadline)));
      }
      absl::SleepFor(absl::Microseconds(20));
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("expert ", expert, " was not loaded by this layer"));
}

}  // namespace tandem::moe
