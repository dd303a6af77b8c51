#include "model/process_group.h"

#include <fmt/format.h>

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
std::vector<char> ProcessGroup::broadcast_object(const std::vector<char>&, int) {
  throw CollectiveNotImplemented(CollectiveOp::kBroadcastObject, backend_name());
}
void ProcessGroup::barrier() {
  throw CollectiveNotImplemented(CollectiveOp::kBarrier, backend_name());
}

}  // namespace ckptsim::model
