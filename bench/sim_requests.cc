#include "bench/sim_requests.h"

#include <algorithm>
#include <cmath>

#include "base/prefix_hash.h"

namespace scd::bench {
uint64_t SimKey(std::initializer_list<uint64_t> words) {
  uint64_t h = 0x9e3779b97f4a7c15ULL;
  for (uint64_t w : words) {
    h ^= w + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ULL;
    h = (h ^ (h >> 27)) * 0x94d049bb133111ebULL;
    h ^= h >> 31;
  }
  return h;
}

SimRequests::SimRequests(const SimWorkload& workload) : w_(workload), rng_(workload.seed) {
  for (const SimMix& m : w_.mix) total_weight_ += m.weight;
}

int64_t SimRequests::Length(const SimLengths& l) {
  switch (l.kind) {
    case SimLengthKind::kFixed:
      return l.tokens;
    case SimLengthKind::kUniform:
      return std::uniform_int_distribution<int64_t>(l.min, l.max)(rng_);
    case SimLengthKind::kLogNormal: {
      // mean = exp(mu + sigma^2 / 2)
      const double mu = std::log(l.mean) - l.sigma * l.sigma / 2;
      const double v = std::lognormal_distribution<double>(mu, l.sigma)(rng_);
      return std::clamp<int64_t>(std::llround(v), l.min, l.max);
    }
  }
  return l.tokens;
}

double SimRequests::Gap() {
  switch (w_.arrivals) {
    case SimArrivals::kConstant:
      return 1 / w_.rate;
    case SimArrivals::kPoisson:
      return std::exponential_distribution<double>(w_.rate)(rng_);
    case SimArrivals::kGamma:  // shape k, mean 1 / rate
      return std::gamma_distribution<double>(w_.burstiness, 1 / (w_.rate * w_.burstiness))(rng_);
  }
  return 1 / w_.rate;
}

bool SimRequests::Next(SimRequest* r) {
  now_s_ += Gap();
  if (now_s_ > w_.duration_s) return false;
  r->id = next_id_++;
  r->arrival_s = now_s_;
  r->prompt_tokens = Length(w_.prompt);
  r->output_tokens = Length(w_.output);
  double pick = std::uniform_real_distribution<double>(0, total_weight_)(rng_);
  r->mix = w_.mix.size() - 1;
  for (size_t i = 0; i < w_.mix.size(); ++i) {
    if (pick < w_.mix[i].weight) {
      r->mix = i;
      break;
    }
    pick -= w_.mix[i].weight;
  }
  r->tenant = std::uniform_int_distribution<int64_t>(0, w_.tenants - 1)(rng_);
  r->group = w_.prefix_groups > 0
                 ? std::uniform_int_distribution<int64_t>(0, w_.prefix_groups - 1)(rng_)
                 : -1;
  const int64_t blocks = (r->prompt_tokens - 1) / kPrefixBlockTokens;  // the prefix's full blocks
  const int64_t shared =
      r->group < 0 ? 0
                   : static_cast<int64_t>(w_.prefix_share * static_cast<double>(r->prompt_tokens)) /
                         kPrefixBlockTokens;
  r->blocks.clear();
  r->shared_blocks = std::min(shared, blocks);
  for (int64_t b = 0; b < blocks; ++b) {
    r->blocks.push_back(b < shared
                            ? SimKey({1, static_cast<uint64_t>(r->tenant),
                                      static_cast<uint64_t>(r->group), static_cast<uint64_t>(b)})
                            : SimKey({2, r->id, static_cast<uint64_t>(b)}));
  }
  return true;
}

std::vector<SimRequest> DrawSimRequests(const SimWorkload& workload) {
  SimRequests draw(workload);
  std::vector<SimRequest> out;
  SimRequest r;
  while (draw.Next(&r)) out.push_back(r);
  return out;
}

}  // namespace scd::bench
