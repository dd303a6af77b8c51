#include "model/process_group.h"

#include <fmt/format.h>

#include "model/errors.h"
#include "model/fnv1a.h"

namespace ckptsim::model {

const char* op_name(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::kReduceScatterSum:
      return "reduce_scatter_sum";
    case CollectiveOp::kAllReduceSum:
      return "all_reduce_sum";
    case CollectiveOp::kAllGather:
      return "all_gather";
    case CollectiveOp::kAllGatherObject:
      return "all_gather_object";
    case CollectiveOp::kBroadcastObject:
      return "broadcast_object";
    case CollectiveOp::kBarrier:
      return "barrier";
  }
  return "unknown collective";
}

CollectiveNotImplemented::CollectiveNotImplemented(CollectiveOp op, const std::string& backend_name)
    : std::logic_error(
          fmt::format("{} is not implemented by backend {}", op_name(op), backend_name)) {}

uint64_t fingerprint(const std::vector<std::vector<char>>& objects) {
  uint64_t h = kFnv1aOffset;
  for (const auto& o : objects) {
    const uint64_t size = o.size();
    h = word_hash(&size, sizeof size, h);
    h = word_hash(o.data(), o.size(), h);
  }
  return h;
}

GatheredObjects::GatheredObjects(std::vector<std::vector<char>> objects)
    : objects_(std::move(objects)), fingerprint_(fingerprint(objects_)) {}

void GatheredObjects::check_unchanged() const {
  CKPTSIM_CHECK(fingerprint(objects_) == fingerprint_,
                fmt::format("gathered objects of {} ranks were written after the gather: every "
                            "rank sharing them would see the change",
                            objects_.size()));
}

void GatheredObjects::check_derived_type(const std::type_info& asked) const {
  CKPTSIM_CHECK(*derived_type_ == asked,
                fmt::format("a value derived from gathered objects asked as {} but computed as {}",
                            asked.name(), derived_type_->name()));
}

ProcessGroup::~ProcessGroup() = default;

void ProcessGroup::reduce_scatter_sum(std::span<const float>, std::span<float>) {
  throw CollectiveNotImplemented(CollectiveOp::kReduceScatterSum, backend_name());
}
void ProcessGroup::all_reduce_sum(std::span<float>) {
  throw CollectiveNotImplemented(CollectiveOp::kAllReduceSum, backend_name());
}
void ProcessGroup::all_gather(std::span<const std::byte>, std::span<std::byte>) {
  throw CollectiveNotImplemented(CollectiveOp::kAllGather, backend_name());
}
std::vector<std::vector<char>> ProcessGroup::all_gather_object(const std::vector<char>&) {
  throw CollectiveNotImplemented(CollectiveOp::kAllGatherObject, backend_name());
}
std::shared_ptr<const GatheredObjects> ProcessGroup::all_gather_object_shared(
    const std::vector<char>& bytes) {
  return std::make_shared<const GatheredObjects>(all_gather_object(bytes));
}
std::vector<char> ProcessGroup::broadcast_object(const std::vector<char>&, int) {
  throw CollectiveNotImplemented(CollectiveOp::kBroadcastObject, backend_name());
}
void ProcessGroup::barrier() {
  throw CollectiveNotImplemented(CollectiveOp::kBarrier, backend_name());
}

}  // namespace ckptsim::model
