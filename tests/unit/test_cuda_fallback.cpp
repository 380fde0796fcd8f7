// The no-GPU path: backend selection falls back to the fast CPU backend with a clear reason, the CUDA engine
// refuses cleanly, and the owner guard (host-only logic) enforces single ownership. Runs in CI
// without a GPU; on a GPU machine the selection checks flip to the CUDA side.
#include <catch2/catch.hpp>

#include <atomic>
#include <string>
#include <thread>

#include "engine/common/device.h"
#include "engine/common/error.h"
#include "engine/runtime/lm_backend.h"

#ifdef QTTS_HAVE_CUDA
#include "engine/cuda/gpu_context.h"
#include "engine/cuda/owner_guard.h"
#endif

TEST_CASE("backend selection without a usable GPU falls back to the CPU", "[cuda][fallback]") {
    const bool have_gpu = qtts::cuda_device_count() > 0;
    const qtts::LmBackendChoice automatic = qtts::lm_backend_choose("auto", 0);
    CHECK(!automatic.reason.empty());
    if (have_gpu) {
        CHECK(automatic.backend == qtts::LmBackend::LM_BACKEND_CUDA);
    } else {
        CHECK(automatic.backend == qtts::LmBackend::LM_BACKEND_CPU_FAST);
        CHECK(automatic.reason.find("falling back to the fast CPU backend") != std::string::npos);
        try {
            qtts::lm_backend_choose("cuda", 0);
            FAIL("requesting cuda without a GPU must throw");
        } catch (const qtts::Error& e) {
            CHECK(e.code() == qtts::ErrorCode::ERROR_UNSUPPORTED);
            CHECK(std::string(e.what()).find("cannot run") != std::string::npos);
        }
    }
    const qtts::LmBackendChoice cpu = qtts::lm_backend_choose("cpu", 0);
    CHECK(cpu.backend == qtts::LmBackend::LM_BACKEND_CPU);
    CHECK_THROWS_AS(qtts::lm_backend_choose("tpu", 0), qtts::Error);
    // A device index that cannot exist never selects CUDA.
    const qtts::LmBackendChoice far = qtts::lm_backend_choose("auto", 4096);
    CHECK(far.backend == qtts::LmBackend::LM_BACKEND_CPU_FAST);
    CHECK(far.reason.find("4096") != std::string::npos);
}

#ifdef QTTS_HAVE_CUDA

TEST_CASE("the CUDA context refuses a missing device with a clear error", "[cuda][fallback]") {
    const int count = qtts::cuda_device_count();
    try {
        qtts::cuda::GpuContext context(count + 3);
        FAIL("a context on a missing device must throw");
    } catch (const qtts::Error& e) {
        const std::string message = e.what();
        CHECK((e.code() == qtts::ErrorCode::ERROR_CUDA || e.code() == qtts::ErrorCode::ERROR_INVALID_ARGUMENT));
        CHECK((message.find("does not exist") != std::string::npos ||
               message.find("no usable CUDA device") != std::string::npos));
    }
}

TEST_CASE("the owner guard refuses other threads and re-entrant replays", "[cuda][owner]") {
    using qtts::cuda::OwnerGuard;
    using qtts::cuda::OwnerGuardMode;
    OwnerGuard guard(OwnerGuardMode::OWNER_GUARD_THROW);
    CHECK_NOTHROW(guard.check("owner"));

    std::atomic<int> refused{0};
    std::thread other([&] {
        try {
            guard.check("buffer access");
        } catch (const qtts::Error& e) {
            if (e.code() == qtts::ErrorCode::ERROR_INTERNAL) ++refused;
        }
        try {
            OwnerGuard::Scope replay(guard, "replay");
        } catch (const qtts::Error&) {
            ++refused;
        }
    });
    other.join();
    CHECK(refused == 2);
    CHECK(!guard.busy());

    {
        OwnerGuard::Scope replay(guard, "first replay");
        CHECK(guard.busy());
        CHECK_THROWS_AS(OwnerGuard::Scope(guard, "nested replay"), qtts::Error);
        CHECK_THROWS_AS(guard.adopt(), qtts::Error);
    }
    CHECK(!guard.busy());

    // Ownership can move to another thread (an engine thread taking over its state).
    std::thread taker([&] { guard.adopt(); });
    taker.join();
    CHECK_THROWS_AS(guard.check("after hand-over"), qtts::Error);
}

#endif
