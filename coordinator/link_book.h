// LinkBook: what the coordinator learns of the links between its producers and consumers, for
// auto's cost model (coordinator/auto_choice.h). Per producer, the shape its sessions travel under
// -- announced (Registry.SetLinkShape) or learnt from a Finished that says the codes travelled
// under one, forgotten `learnt_link_max_age` after it was learnt -- and per (producer, consumer)
// pair the goodput and latency measured from finished transfers (LinkEstimate). A request routed
// before the shape was last set travelled under the old one and teaches nothing of it.
// Thread-safety: thread-safe (a lock of its own, never held while calling out).
#ifndef SCD_COORDINATOR_LINK_BOOK_H_
#define SCD_COORDINATOR_LINK_BOOK_H_

#include <map>
#include <optional>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/auto_choice.h"
#include "scd/v1/control.pb.h"
#include "scd/v1/inference.pb.h"

namespace scd::coordinator {

class LinkBook {
 public:
  explicit LinkBook(absl::Duration learnt_max_age) : learnt_max_age_(learnt_max_age) {}

  // The shape `producer`'s sessions travel under from `now` (gbps 0: unshaped, the link then as
  // measured).
  void NoteShape(const std::string& producer, const v1::LinkShape& shape, absl::Time now);
  // A transfer from `producer` to `consumer`, routed at `routed_at`, finished (not local).
  void Observe(const std::string& producer, const std::string& consumer, absl::Time routed_at,
               const v1::Finished& finished, absl::Time now);
  // The link as auto sees it at `now`: goodput (0: unlimited or unknown), latency, and how it is
  // known, for reasons.
  struct Link {
    double goodput_bytes_per_s = 0, latency_us = 0;
    std::string how;
  };
  Link For(const std::string& producer, const std::string& consumer, absl::Time now) const;
  // A node left: everything learnt of its links goes.
  void Forget(const std::string& node);

 private:
  struct Shape {
    std::optional<v1::LinkShape> shape;              // when shaped
    absl::Time set = absl::InfinitePast();           // the last NoteShape
    bool announced = false;                          // that one set a shape (else learnt or none)
    absl::Time learnt = absl::InfinitePast();        // the last Finished that set `shape`
  };
  const absl::Duration learnt_max_age_;
  mutable absl::Mutex mu_;
  std::map<std::string, Shape> shapes_ ABSL_GUARDED_BY(mu_);  // by producer node
  std::map<std::pair<std::string, std::string>, LinkEstimate> measured_ ABSL_GUARDED_BY(mu_);
};

}  // namespace scd::coordinator

#endif  // SCD_COORDINATOR_LINK_BOOK_H_
