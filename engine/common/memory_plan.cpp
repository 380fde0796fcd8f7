#include "engine/common/memory_plan.h"

#include <cctype>
#include <cmath>
#include <cstdlib>

#include "engine/common/error.h"
#include "engine/common/strings.h"

namespace qtts {

size_t memory_size_parse(const std::string& text) {
    auto bad = [&text](const char* why) {
        fail(ErrorCode::ERROR_INVALID_ARGUMENT,
             "memory size '{}' {}: write a number with an optional unit K, M, G or T (binary: 1G = 1024M), "
             "e.g. 6G, 3000M, 1.5GiB, or plain bytes",
             text, why);
    };
    const std::string s = ascii_trim(text);
    size_t i = 0;
    while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
    const std::string number = s.substr(0, i);
    if (number.empty() || number.find('.') != number.rfind('.') || number == ".") bad("is not a size");
    std::string unit = ascii_lower(ascii_trim(s.substr(i)));
    if (unit.size() >= 2 && unit.compare(unit.size() - 2, 2, "ib") == 0) unit.resize(unit.size() - 2);
    else if (unit.size() >= 2 && unit.back() == 'b') unit.pop_back();
    int shift = 0;
    if (unit.empty() || unit == "b") shift = 0;
    else if (unit == "k") shift = 10;
    else if (unit == "m") shift = 20;
    else if (unit == "g") shift = 30;
    else if (unit == "t") shift = 40;
    else bad("has an unknown unit");
    const double value = std::strtod(number.c_str(), nullptr) * std::ldexp(1.0, shift);
    if (!(value >= 1.0)) bad("is zero");
    if (value > std::ldexp(1.0, 60)) bad("is too large");
    if (shift == 0 && number.find('.') != std::string::npos) bad("has a fraction of a byte");
    return size_t(value);
}

size_t gpu_memory_room(size_t free_bytes, size_t limit_bytes, size_t used_bytes, size_t margin_bytes) {
    size_t room = free_bytes;
    if (limit_bytes > 0) {
        const size_t under_limit = limit_bytes > used_bytes ? limit_bytes - used_bytes : 0;
        if (under_limit < room) room = under_limit;
    }
    return room > margin_bytes ? room - margin_bytes : 0;
}

size_t gpu_memory_margin(size_t limit_bytes) {
    const size_t margin = size_t(256) << 20;
    return limit_bytes > 0 && limit_bytes / 8 < margin ? limit_bytes / 8 : margin;
}

StreamSlotPlan stream_slots_plan(size_t room_bytes, size_t per_slot_bytes, int wanted) {
    QTTS_ASSERT(per_slot_bytes > 0 && wanted >= 0);
    StreamSlotPlan plan;
    plan.per_slot_bytes = per_slot_bytes;
    const size_t fit = room_bytes / per_slot_bytes;
    plan.slots = fit < size_t(wanted) ? int(fit) : wanted;
    plan.left_bytes = room_bytes - size_t(plan.slots) * per_slot_bytes;
    return plan;
}

int context_fit(size_t room_bytes, size_t fixed_bytes, size_t per_position_bytes, int wanted, int step) {
    QTTS_ASSERT(step >= 1 && wanted >= 1 && per_position_bytes > 0);
    if (room_bytes < fixed_bytes) return 0;
    const size_t positions = (room_bytes - fixed_bytes) / per_position_bytes;
    if (positions >= size_t(wanted)) return wanted;
    return int(positions / size_t(step)) * step;
}

}  // namespace qtts
