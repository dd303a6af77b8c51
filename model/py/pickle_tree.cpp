#include "model/py/pickle_tree.h"

#include <fmt/format.h>

#include <bit>
#include <cstring>
#include <map>
#include <utility>

#include "model/py/key.h"

namespace ckptsim::model {

namespace {

struct PickleError {
  std::string message;
};

using Kind = PickleNode::Kind;

PickleNode make_node(Kind kind, std::string text = {}, std::vector<PickleNodeId> items = {}) {
  PickleNode n;
  n.kind = kind;
  n.text = std::move(text);
  n.items = std::move(items);
  return n;
}

// Mirrors CPython Lib/pickle.py _Unpickler: the dispatch table restricted to the opcodes
// below, with the stack, the mark stack (as positions in the stack) and the memo.
class Unpickler {
 public:
  Unpickler(std::span<const char> bytes, const PickleTreeOptions& options)
      : bytes_(bytes), options_(options) {}

  PickleTree run() {
    while (true) {
      const size_t at = pos_;
      const auto op = static_cast<unsigned char>(take(1)[0]);
      if (op == '.') break;  // STOP
      dispatch(op, at);
    }
    if (!marks_.empty() || stack_.size() != 1) {
      fail(fmt::format("STOP with {} stack items and {} open marks", stack_.size(), marks_.size()));
    }
    if (pos_ != bytes_.size()) fail(fmt::format("{} bytes after STOP", bytes_.size() - pos_));
    tree_.root = stack_.back();
    return std::move(tree_);
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw PickleError{fmt::format("{} (at byte {})", what, pos_)};
  }

  std::span<const char> take(size_t n) {
    if (n > bytes_.size() - pos_) {
      fail(fmt::format("truncated: {} bytes needed, {} left", n, bytes_.size() - pos_));
    }
    std::span<const char> out = bytes_.subspan(pos_, n);
    pos_ += n;
    return out;
  }

  uint64_t take_le(size_t n) {
    const std::span<const char> b = take(n);
    uint64_t v = 0;
    for (size_t i = 0; i < n; ++i) v |= uint64_t{static_cast<unsigned char>(b[i])} << (8 * i);
    return v;
  }

  std::string take_text(size_t n) {
    const std::span<const char> b = take(n);
    return std::string(b.begin(), b.end());
  }

  std::string take_line() {
    const size_t start = pos_;
    while (pos_ < bytes_.size() && bytes_[pos_] != '\n') ++pos_;
    if (pos_ == bytes_.size()) fail("truncated: a GLOBAL line without its newline");
    std::string line(bytes_.begin() + static_cast<ptrdiff_t>(start),
                     bytes_.begin() + static_cast<ptrdiff_t>(pos_));
    ++pos_;
    return line;
  }

  PickleNodeId add(PickleNode node) {
    if (tree_.nodes.size() >= kPickleTreeNodesMax) {
      fail(fmt::format("more than kPickleTreeNodesMax={} objects", kPickleTreeNodesMax));
    }
    tree_.nodes.push_back(std::move(node));
    return static_cast<PickleNodeId>(tree_.nodes.size() - 1);
  }

  void push(PickleNodeId id) {
    if (stack_.size() + marks_.size() >= kPickleTreeStackMax) {
      fail(fmt::format("stack deeper than kPickleTreeStackMax={}", kPickleTreeStackMax));
    }
    stack_.push_back(id);
  }
  void push_new(PickleNode node) { push(add(std::move(node))); }

  size_t stack_floor() const { return marks_.empty() ? 0 : marks_.back(); }

  PickleNodeId pop() {
    if (stack_.size() <= stack_floor()) fail("stack underflow");
    const PickleNodeId id = stack_.back();
    stack_.pop_back();
    return id;
  }

  PickleNodeId top() {
    if (stack_.size() <= stack_floor()) fail("stack underflow");
    return stack_.back();
  }

  std::vector<PickleNodeId> pop_mark() {
    if (marks_.empty()) fail("no MARK to pop to");
    const size_t mark = marks_.back();
    marks_.pop_back();
    std::vector<PickleNodeId> items(stack_.begin() + static_cast<ptrdiff_t>(mark), stack_.end());
    stack_.resize(mark);
    return items;
  }

  PickleNode& node(PickleNodeId id) { return tree_.nodes[id]; }

  void dispatch(unsigned char op, size_t at);
  void dispatch_scalar(unsigned char op, size_t at);
  void dispatch_container(unsigned char op, size_t at);
  void dispatch_object(unsigned char op, size_t at);

  void push_int(int64_t v) {
    push_new([&] {
      PickleNode n = make_node(Kind::kInt);
      n.integer = v;
      return n;
    }());
  }
  void push_text(Kind kind, std::string text) { push_new(make_node(kind, std::move(text))); }
  void push_tuple(std::vector<PickleNodeId> items) {
    push_new(make_node(Kind::kTuple, {}, std::move(items)));
  }
  void push_long(size_t n);
  void push_global(std::string module, std::string name);
  void set_items(PickleNodeId dict, const std::vector<PickleNodeId>& kv);
  void append_items(PickleNodeId list, const std::vector<PickleNodeId>& items);
  void make_object(bool reduce);
  void build();
  void memo_put(uint64_t index);
  void memo_get(uint64_t index);

  std::span<const char> bytes_;
  const PickleTreeOptions& options_;
  size_t pos_ = 0;
  PickleTree tree_;
  std::vector<PickleNodeId> stack_;
  std::vector<size_t> marks_;
  std::map<uint64_t, PickleNodeId> memo_;
};

void Unpickler::dispatch(unsigned char op, size_t at) {
  switch (op) {
    case 0x80: {  // PROTO
      const auto proto = static_cast<unsigned char>(take(1)[0]);
      if (proto < 2 || proto > 5) fail(fmt::format("unsupported pickle protocol {}", proto));
      return;
    }
    case 0x95:  // FRAME: a length hint only
      take(8);
      return;
    case '(':  // MARK
      if (stack_.size() + marks_.size() >= kPickleTreeStackMax) fail("too many MARKs");
      marks_.push_back(stack_.size());
      return;
    case '0':  // POP
      pop();
      return;
    case '1':  // POP_MARK
      pop_mark();
      return;
    case '2':  // DUP
      push(top());
      return;
    case 'q':  // BINPUT
      return memo_put(take_le(1));
    case 'r':  // LONG_BINPUT
      return memo_put(take_le(4));
    case 0x94:  // MEMOIZE
      return memo_put(memo_.size());
    case 'h':  // BINGET
      return memo_get(take_le(1));
    case 'j':  // LONG_BINGET
      return memo_get(take_le(4));
    default:
      return dispatch_scalar(op, at);
  }
}

void Unpickler::dispatch_scalar(unsigned char op, size_t at) {
  switch (op) {
    case 'N':
      return push_new(make_node(Kind::kNone));
    case 0x88:  // NEWTRUE
    case 0x89:  // NEWFALSE
      return push_new([&] {
        PickleNode n = make_node(Kind::kBool);
        n.boolean = op == 0x88;
        return n;
      }());
    case 'J':  // BININT
      return push_int(static_cast<int32_t>(static_cast<uint32_t>(take_le(4))));
    case 'K':  // BININT1
      return push_int(static_cast<int64_t>(take_le(1)));
    case 'M':  // BININT2
      return push_int(static_cast<int64_t>(take_le(2)));
    case 0x8a:  // LONG1
      return push_long(take_le(1));
    case 0x8b:  // LONG4
      return push_long(take_le(4));
    case 'G': {  // BINFLOAT: big-endian IEEE 754 double
      const std::span<const char> b = take(8);
      uint64_t bits = 0;
      for (size_t i = 0; i < 8; ++i) bits = (bits << 8) | static_cast<unsigned char>(b[i]);
      return push_new([&] {
        PickleNode n = make_node(Kind::kFloat);
        n.floating = std::bit_cast<double>(bits);
        return n;
      }());
    }
    case 'X':  // BINUNICODE
      return push_text(Kind::kStr, take_text(take_le(4)));
    case 0x8c:  // SHORT_BINUNICODE
      return push_text(Kind::kStr, take_text(take_le(1)));
    case 0x8d:  // BINUNICODE8
      return push_text(Kind::kStr, take_text(take_le(8)));
    case 'B':  // BINBYTES
      return push_text(Kind::kBytes, take_text(take_le(4)));
    case 'C':  // SHORT_BINBYTES
      return push_text(Kind::kBytes, take_text(take_le(1)));
    case 0x8e:  // BINBYTES8
      return push_text(Kind::kBytes, take_text(take_le(8)));
    default:
      return dispatch_container(op, at);
  }
}

void Unpickler::dispatch_container(unsigned char op, size_t at) {
  switch (op) {
    case ')':  // EMPTY_TUPLE
      return push_tuple({});
    case 't':  // TUPLE
      return push_tuple(pop_mark());
    case 0x85:    // TUPLE1
    case 0x86:    // TUPLE2
    case 0x87: {  // TUPLE3
      std::vector<PickleNodeId> items(op - 0x84);
      for (size_t i = items.size(); i > 0; --i) items[i - 1] = pop();
      return push_tuple(std::move(items));
    }
    case ']':  // EMPTY_LIST
      return push_new(make_node(Kind::kList));
    case 'l':  // LIST
      return push_new(make_node(Kind::kList, {}, pop_mark()));
    case 'a': {  // APPEND
      const PickleNodeId item = pop();
      return append_items(top(), {item});
    }
    case 'e': {  // APPENDS
      const std::vector<PickleNodeId> items = pop_mark();
      return append_items(top(), items);
    }
    case '}':  // EMPTY_DICT
      return push_new(make_node(Kind::kDict));
    case 'd': {  // DICT
      const std::vector<PickleNodeId> kv = pop_mark();
      push_new(make_node(Kind::kDict));
      return set_items(top(), kv);
    }
    case 's': {  // SETITEM
      const PickleNodeId value = pop();
      const PickleNodeId key = pop();
      return set_items(top(), {key, value});
    }
    case 'u': {  // SETITEMS
      const std::vector<PickleNodeId> kv = pop_mark();
      return set_items(top(), kv);
    }
    default:
      return dispatch_object(op, at);
  }
}

void Unpickler::dispatch_object(unsigned char op, size_t at) {
  switch (op) {
    case 'c': {  // GLOBAL
      std::string module = take_line();
      return push_global(std::move(module), take_line());
    }
    case 0x93: {  // STACK_GLOBAL
      const PickleNodeId name = pop();
      const PickleNodeId module = pop();
      if (node(name).kind != Kind::kStr || node(module).kind != Kind::kStr) {
        fail("STACK_GLOBAL of a non-str module or name");
      }
      return push_global(node(module).text, node(name).text);
    }
    case 'R':  // REDUCE
      return make_object(true);
    case 0x81:  // NEWOBJ
      return make_object(false);
    case 'b':  // BUILD
      return build();
    case 'Q': {  // BINPERSID
      const PickleNodeId pid = pop();
      return push_new(make_node(Kind::kPersistent, {}, {pid}));
    }
    default:
      pos_ = at;
      fail(fmt::format("unsupported pickle opcode 0x{:02x}", op));
  }
}

void Unpickler::push_long(size_t n) {
  if (n > kPickleIntBytesMax) {
    fail(fmt::format("an int of {} bytes (kPickleIntBytesMax={})", n, kPickleIntBytesMax));
  }
  uint64_t v = take_le(n);
  // Two's complement of n bytes, sign-extended to 64 bits.
  if (n > 0 && n < 8 && (v >> (8 * n - 1)) != 0) v |= ~uint64_t{0} << (8 * n);
  push_int(static_cast<int64_t>(v));
}

void Unpickler::push_global(std::string module, std::string name) {
  std::string full = module + "." + name;
  if (!options_.allowed_globals.contains(full)) fail("unknown pickle class " + py_str_repr(full));
  push_text(Kind::kGlobal, std::move(full));
}

void Unpickler::set_items(PickleNodeId dict, const std::vector<PickleNodeId>& kv) {
  if (node(dict).kind != Kind::kDict) fail("SETITEM(S) on " + tree_.describe(dict));
  if (kv.size() % 2 != 0) fail("SETITEMS with an odd number of items");
  for (const PickleNodeId id : kv) node(dict).items.push_back(id);
}

void Unpickler::append_items(PickleNodeId list, const std::vector<PickleNodeId>& items) {
  if (node(list).kind != Kind::kList) fail("APPEND(S) on " + tree_.describe(list));
  for (const PickleNodeId id : items) node(list).items.push_back(id);
}

void Unpickler::make_object(bool reduce) {
  const PickleNodeId args = pop();
  const PickleNodeId callable = pop();
  const char* op = reduce ? "REDUCE" : "NEWOBJ";
  if (node(callable).kind != Kind::kGlobal) fail(fmt::format("{} of a non-class", op));
  if (node(args).kind != Kind::kTuple) fail(fmt::format("{} with non-tuple arguments", op));
  if (node(callable).text == "collections.OrderedDict") {
    if (!node(args).items.empty()) fail("collections.OrderedDict with arguments");
    return push_new(make_node(Kind::kDict));  // invariant 1
  }
  push_new(make_node(Kind::kObject, node(callable).text, {args}));
}

void Unpickler::build() {
  const PickleNodeId state = pop();
  const PickleNodeId target = top();
  if (node(target).kind != Kind::kObject) fail("BUILD on " + tree_.describe(target));
  if (node(target).state != PickleNode::kNoState) fail("a second BUILD of one object");
  node(target).state = state;
}

void Unpickler::memo_put(uint64_t index) {
  if (memo_.size() >= kPickleTreeMemoMax && !memo_.contains(index)) {
    fail(fmt::format("more than kPickleTreeMemoMax={} memo entries", kPickleTreeMemoMax));
  }
  memo_[index] = top();
}

void Unpickler::memo_get(uint64_t index) {
  const auto it = memo_.find(index);
  if (it == memo_.end()) fail(fmt::format("memo entry {} read before it was written", index));
  push(it->second);
}

// Invariant 4: no cycle, no nesting deeper than kPickleTreeDepthMax. Depth-first with the
// depth bounded by the limit, so the recursion is too; each node's depth is computed once.
class GraphCheck {
 public:
  explicit GraphCheck(const PickleTree& tree) : tree_(tree), depth_(tree.nodes.size(), kUnknown) {}

  void check(PickleNodeId id, size_t level) {
    if (level > kPickleTreeDepthMax) {
      throw PickleError{
          fmt::format("objects nested deeper than kPickleTreeDepthMax={}", kPickleTreeDepthMax)};
    }
    if (depth_[id] == kOnPath) throw PickleError{"an object that contains itself"};
    if (depth_[id] != kUnknown && level + depth_[id] <= kPickleTreeDepthMax) return;
    depth_[id] = kOnPath;
    size_t deepest = 0;
    for (const PickleNodeId child : children(id)) {
      check(child, level + 1);
      deepest = std::max(deepest, depth_[child] + 1);
    }
    depth_[id] = deepest;
  }

 private:
  static constexpr size_t kUnknown = SIZE_MAX;
  static constexpr size_t kOnPath = SIZE_MAX - 1;

  std::vector<PickleNodeId> children(PickleNodeId id) const {
    const PickleNode& n = tree_.at(id);
    std::vector<PickleNodeId> out = n.items;
    if (n.state != PickleNode::kNoState) out.push_back(n.state);
    return out;
  }

  const PickleTree& tree_;
  std::vector<size_t> depth_;
};

}  // namespace

std::string PickleTree::describe(PickleNodeId id) const {
  const PickleNode& n = at(id);
  switch (n.kind) {
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return "a bool";
    case Kind::kInt:
      return "an int";
    case Kind::kFloat:
      return "a float";
    case Kind::kStr:
      return "a str";
    case Kind::kBytes:
      return "bytes";
    case Kind::kTuple:
      return "a tuple";
    case Kind::kList:
      return "a list";
    case Kind::kDict:
      return "a dict";
    case Kind::kGlobal:
      return "the class " + n.text;
    case Kind::kObject:
      return "a " + n.text + " object";
    case Kind::kPersistent:
      return "a persistent id";
  }
  return "an object";
}

Result<PickleTree> read_pickle_tree(std::span<const char> bytes, const PickleTreeOptions& options) {
  if (bytes.size() > kPickleTreeBytesMax) {
    return Status::corruption(fmt::format("pickle of {} bytes, over kPickleTreeBytesMax={}",
                                          bytes.size(), kPickleTreeBytesMax));
  }
  try {
    PickleTree tree = Unpickler(bytes, options).run();
    GraphCheck(tree).check(tree.root, 0);
    return tree;
  } catch (const PickleError& e) {
    return Status::corruption("pickle: " + e.message);
  }
}

}  // namespace ckptsim::model
