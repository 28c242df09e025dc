// ThreadSanitizer and Debian's Abseil. libabsl_synchronization is not built with TSan, so TSan
// never sees absl::Mutex or absl::CondVar synchronise, and reports every datum they guard as a
// race. In a TSan build this file is linked into every executable (cmake/sanitizers.cmake):
// its definitions of the Mutex, CondVar and Notification entry points come first in symbol
// lookup, for calls from Tandem's code and from the libraries' alike (gRPC's locks are
// absl::Mutex too). Each tells TSan what the call does, with the annotations absl itself makes
// in a TSan build, and calls the library's own definition, found with dlsym(RTLD_NEXT).
//
// ~Mutex is left alone: gRPC frees many of its mutexes with objects whose reference counts it
// decrements in uninstrumented code, so a destroy annotation would look unordered with their
// last use. TSan forgets a mutex when its memory is freed (or recreated by the constructor).
//
// The mangled names are those of Debian 12's Abseil 20220623 (inline namespace debian3); a
// missing one stops the process at its first call with a message.
#include <dlfcn.h>
#include <sanitizer/tsan_interface.h>

#include <cstdio>
#include <cstdlib>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"

namespace {

void* Real(const char* symbol) {
  void* fn = dlsym(RTLD_NEXT, symbol);
  if (fn == nullptr) {
    std::fprintf(stderr, "tsan_absl_sync: no %s in the loaded Abseil: %s\n", symbol, dlerror());
    std::abort();
  }
  return fn;
}

// The library's definition of a member function (it takes `this` first), looked up once.
#define REAL(ret, symbol, ...)                                                   \
  (*[] {                                                                         \
    static const auto fn = reinterpret_cast<ret (*)(__VA_ARGS__)>(Real(symbol)); \
    return fn;                                                                   \
  }())

constexpr unsigned kRead = __tsan_mutex_read_lock;
constexpr unsigned kTry = __tsan_mutex_try_lock;

// Only the outermost call on a thread is annotated: the library implements some entry points
// with others (AwaitWithTimeout calls AwaitWithDeadline), which then come back here.
thread_local int depth = 0;
class Outermost {
 public:
  Outermost() : outermost_(depth++ == 0) {}
  ~Outermost() { --depth; }
  explicit operator bool() const { return outermost_; }

 private:
  const bool outermost_;
};

// `real` acquires `mu` (in reader mode when flags has kRead).
template <typename Real>
auto Acquire(absl::Mutex* mu, unsigned flags, Real real) {
  Outermost outer;
  if (outer) __tsan_mutex_pre_lock(mu, flags);
  auto result = real();
  if (outer) __tsan_mutex_post_lock(mu, flags, 0);
  return result;
}

// `real` tries to acquire `mu` and says whether it did.
template <typename Real>
bool TryAcquire(absl::Mutex* mu, unsigned flags, Real real) {
  Outermost outer;
  if (outer) __tsan_mutex_pre_lock(mu, flags | kTry);
  const bool locked = real();
  if (outer) {
    __tsan_mutex_post_lock(mu, flags | kTry | (locked ? 0 : __tsan_mutex_try_lock_failed), 0);
  }
  return locked;
}

template <typename Real>
void Release(absl::Mutex* mu, unsigned flags, Real real) {
  Outermost outer;
  if (outer) __tsan_mutex_pre_unlock(mu, flags);
  real();
  if (outer) __tsan_mutex_post_unlock(mu, flags);
}

// `mu` is held on entry to and return from `real`, which may release it meanwhile (Await,
// CondVar waits): to TSan it is released before and acquired after. Accesses between a pre and
// a post annotation are ignored, which covers the conditions absl evaluates inside.
template <typename Real>
auto ReleasedDuring(absl::Mutex* mu, Real real) {
  Outermost outer;
  if (outer) __tsan_mutex_pre_unlock(mu, 0);
  auto result = real();
  if (outer) {
    __tsan_mutex_post_unlock(mu, 0);
    __tsan_mutex_pre_lock(mu, 0);
    __tsan_mutex_post_lock(mu, 0, 0);
  }
  return result;
}

// For the void entry points, whose wrappers above want a value.
template <typename Real>
auto Void(Real real) {
  return [real] {
    real();
    return 0;
  };
}

}  // namespace

namespace absl {
ABSL_NAMESPACE_BEGIN

void Mutex::Lock() {
  Acquire(this, 0, Void([this] { REAL(void, "_ZN4absl7debian35Mutex4LockEv", Mutex*)(this); }));
}

void Mutex::ReaderLock() {
  Acquire(this, kRead, Void([this] {
            REAL(void, "_ZN4absl7debian35Mutex10ReaderLockEv", Mutex*)
            (this);
          }));
}

bool Mutex::TryLock() {
  return TryAcquire(
      this, 0, [this] { return REAL(bool, "_ZN4absl7debian35Mutex7TryLockEv", Mutex*)(this); });
}

bool Mutex::ReaderTryLock() {
  return TryAcquire(this, kRead, [this] {
    return REAL(bool, "_ZN4absl7debian35Mutex13ReaderTryLockEv", Mutex*)(this);
  });
}

void Mutex::Unlock() {
  Release(this, 0, [this] { REAL(void, "_ZN4absl7debian35Mutex6UnlockEv", Mutex*)(this); });
}

void Mutex::ReaderUnlock() {
  Release(this, kRead, [this] {
    REAL(void, "_ZN4absl7debian35Mutex12ReaderUnlockEv", Mutex*)(this);
  });
}

void Mutex::LockWhen(const Condition& cond) {
  Acquire(this, 0, Void([&] {
            REAL(void, "_ZN4absl7debian35Mutex8LockWhenERKNS0_9ConditionE", Mutex*,
                 const Condition&)
            (this, cond);
          }));
}

bool Mutex::LockWhenWithTimeout(const Condition& cond, Duration timeout) {
  return Acquire(this, 0, [&] {
    return REAL(bool, "_ZN4absl7debian35Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE",
                Mutex*, const Condition&, Duration)(this, cond, timeout);
  });
}

bool Mutex::LockWhenWithDeadline(const Condition& cond, Time deadline) {
  return Acquire(this, 0, [&] {
    return REAL(bool, "_ZN4absl7debian35Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE",
                Mutex*, const Condition&, Time)(this, cond, deadline);
  });
}

void Mutex::ReaderLockWhen(const Condition& cond) {
  Acquire(this, kRead, Void([&] {
            REAL(void, "_ZN4absl7debian35Mutex14ReaderLockWhenERKNS0_9ConditionE", Mutex*,
                 const Condition&)
            (this, cond);
          }));
}

bool Mutex::ReaderLockWhenWithTimeout(const Condition& cond, Duration timeout) {
  return Acquire(this, kRead, [&] {
    return REAL(bool,
                "_ZN4absl7debian35Mutex25ReaderLockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE",
                Mutex*, const Condition&, Duration)(this, cond, timeout);
  });
}

bool Mutex::ReaderLockWhenWithDeadline(const Condition& cond, Time deadline) {
  return Acquire(this, kRead, [&] {
    return REAL(bool,
                "_ZN4absl7debian35Mutex26ReaderLockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE",
                Mutex*, const Condition&, Time)(this, cond, deadline);
  });
}

void Mutex::Await(const Condition& cond) {
  ReleasedDuring(this, Void([&] {
                   REAL(void, "_ZN4absl7debian35Mutex5AwaitERKNS0_9ConditionE", Mutex*,
                        const Condition&)
                   (this, cond);
                 }));
}

bool Mutex::AwaitWithTimeout(const Condition& cond, Duration timeout) {
  return ReleasedDuring(this, [&] {
    return REAL(bool, "_ZN4absl7debian35Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE",
                Mutex*, const Condition&, Duration)(this, cond, timeout);
  });
}

bool Mutex::AwaitWithDeadline(const Condition& cond, Time deadline) {
  return ReleasedDuring(this, [&] {
    return REAL(bool, "_ZN4absl7debian35Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE",
                Mutex*, const Condition&, Time)(this, cond, deadline);
  });
}

void CondVar::Wait(Mutex* mu) {
  ReleasedDuring(mu, Void([&] {
                   REAL(void, "_ZN4absl7debian37CondVar4WaitEPNS0_5MutexE", CondVar*, Mutex*)
                   (this, mu);
                 }));
}

bool CondVar::WaitWithTimeout(Mutex* mu, Duration timeout) {
  return ReleasedDuring(mu, [&] {
    return REAL(bool, "_ZN4absl7debian37CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE",
                CondVar*, Mutex*, Duration)(this, mu, timeout);
  });
}

bool CondVar::WaitWithDeadline(Mutex* mu, Time deadline) {
  return ReleasedDuring(mu, [&] {
    return REAL(bool, "_ZN4absl7debian37CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE", CondVar*,
                Mutex*, Time)(this, mu, deadline);
  });
}

// Notification: Notify sets an atomic flag inside the library, and a waiter that finds it set
// returns without taking the mutex (the library's fast path, and the inline HasBeenNotified),
// so the mutex annotations alone do not order what came before Notify with what follows the
// wait. Notify releases, and a wait that saw it acquires, on the flag's address (the object's
// first member, where HasBeenNotified's atomic load also synchronises).
void Notification::Notify() {
  __tsan_release(this);
  REAL(void, "_ZN4absl7debian312Notification6NotifyEv", Notification*)(this);
}

void Notification::WaitForNotification() const {
  REAL(void, "_ZNK4absl7debian312Notification19WaitForNotificationEv", const Notification*)(this);
  __tsan_acquire(const_cast<Notification*>(this));
}

bool Notification::WaitForNotificationWithTimeout(Duration timeout) const {
  const bool notified =
      REAL(bool, "_ZNK4absl7debian312Notification30WaitForNotificationWithTimeoutENS0_8DurationE",
           const Notification*, Duration)(this, timeout);
  if (notified) __tsan_acquire(const_cast<Notification*>(this));
  return notified;
}

bool Notification::WaitForNotificationWithDeadline(Time deadline) const {
  const bool notified =
      REAL(bool, "_ZNK4absl7debian312Notification31WaitForNotificationWithDeadlineENS0_4TimeE",
           const Notification*, Time)(this, deadline);
  if (notified) __tsan_acquire(const_cast<Notification*>(this));
  return notified;
}

ABSL_NAMESPACE_END
}  // namespace absl
