// One error type for the whole runtime. Every failure a user can cause carries a code from
// shared/docs/interfaces.md §3 and a message of the form "<where>: <what>", so the CLI prints
// "tessera: error: E_CODE: <where>: <what>" and the C API returns the code with the message.
#pragma once

#include <stdexcept>
#include <string>

namespace tessera {

enum class ErrorCode {
  Constraint,   // E_CONSTRAINT: an argument constraint (heads must divide D, H*W == T, ...)
  Shape,        // E_SHAPE: a tensor's shape does not fit
  DType,        // E_DTYPE: a dtype that cannot be used here
  Arg,          // E_ARG: unknown op, argument, port or source; wrong argument type
  Weights,      // E_WEIGHTS: missing, unexpected or mis-shaped weights
  Format,       // E_FORMAT: malformed safetensors or JSON
  IO,           // E_IO: missing or unreadable file
  Unsupported,  // E_UNSUPPORTED: valid request this runtime does not serve
  Internal,     // E_INTERNAL: a bug in tessera (CLI exit status 1)
};

// "E_CONSTRAINT", "E_SHAPE", ...
const char* error_code_name(ErrorCode code);

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, std::string where, std::string what);

  ErrorCode code() const noexcept { return code_; }
  const std::string& where() const noexcept { return where_; }
  const std::string& detail() const noexcept { return detail_; }
  // "<where>: <what>" (or just "<what>" when where is empty): the part after "E_CODE: ".
  std::string message() const;

 private:
  ErrorCode code_;
  std::string where_;
  std::string detail_;
};

[[noreturn]] void fail(ErrorCode code, const std::string& where, const std::string& what);

}  // namespace tessera
