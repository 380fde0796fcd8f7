// Shared by the libFuzzer targets (docs/fuzzing.md).
//
// The contract every target checks: bad input ends in a qtts::Error (or, for the request
// parsers, a RequestError) that is not ERROR_INTERNAL. Anything else is a finding: a crash, a
// sanitizer report, an escaping exception of another type (libFuzzer reports it as a deadly
// signal) or an internal error (an invariant that input could break).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <sys/mman.h>
#include <unistd.h>

#include "engine/common/error.h"

namespace qtts::fuzz {

// Readers that take a path (safetensors, audio, voice files) are fed through an in-memory
// file (memfd) reopened by its /proc path: the real entry point, without touching the disk.
class MemoryFile {
public:
    explicit MemoryFile(const char* name) {
        fd_ = memfd_create(name, MFD_CLOEXEC);
        if (fd_ < 0) {
            std::perror("memfd_create");
            std::abort();
        }
        path_ = "/proc/self/fd/" + std::to_string(fd_);
    }
    MemoryFile(const MemoryFile&) = delete;
    MemoryFile& operator=(const MemoryFile&) = delete;
    ~MemoryFile() { ::close(fd_); }

    // Replaces the content and returns the path to open.
    const std::string& write(const uint8_t* data, size_t size) {
        if (ftruncate(fd_, 0) != 0) std::abort();
        size_t done = 0;
        while (done < size) {
            const ssize_t n = pwrite(fd_, data + done, size - done, off_t(done));
            if (n <= 0) std::abort();
            done += size_t(n);
        }
        return path_;
    }

private:
    int fd_ = -1;
    std::string path_;
};

// A qtts::Error is the expected answer to bad input, unless it reports a broken invariant.
inline void error_check(const Error& e) {
    if (e.code() == ErrorCode::ERROR_INTERNAL) {
        std::fprintf(stderr, "fuzz: internal error on input: %s\n", e.what());
        std::abort();
    }
}

// Stops the run with a message when a property of a successful parse does not hold.
inline void property(bool holds, const char* what) {
    if (!holds) {
        std::fprintf(stderr, "fuzz: property failed: %s\n", what);
        std::abort();
    }
}

}  // namespace qtts::fuzz
