#!/usr/bin/env node
// Reference side of tokenizer_diff_test: runs the official Hugging Face `tokenizers` library
// (npm package) over the inputs the C++ test generated and writes what it produced.
//
// usage: node tokenizer_reference.js TOKENIZER_JSON IN_JSON OUT_JSON MODULE_DIR
//   IN_JSON:  {"texts": [string...], "id_seqs": [[id...]...]}
//   OUT_JSON: {"version": string, "vocab_size": n,
//              "texts": [{"ids": [...], "ids_plain": [...], "decoded": s, "decoded_skip": s}...],
//              "id_seqs": [{"decoded": s, "decoded_skip": s}...]}
// ids_plain is encode(text, add_special_tokens=false); decoded* decode `ids` with
// skip_special_tokens false / true.
'use strict';
const fs = require('fs');
const path = require('path');

async function main() {
  const [tokenizerPath, inPath, outPath, moduleDir] = process.argv.slice(2);
  if (!moduleDir) {
    console.error('usage: node tokenizer_reference.js TOKENIZER_JSON IN_JSON OUT_JSON MODULE_DIR');
    process.exit(2);
  }
  const version = JSON.parse(fs.readFileSync(path.join(moduleDir, 'package.json'), 'utf8')).version;
  const {Tokenizer} = require(path.resolve(moduleDir));
  const tokenizer = Tokenizer.fromFile(tokenizerPath);
  const input = JSON.parse(fs.readFileSync(inPath, 'utf8'));

  const withSpecial = await tokenizer.encodeBatch(input.texts, {addSpecialTokens: true});
  const plain = await tokenizer.encodeBatch(input.texts, {addSpecialTokens: false});
  const ids = withSpecial.map((e) => Array.from(e.getIds()));
  const decoded = await tokenizer.decodeBatch(ids, false);
  const decodedSkip = await tokenizer.decodeBatch(ids, true);
  const texts = ids.map((seq, i) => ({
    ids: seq,
    ids_plain: Array.from(plain[i].getIds()),
    decoded: decoded[i],
    decoded_skip: decodedSkip[i],
  }));

  const seqDecoded = await tokenizer.decodeBatch(input.id_seqs, false);
  const seqDecodedSkip = await tokenizer.decodeBatch(input.id_seqs, true);
  const idSeqs = seqDecoded.map((d, i) => ({decoded: d, decoded_skip: seqDecodedSkip[i]}));

  fs.writeFileSync(outPath, JSON.stringify({
    version,
    vocab_size: tokenizer.getVocabSize(true),
    texts,
    id_seqs: idSeqs,
  }));
}

main().catch((err) => {
  console.error(err && err.stack ? err.stack : String(err));
  process.exit(1);
});
