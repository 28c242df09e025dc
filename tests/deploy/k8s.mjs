// Kubernetes checks: render an overlay with `kubectl kustomize`, validate every object against
// its schema (kubernetes-models: Kubernetes 1.27's OpenAPI; @kubernetes-models/prometheus-operator
// for PodMonitor and ServiceMonitor) and for unknown fields (strict.mjs), then check what no
// schema says: probes, drain and grace periods, headless Services and the gateway's targets,
// non-root containers, resources, budgets and scraping.
import { execFileSync } from "node:child_process";
import { createRequire } from "node:module";
import path from "node:path";
import { parseAllDocuments } from "yaml";
import { effectiveSettings, parseFlatYaml, targets } from "./common.mjs";
import { strictCheck } from "./strict.mjs";

const require = createRequire(import.meta.url);
const kModelPackages = ["kubernetes-models", "@kubernetes-models/prometheus-operator"];

export function render(kubectl, dir) {
  const out = execFileSync(kubectl, ["kustomize", dir], {
    encoding: "utf8",
    stdio: ["ignore", "pipe", "pipe"],
  });
  return parseAllDocuments(out)
    .map((d) => {
      if (d.errors.length) throw new Error(`${dir}: ${d.errors[0].message}`);
      return d.toJS();
    })
    .filter((o) => o !== null);
}

function id(o) {
  return `${o.kind}/${o.metadata?.name}`;
}

// The kubernetes-models module that models apiVersion/kind, or null.
function modelSpec(apiVersion, kind) {
  for (const pkg of kModelPackages) {
    const spec = `${pkg}/${apiVersion}/${kind}`;
    try {
      require.resolve(spec);
      return spec;
    } catch {
      // not in this package
    }
  }
  return null;
}

export function validateSchemas(objects, where) {
  const errors = [];
  for (const o of objects) {
    const spec = modelSpec(o.apiVersion, o.kind);
    if (!spec) {
      errors.push(`${where}: ${id(o)}: no schema for ${o.apiVersion} ${o.kind}`);
      continue;
    }
    const Model = require(spec)[o.kind];
    try {
      new Model(structuredClone(o)).validate();
    } catch (e) {
      errors.push(`${where}: ${id(o)}: ${e.message}`);
    }
    for (const field of strictCheck(o, spec, o.kind)) {
      errors.push(`${where}: ${id(o)}: unknown field ${field}`);
    }
  }
  return errors;
}

function selects(selector, labels) {
  return (
    selector !== undefined &&
    Object.keys(selector).length > 0 &&
    Object.entries(selector).every(([k, v]) => labels?.[k] === v)
  );
}

// The tandem binary a container runs ("tandem-prefill"), or null.
function binaryOf(container) {
  const first = [...(container.command || []), ...(container.args || [])][0] || "";
  const name = path.posix.basename(first);
  return name.startsWith("tandem-") ? name : null;
}

function portNumber(container, port) {
  if (typeof port === "number") return port;
  return (container.ports || []).find((p) => p.name === port)?.containerPort;
}

function preStopSeconds(container) {
  const preStop = container.lifecycle?.preStop;
  if (!preStop) return null;
  if (preStop.sleep) return preStop.sleep.seconds;
  const cmd = preStop.exec?.command || [];
  if (cmd.length === 2 && path.posix.basename(cmd[0]) === "sleep") return Number(cmd[1]);
  return null;
}

// One Deployment's Tandem container with its config and effective settings.
function describe(objects, dep, flags, errors) {
  const where = `${id(dep)}`;
  const pod = dep.spec.template.spec;
  const tandem = pod.containers.filter((c) => binaryOf(c));
  if (tandem.length !== 1) {
    errors.push(
      `${where}: expected one container running a tandem-* binary, found ${tandem.length}`,
    );
    return null;
  }
  const container = tandem[0];
  const binary = binaryOf(container);
  const args = [...(container.command || []), ...(container.args || [])];
  const configArg = args.find((a) => a.startsWith("--config="));
  let config = new Map();
  if (!configArg) {
    errors.push(`${where}: ${binary} has no --config=FILE`);
  } else {
    const file = configArg.slice("--config=".length);
    const mount = (container.volumeMounts || []).find(
      (m) => m.mountPath === path.posix.dirname(file) && !m.subPath,
    );
    const volume = mount && (pod.volumes || []).find((v) => v.name === mount.name);
    const cm =
      volume?.configMap &&
      objects.find(
        (o) =>
          o.kind === "ConfigMap" &&
          o.metadata.name === volume.configMap.name &&
          o.metadata.namespace === dep.metadata.namespace,
      );
    const text = cm?.data?.[path.posix.basename(file)];
    if (text === undefined) {
      errors.push(
        `${where}: --config=${file} is not a key of a ConfigMap mounted at its directory`,
      );
    } else {
      try {
        config = parseFlatYaml(text, `${where} ${file}`);
      } catch (e) {
        errors.push(e.message);
      }
    }
  }
  const env = new Map(
    (container.env || []).map((e) => [e.name, e.value !== undefined ? e.value : null]),
  );
  const settings = effectiveSettings({ binary, config, env, flags, where, errors });
  return { dep, pod, container, binary, settings, env: container.env || [] };
}

function checkContainerBasics(where, pod, c, errors) {
  const sc = c.securityContext || {};
  const psc = pod.securityContext || {};
  if ((sc.runAsNonRoot ?? psc.runAsNonRoot) !== true) {
    errors.push(`${where}: container ${c.name} may run as root (runAsNonRoot is not true)`);
  }
  if ((sc.runAsUser ?? psc.runAsUser) === 0)
    errors.push(`${where}: container ${c.name} runs as uid 0`);
  if (sc.privileged) errors.push(`${where}: container ${c.name} is privileged`);
  if (sc.allowPrivilegeEscalation !== false) {
    errors.push(`${where}: container ${c.name} does not set allowPrivilegeEscalation: false`);
  }
  if (sc.readOnlyRootFilesystem !== true) {
    errors.push(`${where}: container ${c.name} has a writable root file system`);
  }
  if (!(sc.capabilities?.drop || []).includes("ALL")) {
    errors.push(`${where}: container ${c.name} does not drop ALL capabilities`);
  }
  const r = c.resources || {};
  for (const [kind, key] of [
    ["requests", "cpu"],
    ["requests", "memory"],
    ["limits", "memory"],
  ]) {
    if (r[kind]?.[key] === undefined)
      errors.push(`${where}: container ${c.name} has no ${kind}.${key}`);
  }
  const image = c.image || "";
  const tagged = /@sha256:/.test(image) || /:[^/]+$/.test(image);
  if (!tagged || image.endsWith(":latest")) {
    errors.push(`${where}: container ${c.name} image '${image}' has no version tag`);
  }
}

export function checkCluster(objects, where, flags) {
  const errors = [];
  const e = (msg) => errors.push(`${where}: ${msg}`);
  const namespaces = new Set(
    objects.filter((o) => o.kind !== "Namespace").map((o) => o.metadata.namespace),
  );
  if (namespaces.size !== 1 || namespaces.has(undefined)) {
    e(`objects should share one namespace, found ${[...namespaces].join(", ")}`);
  }
  const deployments = objects.filter((o) => o.kind === "Deployment");
  const services = objects.filter((o) => o.kind === "Service");
  const byBinary = new Map();
  const local = [];
  for (const dep of deployments) {
    const d = describe(objects, dep, flags, local);
    if (!d) continue;
    if (byBinary.has(d.binary)) e(`two Deployments run ${d.binary}`);
    byBinary.set(d.binary, d);
  }
  errors.push(...local.map((m) => `${where}: ${m}`));
  for (const binary of ["tandem-prefill", "tandem-decode", "tandem-gateway"]) {
    if (!byBinary.has(binary)) e(`no Deployment runs ${binary}`);
  }

  for (const d of byBinary.values()) {
    const w = id(d.dep);
    const { container: c, pod, settings } = d;
    for (const cc of pod.containers) checkContainerBasics(`${where}: ${w}`, pod, cc, errors);
    for (const ic of pod.initContainers || [])
      checkContainerBasics(`${where}: ${w}`, pod, ic, errors);

    // Listening: on every address, on the ports the probes and Services use.
    if (settings.get("host") !== "0.0.0.0") {
      e(`${w}: host is '${settings.get("host")}': probes and peers reach the pod IP, use 0.0.0.0`);
    }
    const httpPort = Number(settings.get("http_port"));
    const grpcPort = Number(settings.get("grpc_port"));
    if (portNumber(c, "http") !== httpPort)
      e(`${w}: container port "http" is not http_port ${httpPort}`);
    if (portNumber(c, "grpc") !== grpcPort)
      e(`${w}: container port "grpc" is not grpc_port ${grpcPort}`);

    // Probes on the service's own endpoints.
    for (const [probe, wanted] of [
      ["readinessProbe", "/readyz"],
      ["livenessProbe", "/healthz"],
    ]) {
      const get = c[probe]?.httpGet;
      if (!get) {
        e(`${w}: ${c.name} has no HTTP ${probe}`);
      } else {
        if (get.path !== wanted) e(`${w}: ${probe} path is ${get.path}, want ${wanted}`);
        if (portNumber(c, get.port) !== httpPort)
          e(`${w}: ${probe} is not on http_port ${httpPort}`);
      }
    }
    if (c.startupProbe?.httpGet && !["/healthz", "/readyz"].includes(c.startupProbe.httpGet.path)) {
      e(`${w}: startupProbe path is ${c.startupProbe.httpGet.path}`);
    }

    // Drain: preStop sleep, then SIGTERM and --drain_timeout_s, all inside the grace period.
    const sleep = preStopSeconds(c);
    const drain = Number(settings.get("drain_timeout_s"));
    const grace = pod.terminationGracePeriodSeconds ?? 30;
    if (sleep === null)
      e(`${w}: ${c.name} has no preStop sleep (endpoints must drop the pod first)`);
    if (!(grace > drain + (sleep || 0))) {
      e(
        `${w}: terminationGracePeriodSeconds ${grace} is not above preStop ${sleep || 0} s + drain_timeout_s ${drain} s`,
      );
    }

    // The model is read from a volume.
    const model = settings.get("model") || "";
    const modelMount = (c.volumeMounts || []).find(
      (m) => model === m.mountPath || model.startsWith(`${m.mountPath}/`),
    );
    const modelVolume = modelMount && (pod.volumes || []).find((v) => v.name === modelMount.name);
    if (!modelVolume || modelVolume.configMap)
      e(`${w}: --model=${model} is not on a mounted volume`);

    // KV transfer: peers connect to the advertised --kv_listen_host, so it must be the pod IP.
    if (d.binary === "tandem-prefill" || d.binary === "tandem-decode") {
      const name = `TANDEM_${d.binary.slice(7).toUpperCase()}_KV_LISTEN_HOST`;
      const entry = d.env.find((x) => x.name === name);
      if (entry?.valueFrom?.fieldRef?.fieldPath !== "status.podIP") {
        e(`${w}: ${name} must come from the downward API (status.podIP): KV peers connect to it`);
      }
    }

    // Budgets.
    const labels = d.dep.spec.template.metadata.labels;
    const pdbs = objects.filter(
      (o) => o.kind === "PodDisruptionBudget" && selects(o.spec.selector?.matchLabels, labels),
    );
    if (pdbs.length === 0) e(`${w}: no PodDisruptionBudget selects its pods`);
    if (!selects(d.dep.spec.selector?.matchLabels, labels))
      e(`${w}: its selector does not match its pods`);
  }

  // prefill and decode: headless Services, named by the gateway's targets.
  const gateway = byBinary.get("tandem-gateway");
  for (const [binary, flag] of [
    ["tandem-prefill", "prefill"],
    ["tandem-decode", "decode"],
  ]) {
    const d = byBinary.get(binary);
    if (!d) continue;
    const labels = d.dep.spec.template.metadata.labels;
    const mine = services.filter((s) => selects(s.spec.selector, labels));
    if (mine.length === 0) e(`no Service selects the ${binary} pods`);
    for (const s of mine) {
      if (s.spec.clusterIP !== "None")
        e(`Service ${s.metadata.name} (${binary}) is not headless (clusterIP: None)`);
    }
    if (!gateway) continue;
    const list = targets(gateway.settings.get(flag));
    if (list.length === 0) e(`the gateway's --${flag} is empty`);
    for (const t of list) {
      const named = mine.find((s) => {
        const ns = s.metadata.namespace;
        const n = s.metadata.name;
        const sameNs = ns === gateway.dep.metadata.namespace;
        return [
          `${n}.${ns}.svc.cluster.local`,
          `${n}.${ns}.svc`,
          `${n}.${ns}`,
          ...(sameNs ? [n] : []),
        ].includes(t.host);
      });
      if (!named) {
        e(`the gateway's --${flag} host ${t.host} names no headless Service of the ${binary} pods`);
      }
      // A headless name resolves to pod IPs: the gateway connects to the container port itself.
      if (t.port !== Number(d.settings.get("grpc_port"))) {
        e(
          `the gateway's --${flag} port ${t.port} is not ${binary}'s grpc_port ${d.settings.get("grpc_port")}`,
        );
      }
    }
  }
  if (gateway) {
    const labels = gateway.dep.spec.template.metadata.labels;
    const s = services.find((x) => selects(x.spec.selector, labels));
    if (!s) {
      e("no Service selects the gateway's pods");
    } else {
      for (const port of ["grpc", "http"]) {
        if (
          !s.spec.ports.some(
            (p) => p.targetPort === port || p.targetPort === portNumber(gateway.container, port),
          )
        ) {
          e(`Service ${s.metadata.name} does not expose the gateway's ${port} port`);
        }
      }
    }
  }

  // NetworkPolicies: ingress denied by default; prefill's and decode's gRPC ports (the internal
  // APIs) reachable from the gateway's pods only; prefill and decode reach each other (KV).
  const policies = objects.filter((o) => o.kind === "NetworkPolicy");
  const ingressPolicies = (labels) =>
    policies.filter(
      (p) =>
        (p.spec.policyTypes || ["Ingress"]).includes("Ingress") &&
        selects(p.spec.podSelector?.matchLabels || {}, labels),
    );
  if (
    !policies.some(
      (p) =>
        Object.keys(p.spec.podSelector?.matchLabels || {}).length === 0 &&
        !p.spec.podSelector?.matchExpressions &&
        (p.spec.policyTypes || []).includes("Ingress") &&
        (p.spec.ingress || []).length === 0,
    )
  ) {
    e("no NetworkPolicy denies ingress by default (podSelector: {}, policyTypes: [Ingress])");
  }
  const covers = (rule, container, number) =>
    !rule.ports ||
    rule.ports.length === 0 ||
    rule.ports.some((p) => {
      const port = portNumber(container, p.port);
      return p.endPort ? port <= number && number <= p.endPort : port === number;
    });
  const peerIs = (peer, d) =>
    !peer.ipBlock &&
    !peer.namespaceSelector &&
    peer.podSelector &&
    selects(peer.podSelector.matchLabels || {}, d.dep.spec.template.metadata.labels);
  for (const [binary, other] of [
    ["tandem-prefill", "tandem-decode"],
    ["tandem-decode", "tandem-prefill"],
  ]) {
    const d = byBinary.get(binary);
    const o = byBinary.get(other);
    if (!d) continue;
    const labels = d.dep.spec.template.metadata.labels;
    const grpcPort = Number(d.settings.get("grpc_port"));
    let kv = false;
    for (const p of ingressPolicies(labels)) {
      for (const rule of p.spec.ingress || []) {
        if (covers(rule, d.container, grpcPort)) {
          const from = rule.from || [];
          if (from.length === 0 || !from.every((peer) => gateway && peerIs(peer, gateway))) {
            e(
              `NetworkPolicy ${p.metadata.name} lets more than the gateway's pods reach ${binary}'s gRPC port ${grpcPort}`,
            );
          }
        }
        if (o && (rule.from || []).some((peer) => peerIs(peer, o))) kv = true;
      }
    }
    if (!kv) e(`no NetworkPolicy lets ${other}'s pods reach ${binary} (KV transfer)`);
  }

  // Metrics: a PodMonitor or ServiceMonitor reaching every Tandem pod's /metrics.
  const monitors = objects.filter((o) => o.kind === "PodMonitor" || o.kind === "ServiceMonitor");
  for (const d of byBinary.values()) {
    const labels = d.dep.spec.template.metadata.labels;
    const scraped = monitors.some((m) => {
      if (m.kind === "PodMonitor") {
        return (
          selects(m.spec.selector?.matchLabels, labels) &&
          m.spec.podMetricsEndpoints.some(
            (ep) =>
              portNumber(d.container, ep.port) === Number(d.settings.get("http_port")) &&
              (ep.path || "/metrics") === "/metrics",
          )
        );
      }
      const svc = services.find(
        (s) =>
          selects(s.spec.selector, labels) &&
          selects(m.spec.selector?.matchLabels, s.metadata.labels),
      );
      return (
        svc &&
        m.spec.endpoints.some((ep) =>
          svc.spec.ports.some(
            (p) =>
              p.name === ep.port &&
              portNumber(d.container, p.targetPort) === Number(d.settings.get("http_port")),
          ),
        )
      );
    });
    if (!scraped) e(`${id(d.dep)}: no PodMonitor/ServiceMonitor scrapes its /metrics`);
  }
  return errors;
}
