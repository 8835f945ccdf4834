#include "common/xspace/merge.h"

#include <algorithm>
#include <string>

#include "common/base/strings.h"
#include "common/xspace/builder.h"
#include "common/xspace/schema.h"

namespace clusterprof::xspace {

MergeStats MergeXSpace(XSpace from, XSpace* into, std::string_view source) {
  MergeStats stats;
  int64_t next_id = 0;
  for (const XPlane& plane : into->planes()) next_id = std::max(next_id, plane.id() + 1);
  for (XPlane& plane : *from.mutable_planes()) {
    if (plane.name() == kTaskEnvPlaneName) continue;
    if (plane.name() != kHostThreadsPlaneName &&
        FindPlaneWithName(*into, plane.name()) != nullptr) {
      into->add_warnings(StrCat(source, ": left out its ", plane.name(),
                                " plane: clusterprof's own tracer recorded that device"));
      continue;
    }
    for (const XLine& line : plane.lines()) stats.events += line.events_size();
    plane.set_id(next_id++);
    *into->add_planes() = std::move(plane);
    ++stats.planes;
  }
  for (const std::string& host : from.hostnames()) {
    if (std::find(into->hostnames().begin(), into->hostnames().end(), host) ==
        into->hostnames().end()) {
      into->add_hostnames(host);
    }
  }
  for (const std::string& warning : from.warnings()) {
    into->add_warnings(StrCat(source, ": ", warning));
  }
  for (const std::string& error : from.errors()) into->add_errors(StrCat(source, ": ", error));
  return stats;
}

}  // namespace clusterprof::xspace
