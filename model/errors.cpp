#include "model/errors.h"

#include <c10/util/Exception.h>

namespace ckptsim::model {

UpstreamError::UpstreamError(std::string py_type, std::string message, std::string site)
    : std::runtime_error(py_type + ": " + message),
      py_type_(std::move(py_type)),
      message_(std::move(message)),
      site_(std::move(site)) {}

MergeError::MergeError(Kind kind, KeyPath path, std::string message)
    : UpstreamError("ValueError", std::move(message), "dict_utils.py merge()"),
      kind_(kind),
      path_(std::move(path)) {}

PyKeyError::PyKeyError(const std::string& key_repr, std::string site)
    : UpstreamError("KeyError", key_repr, std::move(site)) {}

PyAssertionError::PyAssertionError(std::string message, std::string site)
    : UpstreamError("AssertionError", std::move(message), std::move(site)) {}

CheckpointingException::CheckpointingException(std::string message, std::string site)
    : UpstreamError("CheckpointingException", std::move(message), std::move(site)) {}

std::string exception_text(const std::exception& e) {
  if (const auto* torch_error = dynamic_cast<const c10::Error*>(&e))
    return torch_error->what_without_backtrace();
  return e.what();
}

std::string exception_py_type(const std::exception& e) {
  if (dynamic_cast<const InvariantViolation*>(&e) != nullptr) return "InvariantViolation";
  if (dynamic_cast<const c10::Error*>(&e) != nullptr) return "RuntimeError";
  return "Exception";
}

}  // namespace ckptsim::model
