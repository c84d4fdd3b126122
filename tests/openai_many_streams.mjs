// Many concurrent streamed completions through the official `openai` npm client (run by
// tests/many_streams_test.cc):
//   node openai_many_streams.mjs NODE_MODULES_DIR HOST:PORT STREAMS MAX_TOKENS REQUESTS_JSON
// REQUESTS_JSON: a file with [{model, prompt: [token ids], deadline_ms}], taken in turn
// (deadline_ms: the coordinator's OpenAI extension, sent in the body as given). Opens every stream at
// once (greedy, stream_options.include_usage), reads each to its end and checks it: a
// finish_reason, usage.completion_tokens == MAX_TOKENS, no error chunk. Prints one JSON line
// {completed, failures: [first few], most_open}; exits 0 (the C++ side judges).
import { createRequire } from 'node:module';
import { readFileSync } from 'node:fs';

const [modules, address, streamsText, maxTokensText, requestsFile] = process.argv.slice(2);
const require = createRequire(modules + '/');
const { default: OpenAI } = require('openai');
const client = new OpenAI({ baseURL: `http://${address}/v1`, apiKey: 'unused', maxRetries: 0,
                            timeout: 600000 });
const streams = Number(streamsText);
const maxTokens = Number(maxTokensText);
const requests = JSON.parse(readFileSync(requestsFile, 'utf8'));

let open = 0, mostOpen = 0;
async function one(i) {
  const { model, prompt, deadline_ms } = requests[i % requests.length];
  open += 1;
  mostOpen = Math.max(mostOpen, open);
  try {
    const stream = await client.completions.create({
      model, prompt, max_tokens: maxTokens, temperature: 0, stream: true,
      stream_options: { include_usage: true }, ...(deadline_ms ? { deadline_ms } : {}) });
    let finish = null, usage = null, text = '';
    for await (const chunk of stream) {
      if (chunk.error) return `stream ${i}: error chunk ${JSON.stringify(chunk.error)}`;
      const choice = chunk.choices?.[0];
      if (choice?.text) text += choice.text;
      if (choice?.finish_reason) finish = choice.finish_reason;
      if (chunk.usage) usage = chunk.usage;
    }
    if (!finish) return `stream ${i}: no finish_reason`;
    if (usage?.completion_tokens !== maxTokens) {
      return `stream ${i}: ${JSON.stringify(usage)} (want ${maxTokens} completion tokens)`;
    }
    return null;
  } catch (e) {
    return `stream ${i}: ${e.message}`;
  } finally {
    open -= 1;
  }
}

const results = await Promise.all(Array.from({ length: streams }, (_, i) => one(i)));
const failures = results.filter((r) => r !== null);
console.log(JSON.stringify({ completed: streams - failures.length, failures: failures.slice(0, 5),
                             most_open: mostOpen }));
