// Issue 3's acceptance bars in the test suite: a calibration of the hard pair with reduced
// held-out scoring
// (stories260k -> llama2xs-260k, no shared training) and its evaluation on >= 60 windows of the
// TinyStories validation text. scd at <= 25 % of the raw f16 payload with <= 3 of 5 layers
// patched must stay within 1.08x the oracle's continuation perplexity and KL <= 0.08, while raw
// and int4 transfers of the same cache are far off; the frontier the fit stored beats every fixed
// mode at that mode's bytes (issue 29). Also drives the scd-calib binary (eval, frontier).
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <chrono>
#include <nlohmann/json.hpp>

#include "calib/calibrator.h"
#include "calib/evaluation.h"
#include "codec/frontier.h"
#include "calib/report_json.h"
#include "tests/test_util.h"

namespace scd {
namespace {

TEST(HardPairTest, ReducedFitMeetsTheQualityBars) {
  const auto start = std::chrono::steady_clock::now();
  auto producer = testing::Ok(LlamaModel::Load(testing::ModelDir("stories260k"), {}));
  auto consumer = testing::Ok(LlamaModel::Load(testing::ModelDir("llama2xs-260k"), {}));
  auto tokenizer =
      testing::Ok(Tokenizer::FromFile(testing::ModelDir("stories260k") + "/tokenizer.json"));
  CalibrationOptions options;
  options.data_path = testing::SharedDir() + "/data/tinystories_train_head.txt";
  options.prefixes = 200;
  options.tokens = 128;
  options.heldout_windows = 16;
  options.rank_k = 1;
  options.rank_v = 2;
  options.rank_h = 16;
  options.policy.fixed_k = 3;
  options.progress = false;
  // Every aligner trains its full epochs, however fast the machine: with the default wall-clock
  // budget (60 s an aligner) a slower kernel (ATEN_CPU_CAPABILITY=default under `make
  // numeric-kernels`) stopped 7-11 epochs early, a worse fit whose 8-bit consumer then read +6.3 %.
  options.aligner.max_seconds = 0;
  auto calibrated = Calibrate(*producer, *consumer, *tokenizer, options);
  ASSERT_TRUE(calibrated.ok()) << calibrated.status();
  const Artifact* artifact = &calibrated->artifact;
  // The typed report and the artifact agree on what was decided.
  EXPECT_EQ(calibrated->report.patch_policy.chosen, artifact->PatchLayers());
  EXPECT_EQ(calibrated->report.recompute_policy.chosen, artifact->recompute_layers);
  EXPECT_EQ(calibrated->report.aligners.size(), 3u);
  EXPECT_EQ(artifact->PatchLayers().size(), 3u);

  auto eval =
      Evaluation::Create(*producer, *consumer, artifact, *tokenizer,
                         testing::SharedDir() + "/data/tinystories_valid_hf.txt", 60, {64, 32, 0});
  ASSERT_TRUE(eval.ok()) << eval.status();
  auto scd = eval->Run(TransferMode::kScd, {}, false);
  auto raw = eval->Run(TransferMode::kRaw, {}, false);
  auto int4 = eval->Run(TransferMode::kInt4, {}, false);
  ASSERT_TRUE(scd.ok() && raw.ok() && int4.ok());
  RecordProperty("scd_kl", std::to_string(scd->metrics.kl));
  RecordProperty("scd_ppl_ratio", std::to_string(scd->metrics.ppl_ratio()));
  EXPECT_LE(scd->payload_ratio(), 0.25);
  EXPECT_LE(scd->metrics.ppl_ratio(), 1.08) << ToJson(scd->metrics).dump();
  EXPECT_LE(scd->metrics.kl, 0.08) << ToJson(scd->metrics).dump();
  EXPECT_GE(scd->metrics.windows, 60);
  // The contrast: raw and int4 carry the producer's own cache, which this consumer cannot use.
  EXPECT_GT(raw->metrics.ppl_ratio(), 2.0);
  EXPECT_GT(int4->metrics.kl, 10 * scd->metrics.kl);

  // Issue 48: the consumer with 8-bit weights (model/packed_weight.h), the same artifact and
  // windows, measured against its own prefill: the same bytes, scd's KL within 5 % of float32's.
  {
    LlamaModel::Options int8;
    int8.weights = WeightFormat::kInt8;
    auto consumer8 = testing::Ok(LlamaModel::Load(testing::ModelDir("llama2xs-260k"), int8));
    auto eval8 = testing::Ok(Evaluation::Create(
        *producer, *consumer8, artifact, *tokenizer,
        testing::SharedDir() + "/data/tinystories_valid_hf.txt", 60, {64, 32, 0}));
    const ModeResult scd8 = testing::Ok(eval8.Run(TransferMode::kScd, {}, false));
    EXPECT_EQ(scd8.metrics.bytes_per_token, scd->metrics.bytes_per_token);
    EXPECT_LE(scd8.metrics.kl, 1.05 * scd->metrics.kl)
        << "int8 consumer " << scd8.metrics.kl << " vs float32 " << scd->metrics.kl;
    std::printf("hard pair, 8-bit consumer: scd KL %.4f (float32 %.4f, %+.1f %%)\n",
                scd8.metrics.kl, scd->metrics.kl, 100 * (scd8.metrics.kl / scd->metrics.kl - 1));
  }

  // Issue 29: the fit stored a frontier. Measured again on these evaluation windows, at the
  // bytes of each fixed mode (scd at the fitted ranks, reuse, int4) the frontier's best point at
  // or under them is no worse than the mode.
  const Frontier& frontier = artifact->frontier;
  ASSERT_GE(frontier.points.size(), 3u);
  EXPECT_TRUE(frontier.CheckAgainst(artifact->FrontierLimits()).ok());
  std::vector<ModeResult> points;
  for (const FrontierPoint& p : frontier.points) {
    points.push_back(
        testing::Ok(eval->Run(TransferMode::kScd, TransferOptions::AtPoint(p), false)));
  }
  auto reuse = eval->Run(TransferMode::kReuse, {}, false);
  ASSERT_TRUE(reuse.ok());
  for (const ModeResult* fixed : {&*scd, &*reuse, &*int4}) {
    const ModeResult* best = nullptr;
    for (const ModeResult& p : points) {
      if (p.metrics.bytes_per_token <= fixed->metrics.bytes_per_token &&
          (best == nullptr || p.metrics.kl < best->metrics.kl)) {
        best = &p;
      }
    }
    ASSERT_NE(best, nullptr) << TransferModeName(fixed->mode);
    EXPECT_LE(best->metrics.kl, fixed->metrics.kl) << TransferModeName(fixed->mode);
  }
  // Its cheapest point is far below the fitted configuration's bytes.
  EXPECT_LT(points.front().payload_ratio(), 0.5 * scd->payload_ratio());
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // Issue 3's bar: the fit costs at most 3 minutes of this 2-core machine. Measured as this
  // process's CPU time against 2 cores x 180 s, not as wall time, so that other work on a shared
  // machine (a parallel build) does not fail the suite; wall time is printed below.
  struct rusage usage {};
  ::getrusage(RUSAGE_SELF, &usage);
  const double cpu_seconds =
      static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
      1e-6 * static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec);
  EXPECT_LT(cpu_seconds, 2 * 180.0) << "wall " << seconds << " s";
  std::printf(
      "hard pair, reduced fit: scd KL %.4f PPL x%.3f at %.1f%% payload; raw KL %.3f PPL x%.2f; "
      "int4 KL %.3f; %.0f s wall, %.0f s CPU\n",
      scd->metrics.kl, scd->metrics.ppl_ratio(), 100 * scd->payload_ratio(), raw->metrics.kl,
      raw->metrics.ppl_ratio(), int4->metrics.kl, seconds, cpu_seconds);

  // The command line on the same artifact: JSON output, then a wrong model pair.
  testing::TempDir dir;
  ASSERT_TRUE(artifact->Save(dir.File("hard.scd")).ok());
  const std::string calib = testing::BuildDir() + "/bin/scd-calib";
  auto r = testing::RunCommand(
      calib + " eval --quiet --producer " + testing::ModelDir("stories260k") + " --consumer " +
      testing::ModelDir("llama2xs-260k") + " --artifact " + dir.File("hard.scd") +
      " --modes local,scd --windows 8 --greedy-tokens 4" + " --json " + dir.File("out.json") +
      " --depth-errors --out-dir " + dir.File("plots/depth"));  // made by the command
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("scd "), std::string::npos) << r.out;
  auto json = nlohmann::json::parse(testing::ReadFile(dir.File("out.json")));
  EXPECT_LT(json["modes"]["local"]["kl"].get<double>(), 1e-6);
  EXPECT_LE(json["modes"]["scd"]["payload_ratio"].get<double>(), 0.25);
  // Drawn by bench/plot_calib.py (matplotlib): a PNG file.
  EXPECT_EQ(testing::ReadFile(dir.File("plots/depth/depth_errors.png")).substr(1, 3), "PNG");
  EXPECT_NE(testing::ReadFile(dir.File("plots/depth/depth_errors.csv"))
                .find("layer,reuse_rel_error,scd_rel_error"),
            std::string::npos);
  // scd-calib frontier refits the stored frontier (here int4 codes only), eval --frontier draws it.
  auto refit = testing::RunCommand(
      calib + " frontier --quiet --producer " + testing::ModelDir("stories260k") + " --consumer " +
      testing::ModelDir("llama2xs-260k") + " --artifact " + dir.File("hard.scd") + " --out " +
      dir.File("int4/hard.scd") +
      " --frontier-dtypes int4 --frontier-points 3 --heldout-windows 8");
  ASSERT_EQ(refit.exit_code, 0) << refit.err;
  const Artifact int4_only = testing::Ok(Artifact::Load(dir.File("int4/hard.scd")));
  ASSERT_FALSE(int4_only.frontier.empty());
  for (const FrontierPoint& p : int4_only.frontier.points)
    EXPECT_EQ(p.code_dtype, WireDtype::kInt4);
  EXPECT_NE(refit.out.find("8 windows"), std::string::npos) << refit.out;
  auto drawn = testing::RunCommand(
      calib + " eval --quiet --producer " + testing::ModelDir("stories260k") + " --consumer " +
      testing::ModelDir("llama2xs-260k") + " --artifact " + dir.File("int4/hard.scd") +
      " --modes scd --windows 8 --greedy-tokens 0 --frontier --out-dir " + dir.File("plots/f"));
  ASSERT_EQ(drawn.exit_code, 0) << drawn.err;
  EXPECT_EQ(testing::ReadFile(dir.File("plots/f/frontier.png")).substr(1, 3), "PNG");
  EXPECT_NE(testing::ReadFile(dir.File("plots/f/frontier.csv")).find("mode,reuse,f16"),
            std::string::npos);
  // An artifact without a frontier is refused before the evaluation runs.
  Artifact bare = *artifact;
  bare.frontier = Frontier();
  ASSERT_TRUE(bare.Save(dir.File("bare.scd")).ok());
  auto none = testing::RunCommand(
      calib + " eval --quiet --producer " + testing::ModelDir("stories260k") + " --consumer " +
      testing::ModelDir("llama2xs-260k") + " --artifact " + dir.File("bare.scd") + " --frontier");
  EXPECT_EQ(none.exit_code, 1);
  EXPECT_NE(none.err.find("has no frontier"), std::string::npos) << none.err;
  auto wrong = testing::RunCommand(
      calib + " eval --quiet --producer " + testing::ModelDir("stories260k") + " --consumer " +
      testing::ModelDir("stories260k-fables") + " --artifact " + dir.File("hard.scd"));
  EXPECT_EQ(wrong.exit_code, 1);
  EXPECT_NE(wrong.err.find("artifact was fitted for consumer 'llama2xs-260k'"), std::string::npos)
      << wrong.err;
  auto tokenizers = testing::RunCommand(calib + " fit --quiet --out " + dir.File("x.scd") +
                                        " --producer " + testing::ModelDir("stories260k") +
                                        " --consumer " + testing::ModelDir("tinystories-656k"));
  EXPECT_EQ(tokenizers.exit_code, 1);
  EXPECT_NE(tokenizers.err.find("tokenizers differ"), std::string::npos) << tokenizers.err;
}

}  // namespace
}  // namespace scd
