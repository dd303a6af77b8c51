#include "model/megatron/checkpoint_caches.h"

#include <utility>

#include "model/errors.h"
#include "model/py/pickle_codec.h"

namespace ckptsim::model {

namespace {

// The index of the metadata.json `bytes`, parsed now.
Result<std::shared_ptr<const LoadIndex>> parse_load_index(
    std::shared_ptr<const std::vector<char>> bytes) {
  auto parsed = own_format::parse_checkpoint_index(*bytes);
  if (!parsed.is_ok()) return parsed.status();
  return std::shared_ptr<const LoadIndex>(
      own_format::make_load_index(std::move(bytes), std::move(parsed.value())));
}

std::shared_ptr<const Value> decode_common_state(const std::vector<char>& bytes) {
  auto decoded = unpickle_value(bytes);
  CKPTSIM_CHECK(decoded.is_ok(), "rank 0 common state does not decode");
  return std::make_shared<const Value>(std::move(decoded.value()));
}

}  // namespace

// The file is read under the lock, so that ranks waiting for it do not each hold a copy of the
// bytes (at DP 2048 that was 1536 copies of a 2.5 MB file). It is parsed outside the lock:
// ranks on threads (Execution::kThreads) would otherwise wait for each other's parse.
Result<std::shared_ptr<const LoadIndex>> CheckpointCaches::load_index(const Storage& storage) {
  std::shared_ptr<const std::vector<char>> bytes;
  {
    std::lock_guard lock(mu_);
    auto read = storage.read_file_shared(own_format::kMetadataFile);
    if (!read.is_ok()) return read.status();
    bytes = std::move(read.value());
    if (auto index = find_locked(bytes)) return index;
  }
  auto parsed = parse_load_index(std::move(bytes));
  if (!parsed.is_ok()) return parsed.status();
  return insert(std::move(parsed.value()));
}

// A storage that cannot read the file back, or whose file does not hold the bytes written (a
// short write: the index of the pieces would pass for the cut bytes'), is left alone.
void CheckpointCaches::prime_load_index(const Storage& storage,
                                        const std::vector<SavedPiece>& pieces,
                                        const std::vector<std::string>& object_keys,
                                        bool common_in_common_pt,
                                        const std::vector<char>& written) {
  std::shared_ptr<const std::vector<char>> bytes;
  {
    std::lock_guard lock(mu_);
    auto read = storage.read_file_shared(own_format::kMetadataFile);
    if (!read.is_ok() || *read.value() != written) return;
    bytes = std::move(read.value());
    if (find_locked(bytes) != nullptr) return;
  }
  std::shared_ptr<const LoadIndex> index = insert(own_format::make_load_index(
      std::move(bytes), own_format::written_index(pieces, object_keys, common_in_common_pt)));
  std::lock_guard lock(mu_);
  primed_ = std::move(index);
}

void CheckpointCaches::check_load_indexes_unchanged() const {
  std::lock_guard lock(mu_);
  for (const auto& weak : entries_) {
    if (const auto index = weak.lock()) index->check_unchanged();
  }
}

std::shared_ptr<const Value> CheckpointCaches::decoded_common_state(
    const std::vector<char>& bytes) {
  std::lock_guard lock(mu_);
  if (decoded_ == nullptr || decoded_bytes_ != bytes) {
    decoded_ = decode_common_state(bytes);
    decoded_bytes_ = bytes;
  }
  return decoded_;
}

// The cached index of these bytes (same buffer or equal content), or null.
std::shared_ptr<const LoadIndex> CheckpointCaches::find_locked(
    const std::shared_ptr<const std::vector<char>>& bytes) {
  std::erase_if(entries_, [](const auto& e) { return e.expired(); });
  for (const auto& weak : entries_) {
    std::shared_ptr<const LoadIndex> index = weak.lock();
    if (index != nullptr && (index->bytes == bytes || *index->bytes == *bytes)) return index;
  }
  return nullptr;
}

std::shared_ptr<const LoadIndex> CheckpointCaches::insert(std::shared_ptr<const LoadIndex> index) {
  std::lock_guard lock(mu_);
  // Another rank may have parsed equal bytes meanwhile: every caller shares its index.
  if (auto earlier = find_locked(index->bytes)) return earlier;
  if (entries_.size() >= kLoadIndexCacheEntriesMax) entries_.erase(entries_.begin());
  entries_.push_back(index);
  latest_ = index;
  return index;
}

Result<std::shared_ptr<const LoadIndex>> load_index(const Storage& storage,
                                                    CheckpointCaches* caches) {
  if (caches != nullptr) return caches->load_index(storage);
  auto read = storage.read_file_shared(own_format::kMetadataFile);
  if (!read.is_ok()) return read.status();
  return parse_load_index(std::move(read.value()));
}

std::shared_ptr<const Value> decoded_common_state(const std::vector<char>& bytes,
                                                  CheckpointCaches* caches) {
  return caches != nullptr ? caches->decoded_common_state(bytes) : decode_common_state(bytes);
}

}  // namespace ckptsim::model
