// A GGUF file's metadata and tensor descriptions as node-llama-cpp's own GGUF parser reads them
// (an independent reader for tests/gguf_export_test.cc): one JSON object on stdout.
//   node bench/peer/gguf_info.mjs FILE.gguf
import {readGgufFileInfo} from "node-llama-cpp";

const info = await readGgufFileInfo(process.argv[2], {readTensorInfo: true, logWarnings: false});
const tensors = info.fullTensorInfo.map((t) => ({name: t.name, dims: t.dimensions.map(Number),
                                                 type: t.ggmlType, offset: Number(t.offset)}));
process.stdout.write(JSON.stringify({version: info.version, metadata: info.metadata, tensors},
                                    (k, v) => typeof v === "bigint" ? Number(v) : v) + "\n");
