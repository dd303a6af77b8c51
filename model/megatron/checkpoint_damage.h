// A damaged real checkpoint (issue 25, item 4): which of its files a crashed or interrupted
// save left missing, empty, cut short or unreadable, and the same damage on the model's own save
// of the same configuration, so that `ckptsim inspect` can say how each revision's resume from
// it goes instead of only "this file is damaged".
//
// What is examined (a torch_dist checkpoint, model/megatron/torch_dist_checkpoint.h):
//   latest_checkpointed_iteration.txt   unreadable (read_metadata() would exit on it), or naming
//                                       an iteration whose directory is absent
//   iter_NNNNNNN/metadata.json          missing, empty or no JSON object
//   iter_NNNNNNN/.metadata              missing, empty or no readable pickle
//   iter_NNNNNNN/__R_B.distcp           every data file `.metadata` names: missing, empty, or
//                                       shorter than the end of its last item (cut short)
//   iter_NNNNNNN/common.pt              missing (where the checkpoint keeps its common state in
//                                       common.pt, as every revision before HEAD does), empty or
//                                       no readable torch.save
//
// How a damaged file maps onto the model's own format (model/megatron/serialization.h), as the
// replay runner maps the model's storage faults onto the real files (replay/storage_faults.py):
//   __R_B.distcp   rank R's shards/rank_R.bin, cut where the first of its pieces of a tensor
//                  the real file lost begins (missing: removed; empty: emptied); an object the
//                  real file lost (a ShardedObject item, HEAD's 'common_state' among them) is
//                  its objects/<unique key>.pt, cut to half its bytes (missing: removed)
//   .metadata      metadata.json (the piece index)   missing: removed; empty: emptied; cut or
//   common.pt      common.pt                         unreadable: cut to half its bytes (a cut
//                                                    file's whole size is not known), at least 1
//   tracker        the tracker: the same bytes where it is unreadable; where it names an absent
//                  iteration, an iteration the model's save did not write either
//   metadata.json  no counterpart: the model's format has no backend marker (not mapped)
//
// Invariants:
//   1. find_damage reads only; every finding names its file relative to the storage's root.
//   2. A checkpoint whose files are whole gives no finding (read_torch_dist_* reads it).
//   3. apply_damage changes only the counterparts named above, each at most once per finding;
//      what it cannot map is listed in `unmapped`, never guessed.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "model/storage.h"
#include "model/torch/distributed_checkpoint.h"

namespace ckptsim::model {

// dist_checkpointing's own metadata.json (its backends), in each iteration directory.
inline constexpr std::string_view kMegatronMetadataFile = "metadata.json";

enum class DamageKind { kMissing, kEmpty, kCut, kUnreadable, kNamesAbsentIteration };

// "missing", "empty", "cut short", "unreadable", "names an absent iteration".
std::string damage_kind_name(DamageKind k);

struct DamagedFile {
  std::string file;  // relative to the storage's root: "iter_0000003/__1_0.distcp"
  DamageKind kind = DamageKind::kMissing;
  int64_t bytes = 0;         // what is on disk
  int64_t bytes_needed = 0;  // a data file: the end of its last item in `.metadata`; else 0
  std::string detail;        // kUnreadable: the reader's message
  // A data file: `.metadata`'s items (fqn) not wholly in it, each once, in `.metadata`'s order.
  std::vector<std::string> items_lost;
  int64_t named_iteration = 0;  // kNamesAbsentIteration
  std::string content;          // the tracker's bytes (kUnreadable), to copy them
  // "iter_0000003/__1_0.distcp: cut short, 1705 of 3410 bytes (2 items lost: 'a', 'b')".
  std::string text() const;
};

struct DamageCensus {
  std::vector<DamagedFile> files;
  // The iteration directory examined: the source's, else the tracker's, else (the tracker
  // unreadable, or naming an absent iteration) the newest iter_* present; "" when none is.
  std::string iter_dir;
  std::optional<DcpMetadata> metadata;  // `.metadata`, where it is readable
  bool common_state_object = false;     // `.metadata` holds HEAD's 'common_state' object
  bool empty() const { return files.empty(); }
};

// Examines the checkpoint at the root of `storage`: `iter_dir` "" reads the tracker there (a
// --save directory), else that iteration directory alone (no tracker is examined).
DamageCensus find_damage(const Storage& storage, const std::string& iter_dir);

// The data files (names relative to the iteration directory, as `.metadata` gives them) that
// are missing, empty or cut short: read_torch_dist_directory reads their lost tensor chunks as
// zeros, so that the run can be inferred from what is left.
std::set<std::string> lost_data_files(const DamageCensus& census);

struct ModelDamage {
  std::vector<std::string> applied;   // "shards/rank_1.bin cut to 1024 of 4096 bytes (...)"
  std::vector<std::string> unmapped;  // findings with no counterpart, each with why
  // Each damaged file of the model's (relative to its iteration directory: "shards/rank_1.bin",
  // "metadata.json") -> the real file it stands for ("iter_0000003/__1_0.distcp"), so that a
  // message of the model's load can name the user's file too.
  std::map<std::string, std::string> stands_for;
};

// Applies `census`'s damage to the model's own checkpoint at the root of `model_root` (a
// --save directory: its tracker and `model_iter_dir`), as the header says.
ModelDamage apply_damage(const DamageCensus& census, Storage& model_root,
                         const std::string& model_iter_dir, int64_t model_iteration);

}  // namespace ckptsim::model
