#include "model/py/pickle_writer.h"

#include <bit>
#include <cstring>

#include "model/errors.h"

namespace ckptsim::model {

namespace {

// Opcodes of Lib/pickle.py.
constexpr char kMark = '(';
constexpr char kStop = '.';
constexpr char kNone = 'N';
constexpr char kNewTrue = '\x88';
constexpr char kNewFalse = '\x89';
constexpr char kBinInt = 'J';
constexpr char kBinInt1 = 'K';
constexpr char kBinInt2 = 'M';
constexpr char kLong1 = '\x8a';
constexpr char kBinFloat = 'G';
constexpr char kBinUnicode = 'X';
constexpr char kShortBinUnicode = '\x8c';
constexpr char kGlobal = 'c';
constexpr char kStackGlobal = '\x93';
constexpr char kEmptyTuple = ')';
constexpr char kTuple = 't';
constexpr char kTuple1 = '\x85';
constexpr char kTuple2 = '\x86';
constexpr char kTuple3 = '\x87';
constexpr char kEmptyList = ']';
constexpr char kAppend = 'a';
constexpr char kAppends = 'e';
constexpr char kEmptyDict = '}';
constexpr char kSetItem = 's';
constexpr char kSetItems = 'u';
constexpr char kReduce = 'R';
constexpr char kNewObj = '\x81';
constexpr char kBuild = 'b';
constexpr char kBinPersId = 'Q';
constexpr char kBinPut = 'q';
constexpr char kLongBinPut = 'r';
constexpr char kMemoize = '\x94';
constexpr char kBinGet = 'h';
constexpr char kLongBinGet = 'j';
constexpr char kProto = '\x80';
constexpr char kFrame = '\x95';

constexpr size_t kFrameBytesMin = 4;  // pickle.py _FRAME_SIZE_MIN: smaller frames get no header

static_assert(std::endian::native == std::endian::little, "pickles are written little-endian");

}  // namespace

PickleWriter::PickleWriter(int protocol) : protocol_(protocol) {
  CKPTSIM_CHECK(protocol == 2 || protocol == 4, "PickleWriter: protocol 2 or 4 only");
}

void PickleWriter::op(char code) {
  CKPTSIM_CHECK(!finished_, "PickleWriter used after finish()");
  boundaries_.push_back(body_.size());
  body_.push_back(code);
}

void PickleWriter::raw(const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  body_.insert(body_.end(), p, p + n);
}

void PickleWriter::u32(uint32_t v) { raw(&v, 4); }

void PickleWriter::push(int n) {
  depth_ += n;
  CKPTSIM_CHECK(depth_ >= 0, "PickleWriter: stack underflow");
  CKPTSIM_CHECK(marks_.empty() || depth_ >= marks_.back(), "PickleWriter: popped past a MARK");
}

void PickleWriter::none() {
  op(kNone);
  push(1);
}

void PickleWriter::boolean(bool b) {
  op(b ? kNewTrue : kNewFalse);
  push(1);
}

// pickle.py save_long for protocol >= 2.
void PickleWriter::integer(int64_t i) {
  if (i >= 0 && i <= 0xff) {
    op(kBinInt1);
    body_.push_back(static_cast<char>(i));
  } else if (i >= 0 && i <= 0xffff) {
    op(kBinInt2);
    const auto v = static_cast<uint16_t>(i);
    raw(&v, 2);
  } else if (i >= INT32_MIN && i <= INT32_MAX) {
    op(kBinInt);
    const auto v = static_cast<int32_t>(i);
    raw(&v, 4);
  } else {
    // encode_long: little-endian two's complement, as few bytes as keep the sign.
    std::vector<char> bytes;
    uint64_t u = static_cast<uint64_t>(i);
    for (int k = 0; k < 8; ++k) bytes.push_back(static_cast<char>((u >> (8 * k)) & 0xff));
    while (bytes.size() > 1) {
      const auto last = static_cast<unsigned char>(bytes.back());
      const auto prev = static_cast<unsigned char>(bytes[bytes.size() - 2]);
      const bool redundant = (last == 0x00 && !(prev & 0x80)) || (last == 0xff && (prev & 0x80));
      if (!redundant) break;
      bytes.pop_back();
    }
    op(kLong1);
    body_.push_back(static_cast<char>(bytes.size()));
    raw(bytes.data(), bytes.size());
  }
  push(1);
}

void PickleWriter::floating(double d) {
  op(kBinFloat);
  uint64_t bits = std::bit_cast<uint64_t>(d);
  for (int k = 7; k >= 0; --k) body_.push_back(static_cast<char>((bits >> (8 * k)) & 0xff));
  push(1);
}

void PickleWriter::str(const std::string& s) {
  if (const auto it = strs_.find(s); it != strs_.end()) {
    get(it->second);
    return;
  }
  CKPTSIM_CHECK(s.size() <= UINT32_MAX, "PickleWriter: a str over 4 GiB");
  if (protocol_ >= 4 && s.size() <= 0xff) {
    op(kShortBinUnicode);
    body_.push_back(static_cast<char>(s.size()));
  } else {
    op(kBinUnicode);
    u32(static_cast<uint32_t>(s.size()));
  }
  raw(s.data(), s.size());
  push(1);
  strs_.emplace(s, memoize());
}

void PickleWriter::global(const std::string& module, const std::string& name) {
  CKPTSIM_CHECK(!module.empty() && !name.empty() && module.find('\n') == std::string::npos &&
                    name.find('\n') == std::string::npos,
                "PickleWriter: a global needs a module and a name without newlines");
  const std::string key = module + "\n" + name;
  if (const auto it = globals_.find(key); it != globals_.end()) {
    get(it->second);
    return;
  }
  if (protocol_ >= 4) {
    str(module);
    str(name);
    op(kStackGlobal);
    push(-1);
  } else {
    op(kGlobal);
    raw(key.data(), key.size());
    body_.push_back('\n');
    push(1);
  }
  globals_.emplace(key, memoize());
}

void PickleWriter::mark() {
  op(kMark);
  marks_.push_back(depth_);
}

size_t PickleWriter::tuple(size_t n) {
  if (n == 0) {
    op(kEmptyTuple);  // pickle.py: the empty tuple is never memoized
    push(1);
    return kNoMemo;
  }
  if (n <= 3) {
    op(n == 1 ? kTuple1 : n == 2 ? kTuple2 : kTuple3);
    push(1 - static_cast<int>(n));
  } else {
    CKPTSIM_CHECK(!marks_.empty() && depth_ - marks_.back() == static_cast<int64_t>(n),
                  "PickleWriter: TUPLE without a MARK below its items");
    op(kTuple);
    depth_ = marks_.back() + 1;
    marks_.pop_back();
  }
  return memoize();
}

size_t PickleWriter::empty_list() {
  op(kEmptyList);
  push(1);
  return memoize();
}

size_t PickleWriter::empty_dict() {
  op(kEmptyDict);
  push(1);
  return memoize();
}

void PickleWriter::appends(size_t n) {
  if (n == 0) return;
  if (n == 1) {
    op(kAppend);
    push(-1);
    return;
  }
  CKPTSIM_CHECK(!marks_.empty() && depth_ - marks_.back() == static_cast<int64_t>(n),
                "PickleWriter: APPENDS without a MARK below its items");
  op(kAppends);
  depth_ = marks_.back();
  marks_.pop_back();
}

void PickleWriter::setitems(size_t n) {
  if (n == 0) return;
  if (n == 1) {
    op(kSetItem);
    push(-2);
    return;
  }
  CKPTSIM_CHECK(!marks_.empty() && depth_ - marks_.back() == static_cast<int64_t>(2 * n),
                "PickleWriter: SETITEMS without a MARK below its pairs");
  op(kSetItems);
  depth_ = marks_.back();
  marks_.pop_back();
}

void PickleWriter::reduce() {
  op(kReduce);
  push(-1);
}

void PickleWriter::newobj() {
  op(kNewObj);
  push(-1);
}

void PickleWriter::build() {
  op(kBuild);
  push(-1);
}

void PickleWriter::binpersid() {
  op(kBinPersId);
  push(0);
}

size_t PickleWriter::memoize() {
  CKPTSIM_CHECK(depth_ > 0, "PickleWriter: memoize with an empty stack");
  const size_t index = memo_size_++;
  if (protocol_ >= 4) {
    op(kMemoize);
  } else if (index <= 0xff) {
    op(kBinPut);
    body_.push_back(static_cast<char>(index));
  } else {
    CKPTSIM_CHECK(index <= UINT32_MAX, "PickleWriter: memo over 2^32 entries");
    op(kLongBinPut);
    u32(static_cast<uint32_t>(index));
  }
  return index;
}

void PickleWriter::get(size_t index) {
  CKPTSIM_CHECK(index < memo_size_, "PickleWriter: get of a memo index never set");
  if (index <= 0xff) {
    op(kBinGet);
    body_.push_back(static_cast<char>(index));
  } else {
    op(kLongBinGet);
    u32(static_cast<uint32_t>(index));
  }
  push(1);
}

std::vector<char> PickleWriter::finish() {
  op(kStop);
  finished_ = true;
  CKPTSIM_CHECK(depth_ == 1 && marks_.empty(),
                "PickleWriter: finish() with " + std::to_string(depth_) + " objects and " +
                    std::to_string(marks_.size()) + " open marks (one object, no mark expected)");
  std::vector<char> out;
  out.reserve(body_.size() + 2 + 9 * (1 + body_.size() / kPickleFrameBytesTarget));
  out.push_back(kProto);
  out.push_back(static_cast<char>(protocol_));
  if (protocol_ < 4) {
    for (const char c : body_) out.push_back(c);
    return out;
  }
  // Frames: cut at the first opcode boundary once a frame holds the target.
  size_t begin = 0;
  auto commit = [&](size_t end) {
    const uint64_t n = end - begin;
    if (n >= kFrameBytesMin) {
      out.push_back(kFrame);
      for (int k = 0; k < 8; ++k) out.push_back(static_cast<char>((n >> (8 * k)) & 0xff));
    }
    for (size_t i = begin; i < end; ++i) out.push_back(body_[i]);
    begin = end;
  };
  for (const size_t b : boundaries_) {
    if (b - begin >= kPickleFrameBytesTarget) commit(b);
  }
  commit(body_.size());
  return out;
}

}  // namespace ckptsim::model
