// Scenario files are a user interface: every error names the file and the field path with the
// expected and observed value. Mutations caught: unknown fields ignored
// (UnknownFieldIsAnError), limits unchecked (LimitsAreErrors), to_json dropping a field
// (JsonRoundTrip).
#include <gtest/gtest.h>

#include "tests/json_nesting.h"
#include "tests/testing.h"

using namespace ckptsim;

namespace {

std::string error_of(const std::string& json) {
  auto s = sim::parse_scenario(json, "bug.json", test::registry());
  EXPECT_FALSE(s.is_ok()) << "accepted: " << json;
  return s.is_ok() ? std::string() : s.status().message();
}

const char* kGood = R"({"seed": 1, "params": [{"name": "w", "numel": 10, "dtype": "bf16"}],
  "optimizer": {"kind": "fused_adam", "lr": 0.01, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1},
  "phases": [{"dp": 2, "revision": "upstream-2874", "steps": 1}]})";

std::string with(const std::string& from, const std::string& to) {
  std::string s = kGood;
  const auto at = s.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return s.replace(at, from.size(), to);
}

}  // namespace

TEST(Scenario, GoodScenarioParsesWithDefaults) {
  auto s = sim::parse_scenario(kGood, "good.json", test::registry());
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  EXPECT_FALSE(s.value().bucket_size.has_value());
  EXPECT_EQ(s.value().samples_per_step, 8);
  EXPECT_EQ(s.value().format, model::CheckpointFormat{});
  EXPECT_EQ(s.value().format.sharding_type, model::ShardingType::kDpReshardable);
  EXPECT_TRUE(s.value().phases[0].save);
}

TEST(Scenario, ErrorsNameFileFieldAndValues) {
  EXPECT_EQ(error_of(with("\"dp\": 2", "\"dp\": 0")),
            "bug.json: field 'phases[0].dp': must be an integer in [1, " +
                std::to_string(sim::Scenario::kDpMax) + "], got 0");
  EXPECT_NE(error_of(with("\"bf16\"", "\"fp16\""))
                .find("field 'params[0].dtype': must be \"bf16\" or \"fp32\", got \"fp16\""),
            std::string::npos);
  EXPECT_NE(error_of(with("upstream-2874", "upstream-9999"))
                .find("field 'phases[0].revision': unknown revision 'upstream-9999'"),
            std::string::npos);
  EXPECT_NE(error_of(with("\"fused_adam\"", "\"adam\"")).find("field 'optimizer.kind'"),
            std::string::npos);
  EXPECT_NE(error_of(with("\"fused_adam\"", "\"hybrid\""))
                .find("field 'optimizer.offload_fraction': is required"),
            std::string::npos);
  EXPECT_NE(error_of(with("[0.9, 0.95]", "[0.9]")).find("field 'optimizer.betas'"),
            std::string::npos);
  EXPECT_NE(
      error_of(with("\"seed\": 1,", "\"seed\": 1, \"samples_per_step\": 6,")).find("power of two"),
      std::string::npos);
  EXPECT_NE(error_of(with("\"seed\": 1,", "\"seed\": 1, \"sharding_type\": \"fully\","))
                .find("field 'sharding_type': must be one of dp_reshardable, fully_reshardable, "
                      "dp_zero_gather_scatter, fully_sharded_model_space, got \"fully\""),
            std::string::npos);
  EXPECT_NE(
      error_of(with("\"seed\": 1,", "\"seed\": 1, \"fully_reshardable_mem_efficient\": true,"))
          .find("field 'fully_reshardable_mem_efficient': only with sharding_type "
                "fully_reshardable (phase 0 saves in dp_reshardable)"),
      std::string::npos);
  EXPECT_NE(error_of(with("\"dp\": 2", "\"dp\": 2, \"sharding_type\": 3"))
                .find("field 'phases[0].sharding_type': must be one of"),
            std::string::npos);
  EXPECT_NE(error_of("[1, 2]").find("bug.json"), std::string::npos);
  EXPECT_NE(error_of("{not json").find("not valid JSON"), std::string::npos);
}

TEST(Scenario, UnknownFieldIsAnError) {
  EXPECT_NE(error_of(with("\"seed\": 1,", "\"seed\": 1, \"bucketsize\": 10,"))
                .find("field 'bucketsize': unknown field"),
            std::string::npos);
  EXPECT_NE(error_of(with("\"steps\": 1", "\"steps\": 1, \"revison\": \"x\""))
                .find("field 'phases[0].revison'"),
            std::string::npos);
}

// Found by the short fuzz run (tests/fixtures/fuzz-regressions/scenario_fuzzer/): a field
// name that holds a newline (JSON "\n") printed the newline into the error.
TEST(Scenario, AFieldNameWithANewlineStaysOnOneLine) {
  const std::string m = error_of(with(R"("steps": 1)", R"("steps": 1, "ste\nps": 2)"));
  EXPECT_EQ(m.find_first_of("\n\r"), std::string::npos) << m;
  EXPECT_NE(m.find(R"(field 'phases[0].ste\nps': unknown field)"), std::string::npos) << m;
}

TEST(Revision, AProfileFieldNameWithAControlCharacterStaysOnOneLine) {
  model::RevisionRegistry registry = test::registry();
  const Status s = registry.add(R"({"name": "x", "switches": {"a\rb\u0001": true}})", "p.json");
  ASSERT_FALSE(s.is_ok());
  EXPECT_EQ(s.message().find_first_of("\n\r\x01"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find(R"(field 'switches.a\rb\x01': unknown switch)"), std::string::npos)
      << s.message();
}

TEST(Scenario, LimitsAreErrors) {
  EXPECT_NE(error_of(with("\"numel\": 10", "\"numel\": 2000000")).find("params[0].numel"),
            std::string::npos);
  EXPECT_NE(error_of(with("\"steps\": 1", "\"steps\": 20000")).find("phases[0].steps"),
            std::string::npos);
  // Production DP sizes parse up to the limit of both the model and the world, not beyond.
  EXPECT_EQ(sim::Scenario::kDpMax, std::min<int64_t>(model::kDpSizeMax, sim::kWorldSizeMax));
  EXPECT_TRUE(
      sim::parse_scenario(with("\"dp\": 2", "\"dp\": " + std::to_string(sim::Scenario::kDpMax)),
                          "big.json", test::registry())
          .is_ok());
  EXPECT_NE(error_of(with("\"dp\": 2", "\"dp\": " + std::to_string(sim::Scenario::kDpMax + 1)))
                .find("phases[0].dp"),
            std::string::npos);
  EXPECT_NE(error_of(with("\"seed\": 1,", "\"seed\": 1, \"faults\": [\"nope\"],"))
                .find("unknown fault site"),
            std::string::npos);
}

TEST(Scenario, JsonRoundTrip) {
  const auto s = test::scenario_file("scenarios/spec17-H-lno-skip-offload-half.json");
  const auto again =
      sim::parse_scenario(sim::scenario_to_json(s).dump(), "round.json", test::registry());
  ASSERT_TRUE(again.is_ok()) << again.status().to_string();
  EXPECT_EQ(sim::scenario_to_json(again.value()), sim::scenario_to_json(s));
  EXPECT_EQ(again.value().optimizer.offload_fraction, 0.5);
  EXPECT_EQ(again.value().phases.size(), 2u);
}

// Whether TE is installed is part of a hybrid scenario (Megatron takes other branches without
// it); for fused_adam and torch_adamw the kind already says it.
TEST(Scenario, TransformerEngineIsAHybridFieldOfTwoValues) {
  auto hybrid = [](const std::string& te) {
    return with("\"fused_adam\",", "\"hybrid\", \"offload_fraction\": 0.5," + te);
  };
  EXPECT_NE(error_of(hybrid(" \"transformer_engine\": \"none\","))
                .find("field 'optimizer.transformer_engine': must be \"installed\" or \"absent\", "
                      "got \"none\""),
            std::string::npos);
  EXPECT_NE(error_of(with("\"fused_adam\",", "\"fused_adam\", \"transformer_engine\": \"absent\","))
                .find("field 'optimizer.transformer_engine': applies only to kind \"hybrid\""),
            std::string::npos);
  const auto s = sim::parse_scenario(hybrid(" \"transformer_engine\": \"absent\","), "no-te.json",
                                     test::registry());
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  EXPECT_FALSE(s.value().optimizer.te_installed);
  const auto json = sim::scenario_to_json(s.value());
  EXPECT_EQ(json["optimizer"]["transformer_engine"], "absent");
  const auto again = sim::parse_scenario(json.dump(), "round.json", test::registry());
  ASSERT_TRUE(again.is_ok());
  EXPECT_FALSE(again.value().optimizer.te_installed);
  // Installed is the default, and is not written out.
  const auto with_te = sim::parse_scenario(hybrid(""), "te.json", test::registry());
  ASSERT_TRUE(with_te.is_ok());
  EXPECT_TRUE(with_te.value().optimizer.te_installed);
  EXPECT_FALSE(sim::scenario_to_json(with_te.value())["optimizer"].contains("transformer_engine"));
}

// The precision-aware optimizer's fields (issue 26): each rule an error naming the field, and
// a scenario that uses them round-trips through its JSON. Mutations caught: the
// "fp32 unless precision-aware" check removed (the bf16 without precision_aware case), the
// torch_adamw refusal removed, the writer leaving exp_avg_dtype out (the round trip).
TEST(Scenario, PrecisionAwareStatesAreFieldsWithTheirRules) {
  const std::string pa = "\"fused_adam\", \"precision_aware\": true,";
  auto opt = [&](const std::string& fields) { return with("\"fused_adam\",", pa + fields); };
  EXPECT_NE(error_of(with("\"fused_adam\",", "\"fused_adam\", \"exp_avg_dtype\": \"bf16\","))
                .find("field 'optimizer.exp_avg_dtype': can only be fp32 when not using "
                      "precision-aware optimizer"),
            std::string::npos);
  EXPECT_NE(error_of(opt(" \"exp_avg_sq_dtype\": \"fp8\",")).find("\"fp8\" is not modeled"),
            std::string::npos);
  EXPECT_NE(error_of(opt(" \"exp_avg_dtype\": \"int8\","))
                .find("field 'optimizer.exp_avg_dtype': must be one of fp32, bf16, fp16, got "
                      "\"int8\""),
            std::string::npos);
  EXPECT_NE(error_of(opt(" \"main_params_dtype\": \"fp16\",")).find("only \"fp32\" is modeled"),
            std::string::npos);
  EXPECT_NE(error_of(with("\"fused_adam\",", "\"torch_adamw\", \"precision_aware\": true,"))
                .find("cannot be true for kind \"torch_adamw\""),
            std::string::npos);
  EXPECT_NE(error_of(with("\"fused_adam\",",
                          "\"hybrid\", \"offload_fraction\": 1.0, "
                          "\"precision_aware\": false,"))
                .find("must be true for kind \"hybrid\""),
            std::string::npos);
  EXPECT_NE(error_of(with("\"fused_adam\",", "\"fused_adam\", \"store_param_remainders\": false,"))
                .find("applies only to a precision-aware optimizer"),
            std::string::npos);
  const auto s =
      sim::parse_scenario(opt(" \"exp_avg_dtype\": \"bf16\", \"exp_avg_sq_dtype\": \"fp16\", "
                              "\"store_param_remainders\": false,"),
                          "pa.json", test::registry());
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  EXPECT_TRUE(s.value().optimizer.te_precision_aware());
  EXPECT_EQ(s.value().optimizer.exp_avg_dtype, model::StateDType::kBFloat16);
  EXPECT_EQ(s.value().optimizer.exp_avg_sq_dtype, model::StateDType::kFloat16);
  EXPECT_FALSE(s.value().optimizer.store_param_remainders);
  const auto json = sim::scenario_to_json(s.value());
  EXPECT_EQ(json["optimizer"]["exp_avg_dtype"], "bf16");
  const auto again = sim::parse_scenario(json.dump(), "round.json", test::registry());
  ASSERT_TRUE(again.is_ok()) << again.status().to_string();
  EXPECT_EQ(sim::scenario_to_json(again.value()), json);
  // The hybrid takes the dtypes (and ignores them, as upstream's HDO does).
  EXPECT_TRUE(sim::parse_scenario(with("\"fused_adam\",",
                                       "\"hybrid\", \"offload_fraction\": 1.0, "
                                       "\"exp_avg_dtype\": \"bf16\","),
                                  "hdo.json", test::registry())
                  .is_ok());
}

// Expert params and EP (issue 26): each rule an error naming the field; a scenario that uses
// them round-trips. Mutations caught: the EP-change check removed, ep not dividing dp accepted,
// the writer leaving "expert" out (the round trip).
TEST(Scenario, ExpertParamsAndEpAreFieldsWithTheirRules) {
  const std::string two = R"({"seed": 1, "params": [{"name": "w", "numel": 10, "dtype": "bf16"},
    {"name": "e", "numel": 8, "dtype": "bf16", "expert": true}],
    "optimizer": {"kind": "fused_adam", "lr": 0.01, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1},
    "phases": [{"dp": 4, "ep": 2, "revision": "upstream-head", "steps": 1},
               {"dp": 2, "ep": 2, "revision": "upstream-head", "steps": 1}]})";
  const auto s = sim::parse_scenario(two, "moe.json", test::registry());
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  EXPECT_TRUE(s.value().params[1].expert);
  EXPECT_EQ(s.value().phases[1].ep, 2);
  const auto json = sim::scenario_to_json(s.value());
  EXPECT_EQ(json["params"][1]["expert"], true);
  EXPECT_EQ(json["phases"][0]["ep"], 2);
  const auto again = sim::parse_scenario(json.dump(), "round.json", test::registry());
  ASSERT_TRUE(again.is_ok()) << again.status().to_string();
  EXPECT_EQ(sim::scenario_to_json(again.value()), json);
  auto edit = [&](const std::string& from, const std::string& to) {
    std::string t = two;
    t.replace(t.find(from), from.size(), to);
    return t;
  };
  EXPECT_NE(error_of(edit("{\"dp\": 2, \"ep\": 2", "{\"dp\": 2, \"ep\": 1"))
                .find("field 'phases[1].ep': is 1, phases[0]'s 2: an EP change between phases is "
                      "not modeled"),
            std::string::npos);
  EXPECT_NE(error_of(edit("{\"dp\": 4, \"ep\": 2", "{\"dp\": 3, \"ep\": 2"))
                .find("field 'phases[0].ep': 2 does not divide dp 3"),
            std::string::npos);
  EXPECT_NE(error_of(edit("\"numel\": 8", "\"numel\": 9")).find("does not divide dim 0 (9)"),
            std::string::npos);
  EXPECT_NE(error_of(edit("{\"dp\": 4, \"ep\": 2", "{\"dp\": 4, \"ep\": 2, \"tp\": 2"))
                .find("expert params with tp or pp above 1 are not modeled"),
            std::string::npos);
  EXPECT_NE(error_of(edit("\"dtype\": \"bf16\"}", "\"dtype\": \"bf16\", \"expert\": true}"))
                .find("a stub dense part is not modeled"),
            std::string::npos);
}

// A scenario nested a million arrays deep overflowed the stack: the error quotes the value
// (nlohmann's dump() recurses once per level). Found with a hand-written input after the fuzz
// runs (fuzz/scenario_fuzzer's inputs stay a few KB long). Nesting is bounded before parsing.
TEST(Scenario, DeeplyNestedJsonIsAnErrorNotAStackOverflow) {
  const size_t depth = 1000000;
  const std::string m = error_of(test::nested_arrays(depth, "{\"seed\": ", "}"));
  EXPECT_NE(m.find("bug.json"), std::string::npos) << m;
  EXPECT_NE(m.find("nested deeper than kJsonDepthMax"), std::string::npos) << m;
}

// --finetune (PhaseSpec::finetune): a resume flag, so not in the first phase, not with storage
// faults (the reference needs the phase to resume where the previous one ended), and not a job
// of no steps that saves (train() makes no save at iteration 0). Mutations caught: any of the
// three checks dropped; to_json leaving the flag out (the round trip).
TEST(Scenario, FinetuneIsAResumeFlagWithItsLimits) {
  const std::string two =
      with("\"steps\": 1}]",
           "\"steps\": 1}, {\"dp\": 2, \"revision\": \"upstream-head\", \"steps\": 2, "
           "\"finetune\": true}]");
  auto ok = sim::parse_scenario(two, "ok.json", test::registry());
  ASSERT_TRUE(ok.is_ok()) << ok.status().to_string();
  EXPECT_TRUE(ok.value().phases[1].finetune);
  EXPECT_TRUE(ok.value().phases[1].fresh_optimizer());
  EXPECT_EQ(ok.value().phases[1].fresh_start_flag(), "--finetune");
  const auto again =
      sim::parse_scenario(sim::scenario_to_json(ok.value()).dump(), "round.json", test::registry());
  ASSERT_TRUE(again.is_ok()) << again.status().to_string();
  EXPECT_TRUE(again.value().phases[1].finetune);

  EXPECT_EQ(error_of(with("\"steps\": 1}", "\"steps\": 1, \"finetune\": true}")),
            "bug.json: field 'phases[0].finetune': the first phase loads no checkpoint");
  std::string faults = two;
  faults.replace(faults.find("\"steps\": 1}"), 11,
                 "\"steps\": 1, \"storage_faults\": [{\"kind\": \"torn\"}]}");
  EXPECT_NE(error_of(faults).find("field 'phases[1].finetune': not modeled together with "
                                  "storage_faults"),
            std::string::npos);
  std::string idle = two;
  idle.replace(idle.find("\"steps\": 2"), 10, "\"steps\": 0");
  EXPECT_NE(error_of(idle).find("field 'phases[1].finetune': a --finetune job of no steps ends "
                                "at iteration 0"),
            std::string::npos);
  idle.replace(idle.find("\"finetune\""), 10, "\"save\": false, \"finetune\"");
  EXPECT_TRUE(sim::parse_scenario(idle, "idle.json", test::registry()).is_ok());
  EXPECT_NE(error_of(with("\"steps\": 1}", "\"steps\": 1, \"finetune\": 1}"))
                .find("field 'phases[0].finetune'"),
            std::string::npos);
}
