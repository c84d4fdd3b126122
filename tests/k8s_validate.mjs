// Validates every object of a rendered Kustomize overlay (deploy/k8s) against the Kubernetes
// schemas of npm's kubernetes-models (and its KEDA and Prometheus Operator packages for the two
// custom resources): field types, required fields, enums. What it cannot see: unknown fields
// (the schemas allow them) and what only a cluster's admission would refuse.
//   node tests/k8s_validate.mjs NODE_MODULES_DIR RENDERED.yaml
import fs from "fs";
import path from "path";
import { pathToFileURL } from "url";

const [modules, rendered] = process.argv.slice(2);
const load = (name) => import(pathToFileURL(path.join(modules, name)).href);
const YAML = (await load("yaml/dist/index.js")).default;
const groups = {
  "v1": "kubernetes-models/v1/index.js",
  "apps/v1": "kubernetes-models/apps/v1/index.js",
  "policy/v1": "kubernetes-models/policy/v1/index.js",
  "networking.k8s.io/v1": "kubernetes-models/networking.k8s.io/v1/index.js",
  "autoscaling/v2": "kubernetes-models/autoscaling/v2/index.js",
  "keda.sh/v1alpha1": "@kubernetes-models/keda/keda.sh/v1alpha1/index.js",
  "monitoring.coreos.com/v1": "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/index.js",
};
let bad = 0;
let n = 0;
for (const doc of YAML.parseAllDocuments(fs.readFileSync(rendered, "utf8"))) {
  const obj = doc.toJS();
  if (!obj) continue;
  ++n;
  const where = `${obj.kind} ${obj.metadata?.name}`;
  if (!groups[obj.apiVersion]) {
    console.log(`${where}: no schema for ${obj.apiVersion}`);
    ++bad;
    continue;
  }
  const group = await load(groups[obj.apiVersion]);  // ES module or CommonJS
  const Kind = group[obj.kind] ?? group.default?.[obj.kind];
  if (!Kind) {
    console.log(`${where}: no kind ${obj.kind} in ${obj.apiVersion}`);
    ++bad;
    continue;
  }
  if (obj.kind === "Secret" && obj.data) {
    // kustomize wraps a long value's base64 over lines; the API server's decoder skips line
    // breaks, the schema's "byte" format does not.
    for (const key of Object.keys(obj.data)) obj.data[key] = obj.data[key].replace(/\n/g, "");
  }
  try {
    new Kind(obj).validate();
  } catch (e) {
    console.log(`${where}: ${e.message}`);
    ++bad;
  }
}
console.log(`${rendered}: ${n} objects, ${bad} invalid`);
process.exit(bad || n === 0 ? 1 : 0);
