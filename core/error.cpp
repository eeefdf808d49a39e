#include "core/error.h"

namespace tessera {

const char* error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::Constraint: return "E_CONSTRAINT";
    case ErrorCode::Shape: return "E_SHAPE";
    case ErrorCode::DType: return "E_DTYPE";
    case ErrorCode::Arg: return "E_ARG";
    case ErrorCode::Weights: return "E_WEIGHTS";
    case ErrorCode::Format: return "E_FORMAT";
    case ErrorCode::IO: return "E_IO";
    case ErrorCode::Unsupported: return "E_UNSUPPORTED";
    case ErrorCode::Internal: return "E_INTERNAL";
  }
  return "E_INTERNAL";
}

static std::string compose(ErrorCode code, const std::string& where, const std::string& what) {
  std::string s = error_code_name(code);
  s += ": ";
  if (!where.empty()) {
    s += where;
    s += ": ";
  }
  s += what;
  return s;
}

Error::Error(ErrorCode code, std::string where, std::string what)
    : std::runtime_error(compose(code, where, what)),
      code_(code),
      where_(std::move(where)),
      detail_(std::move(what)) {}

std::string Error::message() const {
  return where_.empty() ? detail_ : where_ + ": " + detail_;
}

void fail(ErrorCode code, const std::string& where, const std::string& what) {
  throw Error(code, where, what);
}

}  // namespace tessera
