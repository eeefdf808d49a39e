// The suites' check that a call fails with one error code and a message containing a fragment.
#pragma once

#include <boost/test/unit_test.hpp>
#include <string>

#include "core/error.h"

namespace tessera {

template <class Fn>
void expect_error(ErrorCode code, const std::string& text, Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    BOOST_TEST(std::string(error_code_name(e.code())) == std::string(error_code_name(code)),
               e.what());
    BOOST_TEST(std::string(e.what()).find(text) != std::string::npos,
               "'" << e.what() << "' does not contain '" << text << "'");
    return;
  }
  BOOST_ERROR("no error; expected " << error_code_name(code) << " containing '" << text << "'");
}

}  // namespace tessera
