// ContinuationCheck (consumer/continuation_check.h) on logits made by hand, so every gap is known
// exactly: a prompt [5, 6, 7] continued by the received ids [2, 3] is judged by the rows of
// positions 2 (judging 2) and 3 (judging 3); position 4's row predicts the next, unreceived,
// token and is ignored. Gaps within the tie agree; beyond it an exact check refuses, naming the
// received id, and an inexact one counts. Rows come in chunks, before and past the check's range.
#include "consumer/continuation_check.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <vector>

namespace scd::consumer {
namespace {

constexpr int64_t kVocab = 8;
constexpr double kTie = 0.01;
const std::vector<TokenId> kIds = {5, 6, 7, 2, 3};  // prompt 5 6 7, received 2 3

// Logits of positions [first, first + tops.size()): each row 0 but for 1.0 at its top id and
// `second` at id 2 and 3 (when the top is another).
at::Tensor Rows(const std::vector<int>& tops, float second = 0) {
  at::Tensor rows = at::zeros({static_cast<int64_t>(tops.size()), kVocab}, at::kFloat);
  for (size_t r = 0; r < tops.size(); ++r) {
    const auto i = static_cast<int64_t>(r);
    rows[i][2] = second;
    rows[i][3] = second;
    rows[i][tops[r]] = 1.0f;
  }
  return rows;
}

TEST(ContinuationCheckTest, IdsThatAreTheModelsPicksAgree) {
  ContinuationCheck check(kIds, 2, kTie, /*exact=*/true);
  EXPECT_EQ(check.first_position(), 2);
  // Positions 2, 3, 4: picks 2 and 3 (position 4's top is anything).
  ASSERT_TRUE(check.Judge(2, Rows({2, 3, 6})).ok());
  EXPECT_EQ(check.tally().checked(), 2u);
  EXPECT_EQ(check.tally().parted(), 0u);
  EXPECT_EQ(check.tally().worst_gap(), 0);
  EXPECT_TRUE(check.tally().exact());
}

TEST(ContinuationCheckTest, AGapWithinTheTieAgreesAndIsReported) {
  ContinuationCheck check(kIds, 2, kTie, /*exact=*/true);
  // Position 2's top is 4; the received 2 is 0.005 below it (a near-tie).
  ASSERT_TRUE(check.Judge(2, Rows({4, 3}, 0.995f)).ok());
  EXPECT_EQ(check.tally().checked(), 2u);
  EXPECT_EQ(check.tally().parted(), 0u);
  EXPECT_NEAR(check.tally().worst_gap(), 0.005, 1e-6);
}

TEST(ContinuationCheckTest, AnExactCheckRefusesAnIdBeyondTheTieNamingIt) {
  ContinuationCheck check(kIds, 2, kTie, /*exact=*/true);
  ASSERT_TRUE(check.Judge(2, Rows({2})).ok());
  // Position 3's top is 6; the received 3 is 0.5 below it.
  const absl::Status refused = check.Judge(3, Rows({6, 1}, 0.5f));
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_NE(refused.message().find("continued_ids[1] = 3"), std::string::npos) << refused;
  EXPECT_EQ(check.tally().checked(), 2u);
  EXPECT_EQ(check.tally().parted(), 1u);
  EXPECT_NEAR(check.tally().worst_gap(), 0.5, 1e-6);
}

TEST(ContinuationCheckTest, AnInexactCheckCountsPartedIdsWithoutRefusing) {
  ContinuationCheck check(kIds, 2, kTie, /*exact=*/false);
  ASSERT_TRUE(check.Judge(2, Rows({4, 6, 0})).ok());
  EXPECT_EQ(check.tally().checked(), 2u);
  EXPECT_EQ(check.tally().parted(), 2u);
  EXPECT_EQ(check.tally().worst_gap(), 1.0);
  EXPECT_FALSE(check.tally().exact());
}

TEST(ContinuationCheckTest, RowsBeforeItsRangeArePassedOverAndNoPositionIsJudgedTwice) {
  ContinuationCheck check(kIds, 2, kTie, /*exact=*/true);
  // Positions 0..2 in one chunk (0 and 1 are the prompt's: not judged; their tops would part).
  ASSERT_TRUE(check.Judge(0, Rows({0, 0, 2})).ok());
  EXPECT_EQ(check.tally().checked(), 1u);
  ASSERT_TRUE(check.Judge(2, Rows({2, 3})).ok());  // position 2 again: not judged again
  EXPECT_EQ(check.tally().checked(), 2u);
  ASSERT_TRUE(check.Judge(4, Rows({1})).ok());  // the next token's row: nothing to judge
  EXPECT_EQ(check.tally().checked(), 2u);
  EXPECT_EQ(check.tally().parted(), 0u);
}

TEST(ContinuationCheckTest, LogitsOfAnotherShapeOrDtypeAreRefused) {
  ContinuationCheck check(kIds, 2, kTie, /*exact=*/false);
  EXPECT_EQ(check.Judge(2, at::zeros({kVocab}, at::kFloat)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(check.Judge(2, Rows({2}).to(at::kDouble)).code(), absl::StatusCode::kInvalidArgument);
  // An id outside the logits' vocabulary.
  const std::vector<TokenId> beyond = {5, 6, 7, 9};
  ContinuationCheck wide(beyond, 1, kTie, /*exact=*/false);
  EXPECT_EQ(wide.Judge(2, Rows({2})).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(check.tally().checked(), 0u);
}

}  // namespace
}  // namespace scd::consumer
