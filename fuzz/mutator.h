// A deterministic byte mutator for the test suite's short fuzz run
// (tests/fuzz/fuzz_short_run_test.cpp): the same seed gives the same mutants on every machine,
// so a failure there is replayed by running the test again. libFuzzer (scripts/fuzz.sh) does the
// coverage-guided search; this one only stacks the kinds of edit that found the readers' bugs so
// far (a byte or an integer set to a boundary value, a newline or quote in a name, a range cut,
// repeated or spliced in from another seed) on the real seeds.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ckptsim::fuzz {

class Mutator {
 public:
  explicit Mutator(uint64_t seed) : state_(seed) {}

  // One mutant of seeds[i] for some i: 1 to 4 edits, some of which splice in another seed.
  // REQUIRES: seeds is not empty.
  std::string mutant(const std::vector<std::string>& seeds) {
    std::string s = seeds[below(seeds.size())];
    const uint64_t edits = 1 + below(4);
    for (uint64_t i = 0; i < edits; ++i) edit(s, seeds);
    return s;
  }

  uint64_t next() {  // splitmix64
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // REQUIRES: n > 0.
  uint64_t below(uint64_t n) { return next() % n; }

 private:
  static constexpr char kBytes[] = {'\0', '\x01', '\x7f', '\x80', '\xff', '\n', '\r', '\'',
                                    '"',  '\\',   '{',    '[',    '.',    '0',  '9',  ' '};

  char interesting_byte() { return kBytes[below(sizeof kBytes)]; }

  uint64_t interesting_integer(size_t text_size) {
    const uint64_t values[] = {0,
                               1,
                               0x7f,
                               0x80,
                               0xff,
                               0x7fff,
                               0xffff,
                               0x7fffffff,
                               0x80000000,
                               0xffffffff,
                               ~uint64_t{0},
                               uint64_t{1} << 40,
                               text_size,
                               text_size + 1};
    return values[below(sizeof values / sizeof values[0])];
  }

  void edit(std::string& s, const std::vector<std::string>& seeds) {
    if (s.empty()) {
      s.push_back(interesting_byte());
      return;
    }
    const size_t at = below(s.size());
    switch (below(9)) {
      case 0:  // flip a bit
        s[at] = static_cast<char>(s[at] ^ (1 << below(8)));
        break;
      case 1:  // a boundary byte, or a newline or quote inside a name
        s[at] = interesting_byte();
        break;
      case 2:  // cut a range
        s.erase(at, 1 + below(std::min<size_t>(16, s.size() - at)));
        break;
      case 3:  // insert a few bytes
        for (uint64_t n = 1 + below(8); n > 0; --n) s.insert(s.begin() + at, interesting_byte());
        break;
      case 4:  // repeat a range elsewhere
        s.insert(below(s.size() + 1), s.substr(at, 1 + below(64)));
        break;
      case 5: {  // a boundary integer, little-endian, over 1, 2, 4 or 8 bytes
        const uint64_t v = interesting_integer(s.size());
        const size_t width = size_t{1} << below(4);
        for (size_t b = 0; b < width && at + b < s.size(); ++b) {
          s[at + b] = static_cast<char>((v >> (8 * b)) & 0xff);
        }
        break;
      }
      case 6:  // truncate
        s.resize(at);
        break;
      case 7: {  // splice: this seed's head, another one's tail
        const std::string& other = seeds[below(seeds.size())];
        s = s.substr(0, at) + other.substr(below(other.size() + 1));
        break;
      }
      default:  // another digit, where there is one (JSON numbers, pickle text)
        for (size_t i = 0; i < s.size(); ++i) {
          char& c = s[(at + i) % s.size()];
          if (c >= '0' && c <= '9') {
            c = static_cast<char>('0' + below(10));
            break;
          }
        }
    }
  }

  uint64_t state_;
};

}  // namespace ckptsim::fuzz
