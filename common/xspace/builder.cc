#include "common/xspace/builder.h"

#include <algorithm>

#include "common/base/strings.h"

namespace clusterprof::xspace {

XEventBuilder XLineBuilder::AddEvent(const XEventMetadata& metadata) {
  XEvent* event = line_->add_events();
  event->set_metadata_id(metadata.id());
  return XEventBuilder(line_, plane_, event);
}

XPlaneBuilder::XPlaneBuilder(XPlane* plane) : XStatsBuilder<XPlane>(plane, this) {
  for (auto& [id, metadata] : *plane->mutable_event_metadata()) {
    last_event_metadata_id_ = std::max(last_event_metadata_id_, id);
    if (!metadata.name().empty()) event_metadata_by_name_.try_emplace(metadata.name(), &metadata);
  }
  for (auto& [id, metadata] : *plane->mutable_stat_metadata()) {
    last_stat_metadata_id_ = std::max(last_stat_metadata_id_, id);
    if (!metadata.name().empty()) stat_metadata_by_name_.try_emplace(metadata.name(), &metadata);
  }
  for (XLine& line : *plane->mutable_lines()) {
    lines_by_id_.try_emplace(line.id(), &line);
  }
}

XEventMetadata* XPlaneBuilder::CreateEventMetadata() {
  const int64_t id = ++last_event_metadata_id_;
  XEventMetadata& metadata = (*owner_->mutable_event_metadata())[id];
  metadata.set_id(id);
  return &metadata;
}

XEventMetadata* XPlaneBuilder::GetOrCreateEventMetadata(std::string_view name) {
  if (auto it = event_metadata_by_name_.find(AbslView(name)); it != event_metadata_by_name_.end()) {
    return it->second;
  }
  XEventMetadata* metadata = CreateEventMetadata();
  metadata->set_name(name.data(), name.size());
  event_metadata_by_name_.emplace(std::string(name), metadata);
  return metadata;
}

XStatMetadata* XPlaneBuilder::GetOrCreateStatMetadata(std::string_view name) {
  if (auto it = stat_metadata_by_name_.find(AbslView(name)); it != stat_metadata_by_name_.end()) {
    return it->second;
  }
  const int64_t id = ++last_stat_metadata_id_;
  XStatMetadata& metadata = (*owner_->mutable_stat_metadata())[id];
  metadata.set_id(id);
  metadata.set_name(name.data(), name.size());
  stat_metadata_by_name_.emplace(std::string(name), &metadata);
  return &metadata;
}

XLineBuilder XPlaneBuilder::GetOrCreateLine(int64_t line_id) {
  auto [it, inserted] = lines_by_id_.try_emplace(line_id, nullptr);
  if (inserted) {
    it->second = owner_->add_lines();
    it->second->set_id(line_id);
    it->second->set_display_id(line_id);
  }
  return XLineBuilder(it->second, this);
}

const XPlane* FindPlaneWithName(const XSpace& space, std::string_view name) {
  for (const XPlane& plane : space.planes()) {
    if (plane.name() == name) return &plane;
  }
  return nullptr;
}

XPlane* FindMutablePlaneWithName(XSpace* space, std::string_view name) {
  for (XPlane& plane : *space->mutable_planes()) {
    if (plane.name() == name) return &plane;
  }
  return nullptr;
}

XPlane* FindOrAddMutablePlaneWithName(XSpace* space, std::string_view name) {
  if (XPlane* plane = FindMutablePlaneWithName(space, name)) return plane;
  int64_t next_id = 0;
  for (const XPlane& plane : space->planes()) next_id = std::max(next_id, plane.id() + 1);
  XPlane* plane = space->add_planes();
  plane->set_id(next_id);
  plane->set_name(name.data(), name.size());
  return plane;
}

bool IsEmpty(const XSpace& space) {
  for (const XPlane& plane : space.planes()) {
    for (const XLine& line : plane.lines()) {
      if (line.events_size() > 0) return false;
    }
  }
  return true;
}

int64_t CountEvents(const XSpace& space) {
  int64_t count = 0;
  for (const XPlane& plane : space.planes()) {
    for (const XLine& line : plane.lines()) count += line.events_size();
  }
  return count;
}

void SortXSpace(XSpace* space) {
  for (XPlane& plane : *space->mutable_planes()) {
    for (XLine& line : *plane.mutable_lines()) {
      auto* events = line.mutable_events();
      std::stable_sort(events->pointer_begin(), events->pointer_end(),
                       [](const XEvent* a, const XEvent* b) {
                         if (a->offset_ps() != b->offset_ps())
                           return a->offset_ps() < b->offset_ps();
                         return a->duration_ps() > b->duration_ps();
                       });
    }
  }
}

}  // namespace clusterprof::xspace
