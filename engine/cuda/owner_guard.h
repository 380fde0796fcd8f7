// The single-owner rule of the GPU state (architecture: "one engine thread owns every static
// buffer and graph"). An OwnerGuard records the thread that owns a set of GPU objects; every
// buffer access and every graph replay checks it, and a replay also marks the guard busy so a
// re-entrant replay (from a callback, or while a capture is in progress) is caught.
//
// A violation is a bug in the caller. What happens is chosen per guard:
//   OWNER_GUARD_ABORT  log and std::abort() (default in debug builds: stops at the bug)
//   OWNER_GUARD_THROW  throw qtts::Error(ERROR_INTERNAL) (default in release builds; and tests)
#pragma once

#include <atomic>
#include <thread>

namespace qtts::cuda {

enum class OwnerGuardMode { OWNER_GUARD_ABORT, OWNER_GUARD_THROW };

class OwnerGuard {
public:
    // Owned by the constructing thread.
    OwnerGuard();
    explicit OwnerGuard(OwnerGuardMode mode);

    static OwnerGuardMode default_mode();

    void set_mode(OwnerGuardMode mode) { mode_ = mode; }
    OwnerGuardMode mode() const { return mode_; }

    // Hands ownership to the calling thread (an engine moving its state onto its own thread).
    // Refused while a replay or capture is in progress.
    void adopt();
    std::thread::id owner() const { return owner_.load(); }

    // Buffer access: the calling thread must be the owner.
    void check(const char* what) const;

    // Replay/capture scope: owner thread and no replay/capture in progress.
    class Scope {
    public:
        Scope(OwnerGuard& guard, const char* what);
        ~Scope();
        Scope(const Scope&) = delete;
        Scope& operator=(const Scope&) = delete;

    private:
        OwnerGuard& guard_;
    };

    bool busy() const { return busy_.load(); }

private:
    [[noreturn]] void violation(const char* what, const char* rule) const;

    std::atomic<std::thread::id> owner_;
    std::atomic<bool> busy_{false};
    OwnerGuardMode mode_;
};

}  // namespace qtts::cuda
