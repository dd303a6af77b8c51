// Tree utilities of dist_checkpointing, with upstream's exact semantics (spec §9.2).
// Mirrors megatron/core/dist_checkpointing/dict_utils.py and the extract_* helpers of
// megatron/core/dist_checkpointing/utils.py.
//
// Semantics that bugs depend on, and that tests pin:
//   - merge() never compares values: any leaf/leaf, leaf/container or dict/list overlap is a
//     MergeError(kDuplicateLeaf) naming the key path; lists of different lengths are a
//     MergeError(kListLengthMismatch) — unless the RX-MILES patch (a revision switch) lets an
//     optimizer param_state list in x1 be truncated to x2's length.
//   - merge() puts x2's subtrees into x1 by reference (no copy).
//   - extract_matching_values() compacts lists (positions are lost) unless lists are
//     returned as dicts; empty containers stay on the non-matching side of a dict parent.
#pragma once

#include <functional>
#include <utility>
#include <vector>

#include "model/py/value.h"

namespace ckptsim::model {

struct MergeOptions {
  // RX-MILES 07220d28f: when x1 is the longer list on a path through 'optimizer' and later
  // 'param_state', truncate x1 instead of raising (spec §9.2).
  bool truncate_optimizer_param_state_lists = false;
};

// Mirrors dict_utils.py merge(): merges x2 into x1 in place and returns x1.
// Throws MergeError (a ValueError upstream).
Value merge(Value x1, const Value& x2, const MergeOptions& options = {}, const KeyPath& key = {});

// Mirrors dict_utils.py extract_matching_values(). Returns (matching, nonmatching).
// REQUIRES: x is a dict or a list (otherwise ValueError, as upstream).
std::pair<Value, Value> extract_matching_values(const Value& x,
                                                const std::function<bool(const Value&)>& predicate,
                                                bool return_lists_as_dicts = false);

// Mirrors dict_utils.py nested_values(): leaves depth-first in dict and list order, each with
// its key path.
std::vector<std::pair<KeyPath, Value>> nested_items(const Value& x);
std::vector<Value> nested_values(const Value& x);

// Mirrors dict_utils.py dict_list_map_inplace(): replaces every leaf by f(leaf) in place.
void dict_list_map_inplace(const std::function<Value(const Value&)>& f, Value& x);

// Mirrors utils.py extract_sharded_base(): (ShardedBase leaves, everything else).
std::pair<Value, Value> extract_sharded_base(const Value& sharded_state_dict);
// Mirrors utils.py extract_nonpersistent(): (LNO leaves, everything else).
std::pair<Value, Value> extract_nonpersistent(const Value& sharded_state_dict);

}  // namespace ckptsim::model
