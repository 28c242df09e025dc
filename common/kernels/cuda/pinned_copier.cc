#include "common/kernels/cuda/pinned_copier.h"

#include <cuda_runtime.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/util/clock.h"

namespace tandem::kernels::cuda {
namespace {

absl::Status CudaError(const char* what, cudaError_t error) {
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(error)));
}

}  // namespace

struct PinnedCopier::Copy {
  int key = 0;
  int64_t device_offset = 0;
  cudaEvent_t done = nullptr;
};

absl::StatusOr<std::unique_ptr<PinnedCopier>> PinnedCopier::Create(const std::string& path,
                                                                   int64_t device_bytes) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    cudaGetLastError();  // clear the sticky "no device" error
    return absl::UnavailableError("no CUDA device");
  }
  std::error_code error;
  const auto size = std::filesystem::file_size(path, error);
  if (error) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::unique_ptr<PinnedCopier> c(new PinnedCopier());
  const int64_t file_bytes = static_cast<int64_t>(size);
  c->file_bytes_ = file_bytes;
  if (cudaError_t e = cudaHostAlloc(&c->host_, file_bytes, cudaHostAllocDefault);
      e != cudaSuccess) {
    return absl::ResourceExhaustedError(
        absl::StrCat("pinning ", file_bytes, " bytes: ", cudaGetErrorString(e)));
  }
  std::ifstream in(path, std::ios::binary);
  in.read(static_cast<char*>(c->host_), static_cast<std::streamsize>(file_bytes));
  if (in.gcount() != static_cast<std::streamsize>(file_bytes)) {
    return absl::DataLossError(absl::StrCat("cannot read all of ", path));
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

PinnedCopier::~PinnedCopier() {
  if (stream_ != nullptr) cudaStreamSynchronize(static_cast<cudaStream_t>(stream_));
  for (Copy& copy : copies_) cudaEventDestroy(copy.done);
  if (stream_ != nullptr) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
  if (device_ != nullptr) cudaFree(device_);
  if (host_ != nullptr) cudaFreeHost(host_);
}

absl::Status PinnedCopier::Begin(absl::Span<const Range> ranges) {
  for (Copy& copy : copies_) cudaEventDestroy(copy.done);
  copies_.clear();
  int64_t offset = 0;
  for (const Range& range : ranges) {
    if (range.offset < 0 || range.bytes < 0 || range.offset > file_bytes_ ||
        range.bytes > file_bytes_ - range.offset) {
      return absl::InvalidArgumentError(absl::StrCat("bytes [", range.offset, ", +", range.bytes,
                                                     ") of range ", range.key,
                                                     " are outside the file"));
    }
    if (range.bytes > device_bytes_ - offset) {
      return absl::ResourceExhaustedError(absl::StrCat("the batch's ranges need more than the ",
                                                       device_bytes_, "-byte device arena"));
    }
    Copy copy;
    copy.key = range.key;
    copy.device_offset = offset;
    if (cudaError_t e = cudaEventCreateWithFlags(&copy.done, cudaEventDisableTiming);
        e != cudaSuccess) {
      return CudaError("creating an event", e);
    }
    const auto stream = static_cast<cudaStream_t>(stream_);
    const char* src = static_cast<const char*>(host_) + range.offset;
    if (cudaError_t e = cudaMemcpyAsync(static_cast<char*>(device_) + offset, src, range.bytes,
                                        cudaMemcpyHostToDevice, stream);
        e != cudaSuccess) {
      cudaEventDestroy(copy.done);
      return CudaError("queueing a copy", e);
    }
    cudaEventRecord(copy.done, stream);
    copies_.push_back(copy);
    offset += range.bytes;
    bytes_copied_ += range.bytes;
  }
  return absl::OkStatus();
}

absl::StatusOr<const void*> PinnedCopier::Wait(int key, absl::Duration deadline) {
  for (const Copy& copy : copies_) {
    if (copy.key != key) continue;
    const util::Instant end = util::Instant::Now() + deadline;
    while (true) {
      const cudaError_t state = cudaEventQuery(copy.done);
      if (state == cudaSuccess) return static_cast<const char*>(device_) + copy.device_offset;
      if (state != cudaErrorNotReady) return CudaError("copying a range", state);
      if (util::Instant::Now() > end) {
        return absl::DeadlineExceededError(
            absl::StrCat("the copy of range ", key, " took over ", absl::FormatDuration(deadline)));
      }
      absl::SleepFor(absl::Microseconds(20));
    }
  }
  return absl::InvalidArgumentError(absl::StrCat("range ", key, " is not in this batch"));
}

}  // namespace tandem::kernels::cuda
