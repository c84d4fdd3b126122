// llama.cpp (through node-llama-cpp) as an independent reference for this runtime's tokens.
//
//   node bench/peer/peer_greedy.mjs REQUEST.json > RESULT.json
//
// REQUEST: {"model": "file.gguf", "threads": 1, "kv_f32": true,
//           "continue": [[ids...], ...], "tokens": 64,     greedy continuations of these prompts
//           "score": [[ids...], ...]}                       next-token log-probabilities at every
//                                                            position of these prompts
// RESULT: {"peer": {...versions...},
//          "continuations": [{"tokens": [...], "margins": [...]}],   margin: ln(p1 / p2) of the
//                                                                     chosen token over the next
//          "scores": [[{"top": id, "logits": {id: logit - logit(top), ...}}, ...], ...]}
//
// Greedy: temperature 0, no top-k/top-p cut, end-of-generation tokens yielded and continued
// past (this runtime's ignore_eos), the KV cache in float32 when kv_f32 (llama.cpp's default is
// F16: with F32 both engines compute in float32 throughout). Probabilities come from llama.cpp's
// own softmax of its logits; differences of their logarithms are differences of logits.
import {readFileSync} from "node:fs";
import {getLlama, LlamaLogLevel} from "node-llama-cpp";

const request = JSON.parse(readFileSync(process.argv[2], "utf8"));
const threads = request.threads ?? 1;
const llama = await getLlama({gpu: false, build: "never", logLevel: LlamaLogLevel.error,
                              maxThreads: threads});
const model = await llama.loadModel({modelPath: request.model});
const longest = Math.max(1, ...[...(request.continue ?? []), ...(request.score ?? [])]
    .map((p) => p.length)) + (request.tokens ?? 0) + 8;
const contextOptions = {contextSize: Math.max(64, longest), batchSize: Math.max(64, longest),
                        threads, sequences: 1, flashAttention: request.flash_attention ?? false};
if (request.kv_f32) {
  contextOptions.experimentalKvCacheKeyType = "F32";
  contextOptions.experimentalKvCacheValueType = "F32";
}
const context = await model.createContext(contextOptions);
const sequence = context.getSequence();
const greedy = {temperature: 0, topK: 0, topP: 1, minP: 0};

// The top two of a probability map: [token, ln(p1 / p2)].
function topTwo(probabilities) {
  let first = -1, p1 = -1, p2 = 0;
  for (const [token, p] of probabilities) {
    if (p > p1) {
      p2 = p1;
      p1 = p;
      first = token;
    } else if (p > p2) {
      p2 = p;
    }
  }
  return [first, p2 > 0 ? Math.log(p1 / p2) : Infinity];
}

const continuations = [];
for (const prompt of request.continue ?? []) {
  await sequence.clearHistory();
  const tokens = [], margins = [];
  const it = sequence.evaluateWithMetadata(prompt, {probabilities: true},
                                           {...greedy, yieldEogToken: true});
  for (let i = 0; i < request.tokens; i++) {
    const {value, done} = await it.next();
    if (done) break;
    tokens.push(value.token);
    margins.push(topTwo(value.probabilities)[1]);
  }
  await it.return();
  continuations.push({tokens, margins});
}

const scores = [];
for (const prompt of request.score ?? []) {
  await sequence.clearHistory();
  const out = await sequence.controlledEvaluate(
      prompt.map((t) => [t, {generateNext: {probabilities: true, options: greedy}}]));
  scores.push(out.map((o) => {
    const probabilities = o.next.probabilities;
    const [top] = topTwo(probabilities);
    const pTop = probabilities.get(top);
    const logits = {};
    for (const [token, p] of probabilities) {
      if (p > 0) logits[token] = Math.log(p / pTop);
    }
    return {top, logits};
  }));
}

const info = JSON.parse(readFileSync(new URL("./node_modules/node-llama-cpp/package.json",
                                              import.meta.url), "utf8"));
await context.dispose();
await model.dispose();
// Exit only once stdout has taken everything: on a pipe the write is asynchronous.
process.stdout.write(JSON.stringify({
  peer: {package: `node-llama-cpp@${info.version}`, build: llama.buildType,
         cpu: llama.systemInfo}, continuations, scores}) + "\n", () => process.exit(0));
