// Compose checks: deploy/docker/compose.yaml against the Compose Specification's JSON schema
// (the copy dclint ships, schemas/compose.schema.json), then what the schema cannot know:
// each Tandem service's config file (mounted, its keys real flags, listening on every
// address), stop grace period above the drain, KV addresses, the gateway's targets, and that
// the files it mounts and builds from exist.
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";
import Ajv2019 from "ajv/dist/2019.js";
import { parse } from "yaml";
import { effectiveSettings, parseFlatYaml, targets } from "./common.mjs";

const require = createRequire(import.meta.url);
// Mounted files that other parts of deploy/ provide (Prometheus and Grafana configuration):
// reported when absent, not failed.
const kProvidedElsewhere = ["../prometheus/", "../grafana/"];

export function loadCompose(file) {
  return parse(fs.readFileSync(file, "utf8"), { merge: true });
}

// The schema still names itself and some definitions with draft-04's "id", which ajv's 2019-09
// mode refuses; nothing refers to those names.
function dropDraft4Ids(schema) {
  if (Array.isArray(schema)) {
    schema.forEach(dropDraft4Ids);
  } else if (schema && typeof schema === "object") {
    if (typeof schema.id === "string") delete schema.id;
    for (const [key, value] of Object.entries(schema)) {
      if (["properties", "patternProperties", "definitions", "$defs"].includes(key)) {
        Object.values(value).forEach(dropDraft4Ids);
      } else {
        dropDraft4Ids(value);
      }
    }
  }
}

let validateSchema = null;
export function validateComposeSchema(doc, where) {
  if (!validateSchema) {
    const schema = JSON.parse(
      fs.readFileSync(require.resolve("dclint/schemas/compose.schema.json"), "utf8"),
    );
    dropDraft4Ids(schema);
    const ajv = new Ajv2019({
      strict: false,
      allErrors: true,
      formats: { expose: true, duration: true },
    });
    validateSchema = ajv.compile(schema);
  }
  if (validateSchema(doc)) return [];
  return validateSchema.errors.map(
    (x) =>
      `${where}: ${x.instancePath || "/"} ${x.message}${x.params?.additionalProperty ? ` (${x.params.additionalProperty})` : ""}`,
  );
}

// ${VAR:-default} and ${VAR-default} -> default (the checks do not read the environment).
function interpolate(text) {
  return String(text).replace(/\$\{[A-Za-z_][A-Za-z0-9_]*:?-([^}]*)\}/g, "$1");
}

function seconds(duration) {
  const units = { h: 3600, m: 60, s: 1, ms: 1e-3, us: 1e-6 };
  let total = 0;
  const re = /(\d+(?:\.\d+)?)(h|ms|us|m|s)/g;
  let m;
  let used = 0;
  while ((m = re.exec(duration)) !== null) {
    total += Number(m[1]) * units[m[2]];
    used += m[0].length;
  }
  if (used !== duration.length) throw new Error(`cannot read duration '${duration}'`);
  return total;
}

function environment(service) {
  const env = new Map();
  const e = service.environment || {};
  if (Array.isArray(e)) {
    for (const item of e) {
      const i = item.indexOf("=");
      env.set(i < 0 ? item : item.slice(0, i), i < 0 ? null : item.slice(i + 1));
    }
  } else {
    for (const [k, v] of Object.entries(e)) env.set(k, v === null ? null : String(v));
  }
  return env;
}

function bindMounts(service) {
  return (service.volumes || [])
    .map((v) => {
      if (typeof v === "string") {
        const [source, target] = v.split(":");
        return { source, target };
      }
      return v.type === "bind" ? { source: v.source, target: v.target } : null;
    })
    .filter((v) => v && (v.source.startsWith(".") || v.source.startsWith("/")));
}

export function checkCompose(doc, file, flags) {
  const errors = [];
  const notes = [];
  const where = path.basename(file);
  const e = (msg) => errors.push(`${where}: ${msg}`);
  const dir = path.dirname(file);
  const services = doc.services || {};
  const tandem = new Map(); // service name -> {binary, settings}

  for (const [name, s] of Object.entries(services)) {
    for (const m of bindMounts(s)) {
      const source = path.resolve(dir, m.source);
      if (fs.existsSync(source)) continue;
      if (kProvidedElsewhere.some((p) => m.source.startsWith(p))) {
        notes.push(
          `${where}: ${name} mounts ${m.source}, not present yet (provided by the Prometheus/Grafana configuration)`,
        );
      } else {
        e(`${name} mounts ${m.source}, which does not exist`);
      }
    }
    if (s.build) {
      const context = path.resolve(dir, s.build.context || ".");
      const dockerfile = path.resolve(context, s.build.dockerfile || "Dockerfile");
      if (!fs.existsSync(dockerfile)) e(`${name} builds from ${dockerfile}, which does not exist`);
    }
    const image = interpolate(s.image || "");
    if (!/:[^/]+$/.test(image) || image.endsWith(":latest"))
      e(`${name}: image '${image}' has no version tag`);
    if (s.user !== undefined && /^(root|0)(:|$)/.test(String(s.user))) e(`${name} runs as root`);

    const command = Array.isArray(s.command) ? s.command : null;
    const binary = command && command[0].startsWith("tandem-") ? command[0] : null;
    if (!binary) continue;
    const configArg = command.find((a) => a.startsWith("--config="));
    let config = new Map();
    if (!configArg) {
      e(`${name}: ${binary} has no --config=FILE`);
    } else {
      const target = configArg.slice("--config=".length);
      const mount = bindMounts(s).find((m) => m.target === target);
      if (!mount) {
        e(`${name}: --config=${target} is not a mounted file`);
      } else if (fs.existsSync(path.resolve(dir, mount.source))) {
        try {
          config = parseFlatYaml(
            fs.readFileSync(path.resolve(dir, mount.source), "utf8"),
            mount.source,
          );
        } catch (x) {
          e(x.message);
        }
      }
    }
    const env = environment(s);
    const local = [];
    const settings = effectiveSettings({
      binary,
      config,
      env,
      flags,
      where: `${where}: ${name}`,
      errors: local,
    });
    errors.push(...local);
    tandem.set(name, { binary, settings, service: s, env });

    if (settings.get("host") !== "0.0.0.0")
      e(`${name}: host is '${settings.get("host")}', use 0.0.0.0`);
    const probePort = Number(env.get("TANDEM_PROBE_PORT") || 8080);
    if (Number(settings.get("http_port")) !== probePort) {
      e(
        `${name}: http_port ${settings.get("http_port")} is not the port the image's HEALTHCHECK probes (${probePort})`,
      );
    }
    const grace = seconds(String(s.stop_grace_period || "10s"));
    const drain = Number(settings.get("drain_timeout_s"));
    if (!(grace > drain))
      e(`${name}: stop_grace_period ${grace} s is not above drain_timeout_s ${drain} s`);
    if ((s.stop_signal || "SIGTERM") !== "SIGTERM") e(`${name}: stop_signal is not SIGTERM`);
    if (binary === "tandem-prefill" || binary === "tandem-decode") {
      const v = `TANDEM_${binary.slice(7).toUpperCase()}_KV_LISTEN_HOST`;
      const host = env.has(v) ? env.get(v) : settings.get("kv_listen_host");
      if (!host || host.startsWith("127."))
        e(`${name}: ${v} must be auto or an address other containers reach`);
    }
  }

  for (const binary of ["tandem-prefill", "tandem-decode", "tandem-gateway"]) {
    if (![...tandem.values()].some((t) => t.binary === binary)) e(`no service runs ${binary}`);
  }
  for (const [name, g] of tandem) {
    if (g.binary !== "tandem-gateway") continue;
    for (const [flag, binary] of [
      ["prefill", "tandem-prefill"],
      ["decode", "tandem-decode"],
    ]) {
      const list = targets(g.settings.get(flag));
      if (list.length === 0) e(`${name}: --${flag} is empty`);
      for (const t of list) {
        const peer = tandem.get(t.host);
        if (!peer || peer.binary !== binary) {
          e(`${name}: --${flag} host ${t.host} is not a service running ${binary}`);
        } else if (t.port !== Number(peer.settings.get("grpc_port"))) {
          e(
            `${name}: --${flag} port ${t.port} is not ${t.host}'s grpc_port ${peer.settings.get("grpc_port")}`,
          );
        }
        const dependsOn = g.service.depends_on || [];
        const deps = Array.isArray(dependsOn) ? dependsOn : Object.keys(dependsOn);
        if (peer && !deps.includes(t.host))
          e(`${name}: does not depend on ${t.host} (it resolves it at start-up)`);
      }
    }
  }
  return { errors, notes };
}
