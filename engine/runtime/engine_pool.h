// The routing policy of EnginePool (engine/api/qtts.h), apart from the engines so it can be read
// and tested on its own numbers: which engine a new request tries first, second, ...
#pragma once

#include <cstddef>
#include <vector>

#include "engine/api/qtts.h"

namespace qtts {

// Above this recent real-time factor an engine's streams fall behind real time (EngineLoad::rtf).
constexpr double ROUTE_LAGGING_RTF = 1.0;

// What the router knows of one engine when a request arrives.
struct RouteCandidate {
    bool serving = false;  // loaded and healthy; others are never tried
    EngineLoad load;
};

// The engines to try for a new request, best first; engines that do not serve are left out.
// Compared in this order, fewer first:
//   1. full (active + queued >= max_streams): it would refuse, so it is tried last;
//   2. lagging (rtf > ROUTE_LAGGING_RTF): one more stream would make its listeners wait longer;
//   3. streams (active + queued);
//   4. rtf (with mixed engines, the faster one of two equally busy engines).
// An engine without streams counts as rtf 0 whatever it reports (its last rounds are over).
// Engines equal on all four are taken round-robin over the engines that serve: the first at or
// after place `rotation` (modulo their count) among them comes first, so idle engines take turns.
std::vector<size_t> engine_route_order(const std::vector<RouteCandidate>& candidates, size_t rotation);

}  // namespace qtts
