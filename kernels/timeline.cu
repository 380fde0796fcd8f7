#include "kernels/timeline.cuh"

#include <vector>

#include "kernels/check.cuh"

namespace qtts::kernels {

namespace {

// Filled while the program starts (each kernel source file's static initialiser), read later.
std::vector<void (*)(const TimelineRing&)>& timeline_setters() {
    static std::vector<void (*)(const TimelineRing&)> setters;
    return setters;
}

}  // namespace

bool timeline_built() {
#ifdef QTTS_KERNEL_TIMELINE
    return true;
#else
    return false;
#endif
}

int timeline_register(void (*set)(const TimelineRing&)) {
    timeline_setters().push_back(set);
    return int(timeline_setters().size());
}

void timeline_attach(const TimelineRing& ring) {
    if (!timeline_built())
        check_fail("timeline_attach", "this build records no timeline (configure with -DQTTS_KERNEL_TIMELINE=ON)",
                   __func__, __FILE__, __LINE__);
    if ((ring.records && (!ring.next || ring.capacity == 0)) ||
        (ring.blocks && (!ring.blocks_next || ring.block_capacity == 0)))
        check_fail("timeline_attach", "a ring needs its counter and a capacity", __func__, __FILE__, __LINE__);
    for (const auto set : timeline_setters()) set(ring);
}

}  // namespace qtts::kernels
