#include "model/py/key.h"

#include <stdexcept>

#include "model/errors.h"

namespace ckptsim::model {

Key Key::symbol(std::string name) {
  Key k;
  k.kind_ = Kind::kSymbol;
  k.str_ = std::move(name);
  return k;
}

Key Key::tuple(std::vector<Key> items) {
  Key k;
  k.kind_ = Kind::kTuple;
  k.items_ = new std::vector<Key>(std::move(items));
  return k;
}

int64_t Key::as_int() const {
  CKPTSIM_CHECK(kind_ == Kind::kInt, "Key::as_int on a non-int key " + repr());
  return int_;
}

const std::string& Key::as_str() const {
  CKPTSIM_CHECK(kind_ == Kind::kStr || kind_ == Kind::kSymbol,
                "Key::as_str on a non-str key " + repr());
  return str_;
}

const std::vector<Key>& Key::items() const {
  CKPTSIM_CHECK(kind_ == Kind::kTuple, "Key::items on a non-tuple key " + repr());
  return *items_;
}

std::string escape_control_characters(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (u < 0x20 || u == 0x7f) {
      constexpr char kHex[] = "0123456789abcdef";
      out += {'\\', 'x', kHex[u >> 4], kHex[u & 0xf]};
    } else {
      out.push_back(c);
    }
  }
  return out;
}

std::string py_str_repr(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char quote = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, quote);
  for (char c : s) {
    if (c == quote || c == '\\') {
      out += {'\\', c};
    } else {
      out += escape_control_characters(std::string_view(&c, 1));
    }
  }
  out.push_back(quote);
  return out;
}

std::string Key::repr() const {
  switch (kind_) {
    case Kind::kInt:
      return std::to_string(int_);
    case Kind::kStr:
      return py_str_repr(str_);
    case Kind::kSymbol:
      return str_;
    case Kind::kTuple: {
      std::string out = "(";
      for (size_t i = 0; i < items_->size(); ++i) {
        if (i > 0) out += ", ";
        out += (*items_)[i].repr();
      }
      if (items_->size() == 1) out += ",";
      return out + ")";
    }
  }
  return "?";
}

std::string Key::str() const { return kind_ == Kind::kStr ? str_ : repr(); }

bool operator<(const Key& a, const Key& b) {
  if (a.kind_ != b.kind_) return a.kind_ < b.kind_;
  switch (a.kind_) {
    case Key::Kind::kInt:
      return a.int_ < b.int_;
    case Key::Kind::kStr:
    case Key::Kind::kSymbol:
      return a.str_ < b.str_;
    case Key::Kind::kTuple:
      return *a.items_ < *b.items_;
  }
  return false;
}

std::string repr(const KeyPath& path) { return Key::tuple(path).repr(); }

}  // namespace ckptsim::model
