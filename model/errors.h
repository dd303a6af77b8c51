// Errors of the model, in two families that must never be confused.
//
// 1. UpstreamError: an exception that the upstream Python code raises on the same input
//    (ValueError from merge(), AssertionError from a shape assert, KeyError from a dict
//    lookup, CheckpointingException from mapping.py). Reproducing these is the point of the
//    model, so each carries upstream's exception class name, its message in upstream's
//    wording, and the upstream site (file and function) that raises it. They propagate
//    through the model exactly as the Python exception would and are caught by the
//    simulator, which records them as outcomes of a save or load.
//
// 2. InvariantViolation: a bug in ckptsim itself (the model or simulator reached a state
//    that our own design says cannot happen). Always on, never compiled out, thrown so that
//    RapidCheck can shrink a failing case. It is never an outcome of a scenario.
//
// User-caused errors (a bad scenario file, an unknown revision) are not exceptions of the
// model: they are Status values, see model/status.h.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include "model/py/key.h"

namespace ckptsim::model {

class UpstreamError : public std::runtime_error {
 public:
  // REQUIRES: py_type is a Python exception class name ("ValueError", "AssertionError", ...);
  // site names the upstream file and function, e.g. "dict_utils.py merge()".
  UpstreamError(std::string py_type, std::string message, std::string site);

  const std::string& py_type() const { return py_type_; }
  const std::string& message() const { return message_; }
  const std::string& site() const { return site_; }

 private:
  std::string py_type_;
  std::string message_;
  std::string site_;
};

// merge() and apply_factory_merges() failures: the two ValueErrors of dict_utils.merge.
class MergeError : public UpstreamError {
 public:
  enum class Kind { kDuplicateLeaf, kListLengthMismatch };
  MergeError(Kind kind, KeyPath path, std::string message);

  Kind kind() const { return kind_; }
  const KeyPath& path() const { return path_; }

 private:
  Kind kind_;
  KeyPath path_;
};

// Python's KeyError on a dict lookup; the message is the repr of the missing key.
class PyKeyError : public UpstreamError {
 public:
  PyKeyError(const std::string& key_repr, std::string site);
};

// Python's `assert cond, msg`.
class PyAssertionError : public UpstreamError {
 public:
  PyAssertionError(std::string message, std::string site);
};

// megatron/core/dist_checkpointing/core.py CheckpointingException.
class CheckpointingException : public UpstreamError {
 public:
  CheckpointingException(std::string message, std::string site);
};

class InvariantViolation : public std::logic_error {
 public:
  explicit InvariantViolation(const std::string& what) : std::logic_error(what) {}
};

// An exception's text for a one-line report: torch's c10::Error (Python's RuntimeError)
// without the C++ backtrace that its what() carries; anything else, what().
std::string exception_text(const std::exception& e);

// The Python exception class a caught exception surfaces as where no upstream site models
// it: "InvariantViolation" for ckptsim's own bugs, "RuntimeError" for a torch error.
std::string exception_py_type(const std::exception& e);

// Always-on invariant check. `what` must say what must not happen.
#define CKPTSIM_CHECK(cond, what)                                                           \
  do {                                                                                      \
    if (!(cond)) {                                                                          \
      throw ::ckptsim::model::InvariantViolation(std::string(__FILE__) + ":" +              \
                                                 std::to_string(__LINE__) + ": " + (what)); \
    }                                                                                       \
  } while (0)

}  // namespace ckptsim::model
