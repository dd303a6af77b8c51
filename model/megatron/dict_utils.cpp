#include "model/megatron/dict_utils.h"

#include <algorithm>

#include "model/errors.h"
#include "model/megatron/mapping.h"

namespace ckptsim::model {

namespace {

// RX-MILES dict_utils.py _is_optimizer_param_state_key(): 'optimizer' then later 'param_state'.
bool is_optimizer_param_state_key(const KeyPath& key) {
  auto opt = std::find(key.begin(), key.end(), Key("optimizer"));
  if (opt == key.end()) return false;
  return std::find(opt + 1, key.end(), Key("param_state")) != key.end();
}

KeyPath extend(const KeyPath& key, const Key& k) {
  KeyPath out = key;
  out.push_back(k);
  return out;
}

}  // namespace

Value merge(Value x1, const Value& x2, const MergeOptions& options, const KeyPath& key) {
  if (x1.is_dict() && x2.is_dict()) {
    const DictPtr& d1 = x1.dict();
    // Iterate over a snapshot of x2's items: when x1 and x2 share subtrees, x2 may change.
    const std::vector<Dict::Item> items(x2.dict()->begin(), x2.dict()->end());
    for (const auto& [k, v2] : items) {
      if (Value* v1 = d1->find(k)) {
        Value merged = merge(*v1, v2, options, extend(key, k));
        d1->set(k, std::move(merged));
      } else {
        d1->set(k, v2);
      }
    }
    return x1;
  }
  if (x1.is_list() && x2.is_list()) {
    const ListPtr& l1 = x1.list();
    const ListPtr& l2 = x2.list();
    if (l1->size() != l2->size()) {
      if (options.truncate_optimizer_param_state_lists && is_optimizer_param_state_key(key) &&
          l1->size() > l2->size()) {
        l1->truncate(l2->size());
      } else {
        throw MergeError(MergeError::Kind::kListLengthMismatch, key,
                         "Cannot merge two lists with different lengths (" +
                             std::to_string(l1->size()) + " and " + std::to_string(l2->size()) +
                             ", encountered at level " + repr(key) + ")");
      }
    }
    const std::vector<Value> items(l2->begin(), l2->end());
    for (size_t i = 0; i < items.size(); ++i) {
      Value merged = merge(l1->at(i), items[i], options, extend(key, static_cast<int64_t>(i)));
      l1->at(i) = std::move(merged);
    }
    return x1;
  }
  throw MergeError(MergeError::Kind::kDuplicateLeaf, key,
                   "Duplicate non-dict and non-list values encountered: `" + x1.repr() + "` and `" +
                       x2.repr() + "` (at level " + repr(key) + ")");
}

std::pair<Value, Value> extract_matching_values(const Value& x,
                                                const std::function<bool(const Value&)>& predicate,
                                                bool return_lists_as_dicts) {
  if (x.is_dict()) {
    auto matching = Dict::make();
    auto nonmatching = Dict::make();
    // x's keys are distinct, so each goes into a dict that does not hold it yet.
    for (const auto& [k, v] : *x.dict()) {
      if (v.is_container()) {
        auto [match, nonmatch] = extract_matching_values(v, predicate, return_lists_as_dicts);
        if (!match.container_empty()) matching->set_new(k, match);
        if (!nonmatch.container_empty() || v.container_empty()) nonmatching->set_new(k, nonmatch);
      } else if (predicate(v)) {
        matching->set_new(k, v);
      } else {
        nonmatching->set_new(k, v);
      }
    }
    return {Value(matching), Value(nonmatching)};
  }
  if (x.is_list()) {
    Value matching = return_lists_as_dicts ? Value(Dict::make()) : Value(List::make());
    Value nonmatching = return_lists_as_dicts ? Value(Dict::make()) : Value(List::make());
    auto set_elem = [&](Value& target, size_t ind, Value v) {
      if (return_lists_as_dicts) {
        target.dict()->set_new(static_cast<int64_t>(ind), std::move(v));  // ind only grows
      } else {
        target.list()->append(std::move(v));
      }
    };
    size_t ind = 0;
    for (const auto& v : *x.list()) {
      if (v.is_container() && !v.container_empty()) {
        auto [match, nonmatch] = extract_matching_values(v, predicate, return_lists_as_dicts);
        if (!match.container_empty()) set_elem(matching, ind, match);
        if (!nonmatch.container_empty()) set_elem(nonmatching, ind, nonmatch);
      } else {
        set_elem(predicate(v) ? matching : nonmatching, ind, v);
      }
      ++ind;
    }
    return {matching, nonmatching};
  }
  throw UpstreamError("ValueError",
                      "Unexpected top-level object type: <class '" + x.type_name() + "'>",
                      "dict_utils.py extract_matching_values()");
}

namespace {

void collect(const Value& x, KeyPath& path, std::vector<std::pair<KeyPath, Value>>& out) {
  if (x.is_dict()) {
    for (const auto& [k, v] : *x.dict()) {
      path.push_back(k);
      collect(v, path, out);
      path.pop_back();
    }
  } else if (x.is_list()) {
    int64_t i = 0;
    for (const auto& v : *x.list()) {
      path.emplace_back(i++);
      collect(v, path, out);
      path.pop_back();
    }
  } else {
    out.emplace_back(path, x);
  }
}

}  // namespace

std::vector<std::pair<KeyPath, Value>> nested_items(const Value& x) {
  std::vector<std::pair<KeyPath, Value>> out;
  KeyPath path;
  collect(x, path, out);
  return out;
}

std::vector<Value> nested_values(const Value& x) {
  std::vector<Value> out;
  for (auto& [path, v] : nested_items(x)) out.push_back(std::move(v));
  return out;
}

void dict_list_map_inplace(const std::function<Value(const Value&)>& f, Value& x) {
  if (x.is_dict()) {
    for (auto& item : *x.dict()) dict_list_map_inplace(f, item.second);
  } else if (x.is_list()) {
    for (auto& v : *x.list()) dict_list_map_inplace(f, v);
  } else {
    x = f(x);
  }
}

std::pair<Value, Value> extract_sharded_base(const Value& sharded_state_dict) {
  return extract_matching_values(sharded_state_dict,
                                 [](const Value& v) { return v.is_sharded_base(); });
}

std::pair<Value, Value> extract_nonpersistent(const Value& sharded_state_dict) {
  return extract_matching_values(sharded_state_dict,
                                 [](const Value& v) { return v.is_nonpersistent(); });
}

}  // namespace ckptsim::model
