// Asserting qtts::Error results in Catch2 tests.
#pragma once

#include <string>

#include <catch2/catch.hpp>

#include "engine/common/error.h"

namespace qtts_test {

// fn() must throw qtts::Error with `code` and a message containing `fragment`.
template <typename Fn>
void require_error(Fn&& fn, qtts::ErrorCode code, const std::string& fragment) {
    try {
        fn();
        FAIL("expected qtts::Error containing '" << fragment << "'");
    } catch (const qtts::Error& e) {
        INFO(e.what());
        CHECK(e.code() == code);
        CHECK(std::string(e.what()).find(fragment) != std::string::npos);
    }
}

}  // namespace qtts_test
