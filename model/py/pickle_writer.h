// PickleWriter: the bytes of a Python pickle written opcode by opcode as CPython's
// Lib/pickle.py _Pickler writes them, so that real Python (pickle.load, torch.load) builds
// from them the objects Python itself would have pickled: real tuples as dict keys, globals
// such as torch.bfloat16 or a class, dataclass objects (NEWOBJ then BUILD), persistent ids
// (torch.save's storages). It is the writer of the exchange format (torch_dist, see
// model/torch/torch_save_format.h torch_save() and model/torch/distributed_checkpoint.h);
// model/py/pickle_tree.h reads back what it writes.
//
// Why not model/py/pickle_codec.h: that codec pickles through libtorch's IValue pickler,
// which can neither hash a tuple key nor name a global that is no IValue (a dtype, a class);
// it writes them as strings (lossy), which real Megatron cannot use (its
// optimizer.param_state and per_bucket_numel are keyed by (torch.bfloat16, torch.float32)).
// pickle_codec stays the model's own format (fast, read by libtorch); this writer does only
// what the exchange format needs, with nothing of libtorch.
//
// Protocols: 2 (what torch.save writes in data.pkl: GLOBAL, BINUNICODE, BINPUT) and 4 (what
// pickle.dump writes by default in Python 3.8-3.13, torch.distributed.checkpoint's
// `.metadata`: STACK_GLOBAL, SHORT_BINUNICODE, MEMOIZE, FRAME).
//
// Invariants:
//   1. Every opcode written is one CPython's pickler writes for the same object at the same
//      protocol; a str and a global are memoized once and fetched (BINGET) afterwards, as
//      CPython does for interned strings and for classes.
//   2. The writer keeps no object graph: the caller says what to build in pickle order
//      (items, then the tuple; a container, memoize, then its items). Stack balance is checked
//      on finish(): exactly one object left and no open MARK, else InvariantViolation (a bug
//      of the caller, never of user input).
//   3. Protocol 4 output is framed as CPython frames it: FRAME headers at opcode boundaries,
//      a new frame once the current one holds kPickleFrameBytesTarget bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace ckptsim::model {

inline constexpr size_t kPickleFrameBytesTarget = 64 * 1024;  // pickle.py _FRAME_SIZE_TARGET

class PickleWriter {
 public:
  // REQUIRES: protocol is 2 or 4.
  explicit PickleWriter(int protocol);

  void none();
  void boolean(bool b);
  void integer(int64_t i);
  void floating(double d);
  void str(const std::string& s);  // memoized: a second equal str is a memo fetch
  // module.name, e.g. ("torch", "bfloat16"), ("torch.optim.adamw", "AdamW"); memoized.
  void global(const std::string& module, const std::string& name);

  void mark();
  // After `n` items (preceded by mark() when n > 3): () or the tuple; memoized when n > 0.
  // Returns the memo index (kNoMemo for the empty tuple).
  size_t tuple(size_t n);
  static constexpr size_t kNoMemo = SIZE_MAX;
  size_t empty_list();  // memoized; returns the memo index
  size_t empty_dict();  // memoized; returns the memo index
  // After mark() and the items: APPENDS (or APPEND when `n` == 1; nothing when 0, and the
  // caller then writes no mark).
  void appends(size_t n);
  // After mark() and the key/value pairs: SETITEMS (or SETITEM when `n` == 1; nothing when 0).
  void setitems(size_t n);
  void reduce();     // callable, args tuple -> callable(*args); the caller memoizes
  void newobj();     // class, args tuple -> cls.__new__(cls, *args); the caller memoizes
  void build();      // object, state -> object with state set
  void binpersid();  // pid -> persistent_load(pid)

  // Memoizes the object on top of the stack; returns its memo index.
  size_t memoize();
  // Pushes the memoized object `index`.
  void get(size_t index);

  // STOP; returns the pickle. The writer is spent afterwards.
  std::vector<char> finish();

 private:
  void op(char code);
  void raw(const void* data, size_t n);
  void u32(uint32_t v);
  void push(int n);  // stack bookkeeping for invariant 2

  int protocol_;
  std::vector<char> body_;                 // opcodes after PROTO
  std::vector<size_t> boundaries_;         // offsets in body_ where an opcode starts
  std::map<std::string, size_t> strs_;     // str -> memo index
  std::map<std::string, size_t> globals_;  // "module\nname" -> memo index
  size_t memo_size_ = 0;
  int64_t depth_ = 0;           // objects on the stack above the last mark
  std::vector<int64_t> marks_;  // depth at each open mark
  bool finished_ = false;
};

}  // namespace ckptsim::model
