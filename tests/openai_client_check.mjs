// The official `openai` npm client against SCD Serve's OpenAI-compatible API (run by
// tests/openai_client_test.cc, and by scripts/k8s_test.sh):
//   node openai_client_check.mjs NODE_MODULES_DIR HOST:PORT MODEL PROMPT [SECOND_MODEL [MODE]]
// SECOND_MODEL: the fan-out's second target (default MODEL + '2': the test's consumers of the
// producer's own weights, whose raw-mode text equals their own; with other weights, the text of
// a raw transfer is not compared). MODE: every request's transfer mode (the SCD extension `mode`;
// default the server's, which in auto may choose differently from one request to the next).
// With $SCD_TLS_CA: over HTTPS, the server's certificate checked against that CA for the name
// $SCD_TLS_SERVER_NAME (default: HOST) -- a client that reaches a pod at its IP and checks it as
// the Service it stands for; the connections are undici's (from NODE_MODULES_DIR), with the CA and
// name as connect options.
// Checks models, completions (whole and streamed), chat completions (whole, streamed with usage,
// with logprobs) and the error cases; prints one JSON line {completion, chat} for the C++ side
// to compare against its own client; exits 1 with a message on the first failed check.
import { createRequire } from 'node:module';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';

const [modules, address, model, prompt, secondArg, modeArg] = process.argv.slice(2);
const mode = modeArg ? { mode: modeArg } : {};
const second = secondArg ?? model + '2';
const require = createRequire(modules + '/');
const { default: OpenAI, NotFoundError, BadRequestError } = require('openai');
let tls = {};
if (process.env.SCD_TLS_CA) {
  const { Agent, fetch } = require('undici');
  const dispatcher = new Agent({ connect: { ca: readFileSync(process.env.SCD_TLS_CA),
                                            servername: process.env.SCD_TLS_SERVER_NAME } });
  tls = { fetch: (url, init) => fetch(url, { ...init, dispatcher }) };
}
const scheme = process.env.SCD_TLS_CA ? 'https' : 'http';
const client = new OpenAI({ baseURL: `${scheme}://${address}/v1`, apiKey: 'unused', maxRetries: 0,
                            ...tls });

const models = await client.models.list();
assert.ok(models.data.some((m) => m.id === model), `models: ${JSON.stringify(models.data)}`);

// Completions: greedy, 12 tokens, whole and streamed give the same text.
const params = { model, prompt, max_tokens: 12, temperature: 0, ...mode };
const whole = await client.completions.create(params);
assert.equal(whole.object, 'text_completion');
assert.equal(whole.choices.length, 1);
assert.equal(whole.choices[0].finish_reason, 'length');
assert.equal(whole.usage.completion_tokens, 12);
assert.ok(whole.usage.prompt_tokens > 0);
assert.equal(whole.usage.total_tokens, whole.usage.prompt_tokens + 12);
let streamed = '';
for await (const chunk of await client.completions.create({ ...params, stream: true })) {
  streamed += chunk.choices[0]?.text ?? '';
}
assert.equal(streamed, whole.choices[0].text);

// Chat: streamed with usage, then whole; same text.
const messages = [{ role: 'system', content: 'You tell short stories.' },
                  { role: 'user', content: prompt }];
let chatText = '', role = null, finish = null, usage = null;
const stream = await client.chat.completions.create(
  { model, messages, max_tokens: 10, temperature: 0, stream: true, ...mode,
    stream_options: { include_usage: true } });
for await (const chunk of stream) {
  if (chunk.usage) usage = chunk.usage;
  const choice = chunk.choices[0];
  if (!choice) continue;
  role ??= choice.delta.role ?? null;
  chatText += choice.delta.content ?? '';
  finish = choice.finish_reason ?? finish;
}
assert.equal(role, 'assistant');
assert.equal(finish, 'length');
assert.equal(usage.completion_tokens, 10);
const chat = await client.chat.completions.create(
  { model, messages, max_tokens: 10, temperature: 0, ...mode });
assert.equal(chat.object, 'chat.completion');
assert.equal(chat.choices[0].message.role, 'assistant');
assert.equal(chat.choices[0].message.content, chatText);

// Logprobs: one entry per token, two alternatives each, the chosen token's among them.
const withLogprobs = await client.chat.completions.create(
  { model, messages, max_tokens: 5, temperature: 0, logprobs: true, top_logprobs: 2 });
const entries = withLogprobs.choices[0].logprobs.content;
assert.equal(entries.length, 5);
for (const entry of entries) {
  assert.equal(entry.top_logprobs.length, 2);
  assert.ok(entry.logprob <= 0);
  assert.equal(entry.top_logprobs[0].logprob, entry.logprob, 'greedy: the chosen is the top one');
}

// The SCD extensions: a fan-out to two consumers from one prefill (choices[i] is targets[i]'s)
// in an explicit mode, each choice with its scd block.
const fanout = await client.completions.create(
  { ...params, max_tokens: 6, targets: [model, second], mode: 'raw' });
assert.equal(fanout.choices.length, 2);
for (const [i, choice] of fanout.choices.entries()) {
  assert.equal(choice.index, i);
  assert.equal(choice.scd.mode, 'raw');
  assert.ok(choice.scd.payload_bytes > 0);
  if (secondArg === undefined) {  // raw codes of the same weights: exactly its own text
    assert.equal(choice.text, whole.choices[0].text.slice(0, choice.text.length));
  }
}
assert.equal(fanout.usage.completion_tokens, 12);

// Errors: an unknown model is 404, a bad parameter 400, each in OpenAI's error shape.
await assert.rejects(client.completions.create({ ...params, model: 'no-such-model' }),
                     (e) => e instanceof NotFoundError && /no-such-model/.test(e.message));
await assert.rejects(client.completions.create({ ...params, n: 3 }),
                     (e) => e instanceof BadRequestError && /n: only 1/.test(e.message));
await assert.rejects(client.chat.completions.create({ model, messages: [] }),
                     (e) => e instanceof BadRequestError && /messages/.test(e.message));
await assert.rejects(client.completions.create({ ...params, temperature: -1 }),
                     (e) => e instanceof BadRequestError && /temperature/.test(e.message));

console.log(JSON.stringify({ completion: whole.choices[0].text, chat: chatText }));
