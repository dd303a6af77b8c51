#include "model/megatron/async_save.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <memory>

#include "model/errors.h"
#include "model/faults.h"
#include "model/megatron/torch_dist_checkpoint.h"
#include "model/torch/torch_save_format.h"

namespace ckptsim::model {

namespace {

using Op = AsyncSaveRequest::Op;

std::string base_name(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// The checkpoint directory as an async save sees it: the schedule-time operations go through
// to `base` at once; the worker's writes and the finalize operations are kept, in order (the
// finalize part starts with metadata.json, the coordinator's .metadata and metadata.json). Reads
// see the kept writes (the save reads back the metadata it wrote, to index it).
class RecordingStorage final : public Storage {
 public:
  explicit RecordingStorage(Storage& base) : base_(base) {}

  Status write_file(const std::string& path, std::span<const char> bytes) override {
    const std::string name = base_name(path);
    // Written when the save is scheduled: the common state before HEAD (save_common runs
    // before the request is built), and the tracker where a fault site writes it first.
    if (!finalizing_ &&
        (name == "common.pt" || name == "common_globals.json" || path == kTrackerFile)) {
      return base_.write_file(path, bytes);
    }
    finalizing_ = finalizing_ || name == "metadata.json";
    Op op{Op::Kind::kWrite, path, "", std::vector<char>(bytes.begin(), bytes.end())};
    kept_[path] = op.bytes;
    (finalizing_ ? finalize_ : writes_).push_back(std::move(op));
    return Status::ok();
  }
  Result<std::vector<char>> read_file(const std::string& path) const override {
    if (auto it = kept_.find(path); it != kept_.end()) return it->second;
    return base_.read_file(path);
  }
  Result<std::shared_ptr<const std::vector<char>>> read_file_shared(
      const std::string& path) const override {
    if (auto it = kept_.find(path); it != kept_.end())
      return std::make_shared<const std::vector<char>>(it->second);
    return base_.read_file_shared(path);
  }
  bool exists(const std::string& path) const override {
    if (kept_.contains(path)) return true;
    const std::string dir = path + "/";
    for (const auto& [p, bytes] : kept_) {
      if (p.starts_with(dir)) return true;
    }
    return base_.exists(path);
  }
  Result<std::vector<std::string>> list(const std::string& dir) const override {
    return base_.list(dir);
  }
  Status remove_all(const std::string& dir) override {
    if (!finalizing_) return base_.remove_all(dir);  // a directory being replaced, cleared first
    finalize_.push_back({Op::Kind::kRemoveAll, dir, "", {}});
    return Status::ok();
  }
  Status rename(const std::string& from, const std::string& to) override {
    finalize_.push_back({Op::Kind::kRename, from, to, {}});
    return Status::ok();
  }
  std::string describe() const override { return base_.describe() + " (async save)"; }

  std::vector<Op> take_writes() { return std::move(writes_); }
  std::vector<Op> take_finalize() { return std::move(finalize_); }

 private:
  Storage& base_;
  bool finalizing_ = false;
  std::map<std::string, std::vector<char>> kept_;
  std::vector<Op> writes_;
  std::vector<Op> finalize_;
};

// A saved piece's element size, from its torch dtype name (the save wrote only dtypes it names).
int64_t element_bytes(const std::string& dtype) {
  const auto type = dtype_from_global(dtype);
  CKPTSIM_CHECK(type.has_value(), "a saved piece of dtype " + dtype);
  return static_cast<int64_t>(c10::elementSize(*type));
}

bool same_structure(const std::vector<SavedPiece>& a, const std::vector<SavedPiece>& b) {
  return std::equal(
      a.begin(), a.end(), b.begin(), b.end(), [](const SavedPiece& x, const SavedPiece& y) {
        return x.key == y.key && x.dtype == y.dtype && x.global_offset == y.global_offset &&
               x.numel == y.numel && x.byte_offset == y.byte_offset;
      });
}

// Fault site save.async_writer_reuses_cached_handles: the job's first async save primes the
// rank's worker cache; a later one of the same structure writes its optimizer pieces from it.
void reuse_cached_tensors(const SaveReport& report, int rank, Runtime& rt, AsyncWriterCache& cache,
                          AsyncSaveRequest& request) {
  if (report.pieces == nullptr) return;
  std::vector<SavedPiece> mine;
  for (const SavedPiece& p : *report.pieces) {
    if (p.rank == rank) mine.push_back(p);
  }
  if (mine.empty()) return;
  auto shard = std::find_if(request.writes.begin(), request.writes.end(), [&](const Op& op) {
    return op.kind == Op::Kind::kWrite && op.path.ends_with("/" + mine.front().file);
  });
  if (shard == request.writes.end()) return;
  if (!cache.primed) {
    cache = {true, std::move(mine), shard->bytes};
    return;
  }
  if (!same_structure(cache.pieces, mine) || cache.shard.size() != shard->bytes.size()) return;
  if (!rt.fault(fault::kAsyncReusesCachedHandles)) return;
  for (const SavedPiece& p : mine) {
    if (!p.key.starts_with("optimizer.")) continue;
    const auto begin = static_cast<size_t>(p.byte_offset);
    const auto size = static_cast<size_t>(p.numel * element_bytes(p.dtype));
    CKPTSIM_CHECK(begin + size <= shard->bytes.size(), "a saved piece outside its data file");
    std::copy_n(cache.shard.begin() + static_cast<std::ptrdiff_t>(begin), size,
                shard->bytes.begin() + static_cast<std::ptrdiff_t>(begin));
  }
}

void apply(const Op& op, std::span<const char> bytes, Storage& root, const char* where) {
  Status s;
  switch (op.kind) {
    case Op::Kind::kWrite:
      s = root.write_file(op.path, bytes);
      break;
    case Op::Kind::kRemoveAll:
      s = root.remove_all(op.path);
      break;
    case Op::Kind::kRename:
      s = root.rename(op.path, op.to);
      break;
  }
  if (!s.is_ok()) throw UpstreamError("OSError", s.to_string(), where);
}

}  // namespace

SaveReport schedule_async_save(DistributedDataParallel& ddp, ChainedOptimizer& opt,
                               const OptimizerParamScheduler* scheduler, int64_t iteration,
                               Storage& root, ProcessGroup& group, const RevisionSwitches& switches,
                               const CheckpointFormat& format, Runtime& rt, AsyncWriterCache& cache,
                               AsyncSaveRequest& request, CheckpointCaches* caches) {
  RecordingStorage recording(root);
  SaveReport report = save_checkpoint_to_root(ddp, opt, scheduler, iteration, recording, group,
                                              switches, format, rt, caches);
  request.iteration = iteration;
  request.writes = recording.take_writes();
  request.finalize = recording.take_finalize();
  reuse_cached_tensors(report, group.rank(), rt, cache, request);
  return report;
}

void finalize_async_save(const AsyncSaveRequest& request, Storage& root, ProcessGroup& group,
                         int64_t live_iteration, Runtime& rt) {
  for (const Op& op : request.writes)
    apply(op, op.bytes, root, "filesystem_async.py write_preloaded_data() (async worker)");
  group.barrier();  // maybe_finalize_async_calls: every rank's worker is done
  for (const Op& op : request.finalize) {
    const char* where = "checkpointing.py save_checkpoint() (async finalize)";
    if (op.kind == Op::Kind::kWrite && op.path == kTrackerFile &&
        live_iteration != request.iteration && rt.fault(fault::kAsyncFinalizeReadsLiveIteration)) {
      const std::string live = std::to_string(live_iteration);
      apply(op, {live.data(), live.size()}, root, where);
      continue;
    }
    apply(op, op.bytes, root, where);
  }
  group.barrier();
}

}  // namespace ckptsim::model
