// LinkWrapper: the base of every Link decorator (the shaper, fault injection). It forwards every
// Link call to the link it wraps, so a decorator overrides only what it changes and passes on the
// rest: in particular DropSession reaches the backend through any stack of wrappers.
// Thread-safety: as the wrapped link.
#ifndef SCD_TRANSPORT_LINK_WRAPPER_H_
#define SCD_TRANSPORT_LINK_WRAPPER_H_

#include <memory>
#include <string>
#include <utility>

#include "transport/transport.h"

namespace scd::transport {

class LinkWrapper : public Link {
 public:
  explicit LinkWrapper(std::unique_ptr<Link> inner) : inner_(std::move(inner)) {}

  void Start(LinkHandler* handler) override { inner_->Start(handler); }
  absl::Status Send(Frame frame) override { return inner_->Send(std::move(frame)); }
  void Close() override { inner_->Close(); }
  void DropSession(uint64_t session_id) override { inner_->DropSession(session_id); }
  absl::Status Reshape(const LinkShape& shape) override { return inner_->Reshape(shape); }
  std::string Describe() const override { return inner_->Describe(); }

 protected:
  Link& inner() const { return *inner_; }
  // Destroys the wrapped link now (a decorator whose members the inner link's threads reach).
  void DestroyInner() { inner_.reset(); }

 private:
  std::unique_ptr<Link> inner_;
};

}  // namespace scd::transport

#endif  // SCD_TRANSPORT_LINK_WRAPPER_H_
