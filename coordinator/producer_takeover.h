// The takeover policy: a consumer whose transfer lost its producer (GenerateEvent.transfer_lost,
// layers [0, k) of its cache rebuilt) gets the rest from another live producer of the same model
// (PrefillTarget.layer_begin = k) or prefills the prompt itself, whichever is predicted to reach
// the first token sooner (codec/ttft_model.h, from the nodes' measured speeds as auto mode reads
// them, coordinator/auto_choice.h):
//   the rest:  the other producer's whole prefill (each layer's codes need the layers before),
//              overlapped with the bytes of layers [k, L) on the link and the consumer's rebuild
//              of those layers ((L - k) / L of a whole rebuild);
//   local:     the consumer's own prefill of the whole prompt (the fallback drops what was
//              rebuilt).
// A restart from layer k never costs more than one from layer 0 (the same prefill, fewer bytes
// and less rebuild), so the rest is the only restart weighed. With no speed measured on either
// node the rest is taken (the codes were the route's choice); a request that forbids the
// fallback always takes it (the only way it can finish).
// Thread-safety: pure functions.
#ifndef SCD_COORDINATOR_PRODUCER_TAKEOVER_H_
#define SCD_COORDINATOR_PRODUCER_TAKEOVER_H_

#include <string>

#include "codec/ttft_model.h"
#include "coordinator/auto_choice.h"
#include "scd/v1/inference.pb.h"

namespace scd::coordinator {

struct TakeoverDecision {
  bool take_over = false;
  TtftPrediction rest, local;  // as predicted (zeros when nothing could be predicted)
  std::string reason;          // for logs and the consumer's TransferFailed
};

// `in`: the candidate producer and the consumer as routing sees them (prompt_tokens set; their
// prefix caches ignored: the takeover computes the whole prompt, the fallback too); `lost`: the
// consumer's notice; `fallback_allowed`: the request allows the consumer's own prefill.
TakeoverDecision ChooseTakeover(const AutoInputs& in, const v1::TransferLost& lost,
                                bool fallback_allowed);

}  // namespace scd::coordinator

#endif  // SCD_COORDINATOR_PRODUCER_TAKEOVER_H_
