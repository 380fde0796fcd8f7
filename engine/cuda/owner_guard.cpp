#include "engine/cuda/owner_guard.h"

#include <cstdlib>
#include <sstream>

#include "engine/common/error.h"
#include "engine/common/log.h"

namespace qtts::cuda {

OwnerGuard::OwnerGuard() : OwnerGuard(default_mode()) {}

OwnerGuard::OwnerGuard(OwnerGuardMode mode) : owner_(std::this_thread::get_id()), mode_(mode) {}

OwnerGuardMode OwnerGuard::default_mode() {
#ifdef NDEBUG
    return OwnerGuardMode::OWNER_GUARD_THROW;
#else
    return OwnerGuardMode::OWNER_GUARD_ABORT;
#endif
}

void OwnerGuard::adopt() {
    if (busy_.load()) violation("adopt", "ownership cannot move while a replay or capture is in progress");
    owner_.store(std::this_thread::get_id());
}

void OwnerGuard::check(const char* what) const {
    if (owner_.load() != std::this_thread::get_id())
        violation(what, "GPU state touched from a thread that does not own it");
}

void OwnerGuard::violation(const char* what, const char* rule) const {
    std::ostringstream ids;
    ids << "owner thread " << owner_.load() << ", calling thread " << std::this_thread::get_id();
    const std::string message =
        fmt::format("GPU owner guard: {} ({}; {}). Every GPU buffer and graph belongs to one engine thread.", rule,
                    what, ids.str());
    if (mode_ == OwnerGuardMode::OWNER_GUARD_ABORT) {
        QTTS_LOG_ERROR("{}", message);
        std::abort();
    }
    throw Error(ErrorCode::ERROR_INTERNAL, message);
}

OwnerGuard::Scope::Scope(OwnerGuard& guard, const char* what) : guard_(guard) {
    guard_.check(what);
    bool expected = false;
    if (!guard_.busy_.compare_exchange_strong(expected, true))
        guard_.violation(what, "re-entrant replay: a replay or capture is already in progress");
}

OwnerGuard::Scope::~Scope() { guard_.busy_.store(false); }

}  // namespace qtts::cuda
