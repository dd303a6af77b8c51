#include "sim/object_exchange.h"

#include <fmt/format.h>

#include "model/errors.h"

namespace ckptsim::sim {

ObjectExchange::ObjectExchange(int world_size) : world_size_(world_size) {
  CKPTSIM_CHECK(world_size >= 1, fmt::format("an object exchange for {} ranks", world_size));
}

void ObjectExchange::deposit(uint64_t sequence_number, int rank, std::vector<char> bytes) {
  CKPTSIM_CHECK(rank >= 0 && rank < world_size_,
                fmt::format("rank {} outside an exchange of {} ranks", rank, world_size_));
  const auto r = static_cast<size_t>(rank);
  std::lock_guard lock(mu_);
  Round& round = rounds_[sequence_number];
  if (round.deposits.empty()) {
    round.deposits.resize(static_cast<size_t>(world_size_));
    round.deposited.resize(static_cast<size_t>(world_size_));
    round.taken.resize(static_cast<size_t>(world_size_));
  }
  CKPTSIM_CHECK(!round.deposited[r] && round.result == nullptr,
                fmt::format("rank {} deposited twice in gather {}", rank, sequence_number));
  round.deposits[r] = std::move(bytes);
  round.deposited[r] = true;
  ++round.deposited_count;
}

std::shared_ptr<const model::GatheredObjects> ObjectExchange::take(uint64_t sequence_number,
                                                                   int rank) {
  const auto r = static_cast<size_t>(rank);
  std::lock_guard lock(mu_);
  auto it = rounds_.find(sequence_number);
  CKPTSIM_CHECK(it != rounds_.end(), fmt::format("rank {} took gather {} that nobody deposited in",
                                                 rank, sequence_number));
  Round& round = it->second;
  CKPTSIM_CHECK(round.deposited_count == world_size_,
                fmt::format("rank {} took gather {} with {} of {} ranks deposited", rank,
                            sequence_number, round.deposited_count, world_size_));
  CKPTSIM_CHECK(rank >= 0 && rank < world_size_ && !round.taken[r],
                fmt::format("rank {} took gather {} twice", rank, sequence_number));
  if (round.result == nullptr) {
    round.result = std::make_shared<const model::GatheredObjects>(std::move(round.deposits));
  }
  round.taken[r] = true;
  std::shared_ptr<const model::GatheredObjects> result = round.result;
  if (++round.taken_count == world_size_) rounds_.erase(it);
  return result;
}

size_t ObjectExchange::open_rounds() const {
  std::lock_guard lock(mu_);
  return rounds_.size();
}

SharingProcessGroup::SharingProcessGroup(model::ProcessGroup& inner, ObjectExchange& exchange)
    : inner_(inner), exchange_(exchange) {}

void SharingProcessGroup::reduce_scatter_sum(std::span<const float> input,
                                             std::span<float> output) {
  next_sequence_number();
  inner_.reduce_scatter_sum(input, output);
}

void SharingProcessGroup::all_reduce_sum(std::span<float> data) {
  next_sequence_number();
  inner_.all_reduce_sum(data);
}

void SharingProcessGroup::all_gather(std::span<const std::byte> input,
                                     std::span<std::byte> output) {
  next_sequence_number();
  inner_.all_gather(input, output);
}

std::vector<std::vector<char>> SharingProcessGroup::all_gather_object(
    const std::vector<char>& bytes) {
  next_sequence_number();
  return inner_.all_gather_object(bytes);
}

std::shared_ptr<const model::GatheredObjects> SharingProcessGroup::all_gather_object_shared(
    const std::vector<char>& bytes) {
  const uint64_t sequence_number = next_sequence_number();
  CKPTSIM_CHECK(sequence_number == inner_.sequence_number(),
                fmt::format("rank {}: sequence number {} here but {} in the world", rank(),
                            sequence_number, inner_.sequence_number()));
  exchange_.deposit(sequence_number, rank(), bytes);
  // The payload travels through the exchange; the world's collective checks and orders it.
  (void)inner_.all_gather_object({});
  return exchange_.take(sequence_number, rank());
}

std::vector<char> SharingProcessGroup::broadcast_object(const std::vector<char>& bytes, int root) {
  next_sequence_number();
  return inner_.broadcast_object(bytes, root);
}

void SharingProcessGroup::barrier() {
  next_sequence_number();
  inner_.barrier();
}

}  // namespace ckptsim::sim
