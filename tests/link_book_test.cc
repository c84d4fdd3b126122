// LinkBook (coordinator/link_book.h), the coordinator's link learning, with no node, no socket
// and no wall clock: times are values on a clock the test sets. An announced shape holds until
// changed; one learnt from a Finished is forgotten learnt_link_max_age after; a request routed
// before the shape was last set teaches nothing of it; measured goodput (transfers the link held
// back) is kept per (producer, consumer) pair; a node that leaves takes its links with it.
#include "coordinator/link_book.h"

#include <gtest/gtest.h>

#include "proto/wire_mode.h"

namespace scd::coordinator {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1'000'000);

v1::LinkShape Shape(double gbps, double latency_us = 0) {
  v1::LinkShape shape;
  shape.set_gbps(gbps);
  shape.set_latency_us(latency_us);
  return shape;
}

// A transfer of `bytes` in `transfer_us` after a prefill of `prefill_us`, under `link` (gbps 0:
// none said).
v1::Finished Transfer(uint64_t bytes, uint64_t transfer_us, uint64_t prefill_us,
                      double link_gbps = 0) {
  v1::Finished f;
  SetRanMode(TransferMode::kScd, &f);
  f.set_payload_bytes(bytes);
  f.mutable_timings()->set_transfer(transfer_us);
  f.mutable_timings()->set_prefill(prefill_us);
  if (link_gbps > 0) *f.mutable_link() = Shape(link_gbps);
  return f;
}

TEST(LinkBookTest, AnUnknownLinkIsTakenAsUnlimited) {
  LinkBook book(absl::Seconds(10));
  const LinkBook::Link link = book.For("p", "c", kT0);
  EXPECT_EQ(link.goodput_bytes_per_s, 0);
  EXPECT_NE(link.how.find("unlimited"), std::string::npos) << link.how;
}

TEST(LinkBookTest, AnAnnouncedShapeHoldsUntilChanged) {
  LinkBook book(absl::Seconds(10));
  book.NoteShape("p", Shape(0.8, 150), kT0);
  LinkBook::Link link = book.For("p", "c", kT0 + absl::Hours(1));  // never ages
  EXPECT_DOUBLE_EQ(link.goodput_bytes_per_s, 0.8e9 / 8);
  EXPECT_DOUBLE_EQ(link.latency_us, 150);
  EXPECT_EQ(link.how, "0.8 Gbit/s as shaped");
  book.NoteShape("p", Shape(0), kT0 + absl::Hours(1));  // unshaped now
  EXPECT_EQ(book.For("p", "c", kT0 + absl::Hours(1)).goodput_bytes_per_s, 0);
}

TEST(LinkBookTest, ALearntShapeIsForgottenAfterItsMaxAge) {
  LinkBook book(absl::Seconds(10));
  // Not held back (transfer within the prefill): a shape learnt, nothing measured.
  book.Observe("p", "c", kT0, Transfer(1000, 100, 1000, 0.1), kT0);
  EXPECT_DOUBLE_EQ(book.For("p", "c", kT0 + absl::Seconds(10)).goodput_bytes_per_s, 0.1e9 / 8);
  EXPECT_EQ(book.For("p", "c", kT0 + absl::Seconds(10) + absl::Microseconds(1))
                .goodput_bytes_per_s,
            0);
  // A Finished without a shape clears it at once.
  book.Observe("p", "c", kT0, Transfer(1000, 100, 1000, 0.1), kT0);
  book.Observe("p", "c", kT0, Transfer(1000, 100, 1000), kT0 + absl::Seconds(1));
  EXPECT_EQ(book.For("p", "c", kT0 + absl::Seconds(1)).goodput_bytes_per_s, 0);
}

TEST(LinkBookTest, ARequestRoutedBeforeTheLastShapeTeachesNothingOfIt) {
  LinkBook book(absl::Seconds(10));
  book.NoteShape("p", Shape(1), kT0 + absl::Seconds(5));
  // Routed at kT0, before the shape was set: its unshaped Finished does not clear it.
  book.Observe("p", "c", kT0, Transfer(1000, 100, 1000), kT0 + absl::Seconds(6));
  EXPECT_DOUBLE_EQ(book.For("p", "c", kT0 + absl::Seconds(6)).goodput_bytes_per_s, 1e9 / 8);
  // Routed after: it does.
  book.Observe("p", "c", kT0 + absl::Seconds(6), Transfer(1000, 100, 1000),
               kT0 + absl::Seconds(7));
  EXPECT_EQ(book.For("p", "c", kT0 + absl::Seconds(7)).goodput_bytes_per_s, 0);
}

TEST(LinkBookTest, HeldBackTransfersAreMeasuredPerPairAndGoWithTheirNode) {
  LinkBook book(absl::Seconds(10));
  // Transfers the link held back (10x the prefill): 1 MB in 1 s and 2 MB in 2 s over a fixed
  // 0: 1 MB/s, measured for (p, c) only.
  book.Observe("p", "c", kT0, Transfer(1'000'000, 1'000'000, 100'000), kT0);
  book.Observe("p", "c", kT0, Transfer(2'000'000, 2'000'000, 200'000), kT0 + absl::Seconds(1));
  const LinkBook::Link link = book.For("p", "c", kT0 + absl::Seconds(2));
  EXPECT_NEAR(link.goodput_bytes_per_s, 1e6, 1e3);
  EXPECT_NE(link.how.find("as measured"), std::string::npos) << link.how;
  EXPECT_EQ(book.For("p", "other", kT0 + absl::Seconds(2)).goodput_bytes_per_s, 0);
  book.Forget("c");
  EXPECT_EQ(book.For("p", "c", kT0 + absl::Seconds(2)).goodput_bytes_per_s, 0);
}

}  // namespace
}  // namespace scd::coordinator
