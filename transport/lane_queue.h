// LaneQueue: frames waiting to leave a link, in the two lanes of the Link contract: control frames
// (ack, error, credit, cancel, heartbeat) leave before every queued data frame; data frames
// (header, chunk, trailer) leave in the order they were queued; and a session that ended early has
// its queued chunks and trailer dropped (Link::DropSession) while its header and control frames
// still go, so the peer always learns of the session and then of its end. Every backend and the
// shaper queue through it: gRPC's writer, UCX's send window, the in-process pipe, the shaper's
// token bucket.
//
// `Item` is a Frame or a struct holding one in a member `frame` (the backend's own per-frame state
// beside it: the shaper's due time, gRPC's write progress).
// Thread-safety: none; the owner guards it (and releases dropped items outside its lock).
#ifndef SCD_TRANSPORT_LANE_QUEUE_H_
#define SCD_TRANSPORT_LANE_QUEUE_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <utility>

#include "transport/frame.h"

namespace scd::transport {

inline const Frame& FrameOf(const Frame& frame) { return frame; }
template <typename Item>
const Frame& FrameOf(const Item& item) {
  return item.frame;
}

template <typename Item>
class LaneQueue {
 public:
  void Push(Item item) {
    (IsControl(FrameOf(item).type) ? control_ : data_).push_back(std::move(item));
  }
  bool empty() const { return control_.empty() && data_.empty(); }
  size_t size() const { return control_.size() + data_.size(); }

  // The item that leaves next (control first); null when empty. Stays queued until Pop.
  Item* Next() {
    if (!control_.empty()) return &control_.front();
    return data_.empty() ? nullptr : &data_.front();
  }
  // Removes and returns the item Next() named.
  std::optional<Item> Pop() {
    std::deque<Item>& lane = !control_.empty() ? control_ : data_;
    if (lane.empty()) return std::nullopt;
    std::optional<Item> item(std::move(lane.front()));
    lane.pop_front();
    return item;
  }

  // The lanes themselves, for owners that release by time (the shaper) or write a data frame in
  // pieces (gRPC): the front of data() may be partly sent.
  std::deque<Item>& control() { return control_; }
  std::deque<Item>& data() { return data_; }

  // Drops session `session_id`'s queued chunks and trailer (never its header), unless
  // `keep(item)` (gRPC keeps a chunk it already began to write), and calls `kept(item,
  // dropped_bytes)` for every data item kept after the first dropped one, with the wire bytes
  // dropped ahead of it (the shaper moves it earlier by their time). Returns the dropped items: the
  // caller releases their payloads after unlocking; `total_bytes`, when given, gets their wire
  // bytes.
  template <typename Keep, typename Kept>
  std::deque<Item> DropSession(uint64_t session_id, Keep keep, Kept kept,
                               size_t* total_bytes = nullptr) {
    std::deque<Item> dropped;
    size_t dropped_bytes = 0;
    std::deque<Item> remaining;
    bool any = false;
    auto drops = [&](const Item& item) {
      const Frame& frame = FrameOf(item);
      return frame.session_id == session_id && frame.type != FrameType::kHeader && !keep(item);
    };
    for (const Item& item : data_) {
      if (drops(item)) {
        any = true;
        break;
      }
    }
    if (!any) return dropped;  // nothing moves
    for (Item& item : data_) {
      if (drops(item)) {
        dropped_bytes += FrameOf(item).wire_bytes();
        dropped.push_back(std::move(item));
      } else {
        if (dropped_bytes > 0) kept(item, dropped_bytes);
        remaining.push_back(std::move(item));
      }
    }
    data_.swap(remaining);
    if (total_bytes != nullptr) *total_bytes = dropped_bytes;
    return dropped;
  }
  std::deque<Item> DropSession(uint64_t session_id) {
    return DropSession(
        session_id, [](const Item&) { return false; }, [](Item&, size_t) {});
  }

  // Everything, both lanes (a link going down releases it).
  std::deque<Item> TakeAll() {
    std::deque<Item> all;
    if (control_.empty()) {
      all.swap(data_);  // the common case: nothing to merge, nothing allocated
      return all;
    }
    all.swap(control_);
    for (Item& item : data_) all.push_back(std::move(item));
    data_.clear();
    return all;
  }

 private:
  std::deque<Item> control_;
  std::deque<Item> data_;
};

}  // namespace scd::transport

#endif  // SCD_TRANSPORT_LANE_QUEUE_H_
