// llama.cpp (node-llama-cpp's prebuilt CPU binaries) as an engine, answering the measurement
// commands of the interleaved comparison (bench/peer/bench_peer.py) as bench/engine_bench.h's
// EngineSession answers them for this project's runtime:
//
//   node bench/peer/peer_engine.mjs '{"model": "x.gguf", "threads": 2, "vocab": 32000,
//                                     "decode_prompt": 64, "max_prompt": 1024}'
//
// prints "ready" once the model is loaded, then one line per command line on stdin, until EOF:
//   "ttft T FA"   seconds to the first token of a T-token prompt (a fresh sequence; its
//                 evaluation and the first greedy token); FA 1: flash attention on, 0: off
//   "batch B"     "ok" once B sequences are fed their decode prompts, in two contexts of B
//                 sequences each, flash attention off and on (replacing the last batch)
//   "steps N FA"  seconds N decode steps of the batch in that context took: every sequence's
//                 next token, all pending tokens of a step in one llama_decode (node-llama-cpp
//                 batches the sequences of a context evaluated together)
//   "rss"         resident bytes of this process
// Prompts: the same ids as PromptIds (bench/engine_bench.cc). Contexts take llama.cpp's defaults
// but for the thread count, flash attention, and a batch size that holds the longest prompt (a
// prompt is one llama_decode call). Greedy: temperature 0, no top-k/top-p cut.
import {readFileSync} from "node:fs";
import {createInterface} from "node:readline";
import {getLlama, LlamaLogLevel} from "node-llama-cpp";

const o = JSON.parse(process.argv[2]);
o.decode_prompt ??= 64;
o.max_prompt ??= 1024;
const headroom = 256;  // decode steps a batch may take

function rss() {
  const m = readFileSync("/proc/self/status", "utf8").match(/VmRSS:\s+(\d+) kB/);
  return m ? Number(m[1]) * 1024 : -1;
}
function promptIds(length, vocab, salt) {
  const span = BigInt(Math.max(1, vocab - 3)), ids = [];
  for (let i = 0; i < length; i++) {
    ids.push(3 + Number((BigInt(i) * 7919n + BigInt(salt) * 104729n + 13n) % span));
  }
  return ids;
}

const llama = await getLlama({gpu: false, build: "never", logLevel: LlamaLogLevel.error,
                              maxThreads: o.threads});
const model = await llama.loadModel({modelPath: o.model});
const greedy = {temperature: 0, topK: 0, topP: 1, minP: 0};
const batchSize = Math.max(512, o.max_prompt, o.decode_prompt);

function context(sequences, perSequence, flashAttention) {
  return model.createContext({sequences, contextSize: sequences * perSequence, batchSize,
                              threads: o.threads, flashAttention});
}

const ttftContexts = new Map();  // flash attention -> a one-sequence context
async function ttft(length, flash) {
  if (!ttftContexts.has(flash)) {
    ttftContexts.set(flash, await context(1, o.max_prompt + 16, flash));
  }
  const seq = ttftContexts.get(flash).getSequence();
  const ids = promptIds(length, o.vocab, 0);
  const t0 = performance.now();
  const it = seq.evaluate(ids, greedy);
  await it.next();
  const seconds = (performance.now() - t0) / 1e3;
  await it.return();
  seq.dispose();
  return seconds;
}

let batch = null;  // flash attention -> {ctx, gens}
async function startBatch(size) {
  if (batch) {
    for (const {ctx, gens} of batch.values()) {
      for (const g of gens) await g.return();
      await ctx.dispose();
    }
  }
  batch = new Map();
  for (const flash of [false, true]) {
    const ctx = await context(size, o.decode_prompt + headroom, flash);
    const gens = [];
    for (let b = 0; b < size; b++) {
      gens.push(ctx.getSequence().evaluate(promptIds(o.decode_prompt, o.vocab, b),
                                           {...greedy, yieldEogToken: true}));
    }
    await Promise.all(gens.map((g) => g.next()));  // the prompts, and each first token
    batch.set(flash, {ctx, gens});
  }
}

async function steps(n, flash) {
  const {gens} = batch.get(flash);
  const t0 = performance.now();
  for (let i = 0; i < n; i++) await Promise.all(gens.map((g) => g.next()));
  return (performance.now() - t0) / 1e3;
}

process.stdout.write("ready\n");
for await (const line of createInterface({input: process.stdin})) {
  const [command, a, b] = line.trim().split(/\s+/);
  let answer;
  if (command === "ttft") answer = (await ttft(Number(a), b === "1")).toFixed(6);
  else if (command === "batch") answer = (await startBatch(Number(a)), "ok");
  else if (command === "steps" && batch) answer = (await steps(Number(a), b === "1")).toFixed(6);
  else if (command === "rss") answer = String(rss());
  else if (command === "info") {
    const info = JSON.parse(readFileSync(new URL("./node_modules/node-llama-cpp/package.json",
                                                  import.meta.url), "utf8"));
    answer = JSON.stringify({package: `node-llama-cpp@${info.version}`, system: llama.systemInfo});
  } else {
    process.stderr.write(`not a command: '${line}'\n`);
    process.exit(1);
  }
  process.stdout.write(answer + "\n");
}
process.stdout.write("", () => process.exit(0));
