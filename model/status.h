// Status and Result<T>: errors that a user can cause (a bad scenario file, an unknown
// revision, an unreadable checkpoint directory) travel as values, LevelDB style, with a
// message that names the file, the field or the key path. Exceptions are reserved for
// upstream's own errors (model/errors.h) and for ckptsim's invariant violations.
#pragma once

#include <optional>
#include <string>
#include <utility>

#include "model/errors.h"

namespace ckptsim {

class Status {
 public:
  enum class Code { kOk, kInvalidInput, kNotFound, kIoError, kCorruption };

  Status() = default;
  static Status ok() { return Status(); }
  static Status invalid_input(std::string msg) {
    return Status(Code::kInvalidInput, std::move(msg));
  }
  static Status not_found(std::string msg) { return Status(Code::kNotFound, std::move(msg)); }
  static Status io_error(std::string msg) { return Status(Code::kIoError, std::move(msg)); }
  static Status corruption(std::string msg) { return Status(Code::kCorruption, std::move(msg)); }

  bool is_ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }
  std::string to_string() const;
  // The same status with its message on one line: control characters (a newline in a field
  // name a user's file spelled, say) are written as \n, \r, \t or \xNN. Readers of users'
  // files return their errors through it, so that a message stays one line whatever the file
  // held.
  Status on_one_line() const;

 private:
  Status(Code code, std::string message) : code_(code), message_(std::move(message)) {}
  Code code_ = Code::kOk;
  std::string message_;
};

template <typename T>
class Result {
 public:
  Result(T value) : value_(std::move(value)) {}         // NOLINT
  Result(Status status) : status_(std::move(status)) {  // NOLINT
    CKPTSIM_CHECK(!status_.is_ok(), "Result built from an ok Status without a value");
  }

  bool is_ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }
  T& value() {
    CKPTSIM_CHECK(value_.has_value(), "Result::value on an error: " + status_.to_string());
    return *value_;
  }
  const T& value() const {
    CKPTSIM_CHECK(value_.has_value(), "Result::value on an error: " + status_.to_string());
    return *value_;
  }

 private:
  std::optional<T> value_;
  Status status_;
};

inline std::string Status::to_string() const {
  switch (code_) {
    case Code::kOk:
      return "OK";
    case Code::kInvalidInput:
      return "invalid input: " + message_;
    case Code::kNotFound:
      return "not found: " + message_;
    case Code::kIoError:
      return "I/O error: " + message_;
    case Code::kCorruption:
      return "corruption: " + message_;
  }
  return message_;
}

}  // namespace ckptsim
