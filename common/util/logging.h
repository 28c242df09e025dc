// Minimal leveled logging to stderr (Abseil 20220623 has no absl/log), and CHECK for broken
// invariants. Usage: TANDEM_LOG(INFO) << "listening on " << port;
#pragma once

#include <sstream>
#include <string_view>

namespace tandem::util {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3, kFatal = 4 };

// Messages below this level are dropped. Set once at start-up (e.g. from --log_level).
void SetMinLogLevel(LogLevel level);
LogLevel MinLogLevel();
// Parses "debug", "info", "warning", "error"; returns false on anything else.
bool ParseLogLevel(std::string_view text, LogLevel* level);

class LogMessage {
 public:
  LogMessage(LogLevel level, const char* file, int line);
  ~LogMessage();  // writes the line; aborts for kFatal
  LogMessage(const LogMessage&) = delete;
  LogMessage& operator=(const LogMessage&) = delete;
  std::ostream& stream() { return stream_; }

 private:
  LogLevel level_;
  std::ostringstream stream_;
};

}  // namespace tandem::util

#define TANDEM_LOG_LEVEL_DEBUG ::tandem::util::LogLevel::kDebug
#define TANDEM_LOG_LEVEL_INFO ::tandem::util::LogLevel::kInfo
#define TANDEM_LOG_LEVEL_WARNING ::tandem::util::LogLevel::kWarning
#define TANDEM_LOG_LEVEL_ERROR ::tandem::util::LogLevel::kError
#define TANDEM_LOG_LEVEL_FATAL ::tandem::util::LogLevel::kFatal

#define TANDEM_LOG(level)                                         \
  if (TANDEM_LOG_LEVEL_##level < ::tandem::util::MinLogLevel()) { \
  } else                                                          \
    ::tandem::util::LogMessage(TANDEM_LOG_LEVEL_##level, __FILE__, __LINE__).stream()

#define TANDEM_CHECK(cond)                                                                    \
  if (cond) {                                                                                 \
  } else                                                                                      \
    ::tandem::util::LogMessage(::tandem::util::LogLevel::kFatal, __FILE__, __LINE__).stream() \
        << "Check failed: " #cond " "
