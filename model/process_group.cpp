#include "model/process_group.h"

namespace ckptsim::model {

void ProcessGroup::not_implemented(const char* op) const {
  throw std::logic_error(std::string(op) + " is not implemented by backend " + backend_name());
}

void ProcessGroup::reduce_scatter_sum(std::span<const float>, std::span<float>) {
  not_implemented("reduce_scatter_sum");
}
void ProcessGroup::all_gather(std::span<const std::byte>, std::span<std::byte>) {
  not_implemented("all_gather");
}
std::vector<std::vector<char>> ProcessGroup::all_gather_object(const std::vector<char>&) {
  not_implemented("all_gather_object");
}
std::vector<char> ProcessGroup::broadcast_object(const std::vector<char>&, int) {
  not_implemented("broadcast_object");
}
void ProcessGroup::barrier() { not_implemented("barrier"); }

}  // namespace ckptsim::model
