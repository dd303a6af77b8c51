// TensorMap<V>: a Python dict keyed by tensors — by object identity, in insertion order.
//
// Upstream keys several dicts by tensor objects (optimizer.state, HDO's param_to_fp32_param,
// inner_param_to_orig_param, ...). Python hashes a tensor by id(), so two views of the same
// storage are different keys and a tensor key keeps its object alive.
// Invariants:
//   1. Iteration order is insertion order (never address order).
//   2. A key is held by a strong reference, so its TensorImpl address cannot be reused while
//      it is in the map; the address index is used for lookup only.
#pragma once

#include <ATen/core/Tensor.h>

#include <unordered_map>
#include <utility>
#include <vector>

#include "model/errors.h"

namespace ckptsim::model {

template <typename V>
class TensorMap {
 public:
  using Item = std::pair<at::Tensor, V>;

  size_t size() const { return items_.size(); }
  bool empty() const { return items_.empty(); }
  bool contains(const at::Tensor& k) const { return index_.count(id(k)) != 0; }

  V* find(const at::Tensor& k) {
    auto it = index_.find(id(k));
    return it == index_.end() ? nullptr : &items_[it->second].second;
  }
  const V* find(const at::Tensor& k) const {
    auto it = index_.find(id(k));
    return it == index_.end() ? nullptr : &items_[it->second].second;
  }
  // m[k]; throws PyKeyError when missing (Python KeyError on a dict).
  V& at(const at::Tensor& k, const char* site) {
    V* v = find(k);
    if (v == nullptr) throw PyKeyError("<Tensor>", site);
    return *v;
  }
  const V& at(const at::Tensor& k, const char* site) const {
    const V* v = find(k);
    if (v == nullptr) throw PyKeyError("<Tensor>", site);
    return *v;
  }
  void set(const at::Tensor& k, V v) {
    if (V* existing = find(k)) {
      *existing = std::move(v);
      return;
    }
    CKPTSIM_CHECK(k.defined(), "TensorMap key must be a defined tensor");
    index_.emplace(id(k), items_.size());
    items_.emplace_back(k, std::move(v));
  }
  // defaultdict access: inserts make() when missing.
  template <typename Make>
  V& get_or_insert(const at::Tensor& k, Make make) {
    if (V* existing = find(k)) return *existing;
    set(k, make());
    return items_.back().second;
  }

  typename std::vector<Item>::iterator begin() { return items_.begin(); }
  typename std::vector<Item>::iterator end() { return items_.end(); }
  typename std::vector<Item>::const_iterator begin() const { return items_.begin(); }
  typename std::vector<Item>::const_iterator end() const { return items_.end(); }

 private:
  static const void* id(const at::Tensor& t) { return t.unsafeGetTensorImpl(); }
  std::vector<Item> items_;
  std::unordered_map<const void*, size_t> index_;  // lookup only
};

}  // namespace ckptsim::model
