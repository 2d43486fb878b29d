// mlakit errors: every failure is an mlakit::Error carrying a code and a message that names the
// argument, what was expected and what was given.
#pragma once

#include <stdexcept>
#include <string>

namespace mlakit {

enum class ErrorCode : int {
  kInvalidArgument = 1,  // a caller-supplied value is wrong (shape, dtype, range, layout)
  kOutOfRange = 2,       // an index (slot, block id, position) points outside its container
  kUnsupported = 3,      // a valid request this build or backend cannot serve
  kBackend = 4,          // a failure reported by CUDA, BLAS or a communicator
  kInternal = 5,         // a broken invariant inside mlakit (a bug)
};

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  ErrorCode code() const noexcept { return code_; }

 private:
  ErrorCode code_;
};

}  // namespace mlakit
