// The one Boost.Test executable: every suite in tests/*.cpp links into it.
#define BOOST_TEST_MODULE tessera
#include <boost/test/unit_test.hpp>
