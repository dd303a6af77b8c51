// Revision profiles as data. Mutations caught: a switch default that is not POST's
// (DefaultsArePost); `extends` ignored (ExtendsInherits); unknown switch accepted
// (UnknownSwitchNamesFileAndField); no cycle detection (ExtendsCycleIsAnError, would recurse
// until the depth limit is hit — the message must say so).
#include <gtest/gtest.h>

#include <algorithm>

#include "model/revision.h"
#include "tests/json_nesting.h"

using namespace ckptsim::model;
using ckptsim::Status;

TEST(Revision, EmbeddedProfilesResolve) {
  auto reg = RevisionRegistry::load_embedded();
  ASSERT_TRUE(reg.is_ok()) << reg.status().to_string();
  for (const char* name : {"upstream-pre-2874", "upstream-2874", "upstream-head", "miles-main",
                           "pr69-graft", "fix-skip-step", "fix-drop-on-load", "fix-recommended"}) {
    auto p = reg.value().get(name);
    ASSERT_TRUE(p.is_ok()) << name << ": " << p.status().to_string();
    EXPECT_FALSE(p.value().description.empty()) << name;
  }
}

TEST(Revision, DefaultsArePost) {
  const RevisionSwitches s;
  EXPECT_EQ(s.sharded_step, ShardedStepMode::kNonpersistent);
  EXPECT_FALSE(s.omit_step_when_loading);
  EXPECT_FALSE(s.dp_reshardable_load_skips_step);
  EXPECT_FALSE(s.merge_truncates_param_state_lists);
  EXPECT_FALSE(s.hdo_group_sync_skips_step);
  EXPECT_EQ(s.hdo_step_source, HdoStepSource::kFirstCpuAdamW);
}

TEST(Revision, ExtendsInherits) {
  auto reg = RevisionRegistry::load_embedded();
  ASSERT_TRUE(reg.is_ok());
  auto rec = reg.value().get("fix-recommended");
  ASSERT_TRUE(rec.is_ok());
  // From miles-main through pr69-graft:
  EXPECT_TRUE(rec.value().switches.merge_truncates_param_state_lists);
  // pr69-graft overrides miles-main's raw step:
  EXPECT_EQ(rec.value().switches.sharded_step, ShardedStepMode::kNonpersistent);
  EXPECT_TRUE(rec.value().switches.omit_step_when_loading);
  EXPECT_TRUE(rec.value().switches.dp_reshardable_load_skips_step);
  auto miles = reg.value().get("miles-main");
  EXPECT_EQ(miles.value().switches.sharded_step, ShardedStepMode::kRawLeaf);
}

TEST(Revision, UnknownSwitchNamesFileAndField) {
  RevisionRegistry reg;
  Status s =
      reg.add(R"({"name": "x", "switches": {"omit_step_when_loadin": true}})", "my/graft.json");
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("my/graft.json"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("switches.omit_step_when_loadin"), std::string::npos) << s.message();
  Status t = reg.add(R"({"name": "y", "switches": {"sharded_step": "lno"}})", "f.json");
  ASSERT_FALSE(t.is_ok());
  EXPECT_NE(t.message().find("shape_assert, nonpersistent, raw_leaf"), std::string::npos)
      << t.message();
  Status u = reg.add(R"({"name": "z", "switches": {"allow_empty_bucket": 1}})", "g.json");
  EXPECT_FALSE(u.is_ok());
}

TEST(Revision, ExtendsCycleIsAnError) {
  RevisionRegistry reg;
  ASSERT_TRUE(reg.add(R"({"name": "a", "extends": "b"})", "a.json").is_ok());
  ASSERT_TRUE(reg.add(R"({"name": "b", "extends": "a"})", "b.json").is_ok());
  auto p = reg.get("a");
  ASSERT_FALSE(p.is_ok());
  EXPECT_NE(p.status().message().find("extends"), std::string::npos) << p.status().message();
  EXPECT_FALSE(reg.get("nope").is_ok());
  EXPECT_FALSE(reg.add(R"({"name": "a"})", "dup.json").is_ok());
}

// A profile nested a million arrays deep overflowed the stack (the 'upstream' error dumps the
// value, and nlohmann's dump() recurses once per level). Nesting is bounded before parsing.
TEST(Revision, DeeplyNestedJsonIsAnErrorNotAStackOverflow) {
  RevisionRegistry reg;
  const size_t depth = 1000000;
  Status s = reg.add(ckptsim::test::nested_arrays(depth, "{\"name\": \"x\", \"upstream\": ", "}"),
                     "deep.json");
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("deep.json: nested deeper than kJsonDepthMax"), std::string::npos)
      << s.message();
}

// Switches that are ckptsim's own fixes say so, so that no reader takes them for upstream code
// (the fidelity audit of 2026-12-02 found init_empty_state_before_save described as "as
// Megatron's init_state_fn does"; upstream's runs only when loading).
TEST(Revision, OurOwnFixesAreMarkedAsOurs) {
  for (const char* name : {"init_empty_state_before_save", "hdo_gpu_part_gets_decoupled_grad",
                           "hdo_moves_state_by_role"}) {
    const auto& infos = revision_switch_infos();
    const auto it = std::find_if(infos.begin(), infos.end(),
                                 [&](const SwitchInfo& i) { return i.name == name; });
    ASSERT_NE(it, infos.end()) << name;
    EXPECT_EQ(it->meaning.rfind("fix (ours)", 0), 0u) << name << ": " << it->meaning;
  }
  auto reg = RevisionRegistry::load_embedded();
  ASSERT_TRUE(reg.is_ok());
  const auto fix = reg.value().get("fix-complete");
  ASSERT_TRUE(fix.is_ok());
  EXPECT_NE(fix.value().description.find("saving before the first step (a fix of ours"),
            std::string::npos);
}
