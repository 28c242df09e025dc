// Checks deploy/ offline (tests/deploy/CMakeLists.txt runs it through CTest):
//   node tests/deploy/check.mjs [--repo DIR] [--bin-dir DIR] [SECTION...]
// Sections (all by default):
//   k8s      render deploy/k8s/overlays/* and deploy/k8s/examples/* with `kubectl kustomize`
//            ($TANDEM_KUBECTL, default kubectl), validate every object (k8s.mjs), check the
//            whole (probes, drain, headless Services, targets, non-root, budgets, scraping)
//   compose  deploy/docker/compose.yaml (compose.mjs)
//   docker   deploy/docker/Dockerfile* and .dockerignore (docker.mjs)
//   selftest break the real manifests, compose file and Dockerfile in known ways and require
//            each break to be reported, so that the checks above cannot pass vacuously
//   scripts  the images' entry point and probe scripts, the probe against a real tandem-serve
//            (needs --bin-dir)
// With --bin-dir, config keys are checked against each binary's --help and its defaults used.
import { execFileSync, spawn } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
if (!fs.existsSync(path.join(here, "node_modules/kubernetes-models/package.json"))) {
  console.log(
    `FAIL ${here}/node_modules is missing: run scripts/setup.sh (npm ci in tests/deploy)`,
  );
  process.exit(1);
}
const { stringify } = await import("yaml");
const { checkCompose, loadCompose, validateComposeSchema } = await import("./compose.mjs");
const { Flags } = await import("./common.mjs");
const { checkDockerfile, lintDockerfile } = await import("./docker.mjs");
const { checkCluster, render, validateSchemas } = await import("./k8s.mjs");

const args = process.argv.slice(2);
function option(name) {
  const i = args.indexOf(name);
  if (i < 0) return null;
  const value = args[i + 1];
  args.splice(i, 2);
  return value;
}
const repo = path.resolve(option("--repo") || path.join(here, "../.."));
const binDir = option("--bin-dir");
const kubectl = process.env.TANDEM_KUBECTL || "kubectl";
const sections = args.length ? args : ["k8s", "compose", "docker", "selftest", "scripts"];
const flags = new Flags(
  binDir && fs.existsSync(path.join(binDir, "tandem-gateway")) ? binDir : null,
);

let failed = 0;
function report(section, errors, notes = []) {
  for (const n of notes) console.log(`  note: ${n}`);
  for (const err of errors) console.log(`  FAIL ${err}`);
  console.log(
    `${errors.length ? "FAIL" : "ok  "} ${section}${errors.length ? ` (${errors.length})` : ""}`,
  );
  failed += errors.length;
}

function kustomizations() {
  const out = [];
  for (const parent of ["deploy/k8s/overlays", "deploy/k8s/examples"]) {
    const dir = path.join(repo, parent);
    if (!fs.existsSync(dir)) continue;
    for (const name of fs.readdirSync(dir).sort()) {
      if (fs.existsSync(path.join(dir, name, "kustomization.yaml"))) out.push(`${parent}/${name}`);
    }
  }
  return out;
}

const rendered = new Map();
function renderAll() {
  for (const rel of kustomizations()) {
    if (!rendered.has(rel)) rendered.set(rel, render(kubectl, path.join(repo, rel)));
  }
  return rendered;
}

function checkK8s() {
  try {
    execFileSync(kubectl, ["version", "--client"], { stdio: "ignore" });
  } catch {
    report("k8s", [
      `cannot run '${kubectl} version --client': install kubectl (scripts/setup.sh installs Debian's kubernetes-client)`,
    ]);
    return;
  }
  if (!flags.binDir)
    console.log("  note: no --bin-dir: config keys are not checked against the binaries' flags");
  const all = renderAll();
  if (!all.has("deploy/k8s/overlays/cpu") || !all.has("deploy/k8s/overlays/gpu")) {
    report("k8s", ["deploy/k8s/overlays/cpu and deploy/k8s/overlays/gpu must both exist"]);
  }
  for (const [rel, objects] of all) {
    const kinds = {};
    for (const o of objects) kinds[o.kind] = (kinds[o.kind] || 0) + 1;
    console.log(
      `  ${rel}: ${objects.length} objects (${Object.entries(kinds)
        .map(([k, n]) => `${n} ${k}`)
        .join(", ")})`,
    );
    report(`k8s ${rel}: schemas`, validateSchemas(objects, rel));
    report(`k8s ${rel}: checks`, checkCluster(objects, rel, flags));
  }
}

function composeFile() {
  return path.join(repo, "deploy/docker/compose.yaml");
}

function checkComposeSection() {
  const file = composeFile();
  const doc = loadCompose(file);
  report("compose: Compose Specification schema", validateComposeSchema(doc, "compose.yaml"));
  const { errors, notes } = checkCompose(doc, file, flags);
  report("compose: checks", errors, notes);
}

function dockerfiles() {
  return fs
    .readdirSync(path.join(repo, "deploy/docker"))
    .filter((f) => /^Dockerfile(\..+)?$/.test(f))
    .sort()
    .map((f) => `deploy/docker/${f}`);
}

function checkDocker() {
  const files = dockerfiles();
  if (files.length === 0) report("docker", ["no deploy/docker/Dockerfile*"]);
  for (const rel of files) report(`docker ${rel}`, checkDockerfile(repo, rel));
  // Debian's Prometheus as an image (scripts/deploy_local.sh): linted only, no service contract.
  const prometheus = "deploy/prometheus/Dockerfile";
  report(`docker ${prometheus}`, lintDockerfile(repo, prometheus));
}

// Each mutation breaks one thing; the checks must report it, with the message given.
function selftest() {
  const errors = [];
  const expect = (what, found, pattern) => {
    if (!found.some((m) => pattern.test(m))) {
      errors.push(
        `${what}: no report matching ${pattern}${found.length ? `; got: ${found.join(" | ")}` : ""}`,
      );
    }
  };
  const cpu = renderAll().get("deploy/k8s/overlays/cpu");
  const find = (objects, kind, name) =>
    objects.find((o) => o.kind === kind && o.metadata.name === name);
  const container = (objects, name) =>
    find(objects, "Deployment", name).spec.template.spec.containers[0];
  const config = (objects, service) =>
    objects.find(
      (x) => x.kind === "ConfigMap" && x.metadata.name.startsWith(`tandem-${service}-config`),
    ).data;
  const k8sMutations = [
    [
      "a misspelt field (readinesProbe)",
      /unknown field .*\.readinesProbe$/,
      (o) => {
        const c = container(o, "tandem-decode");
        c.readinesProbe = c.readinessProbe;
        delete c.readinessProbe;
      },
    ],
    [
      'a wrong type (replicas: "2")',
      /replicas must be integer/,
      (o) => {
        find(o, "Deployment", "tandem-decode").spec.replicas = "2";
      },
    ],
    [
      "an unknown PodMonitor field",
      /unknown field spec\.podMetricsEndpoints\[0\]\.prt/,
      (o) => {
        find(o, "PodMonitor", "tandem").spec.podMetricsEndpoints[0].prt = "http";
      },
    ],
    [
      "decode's gRPC port open to every pod",
      /lets more than the gateway's pods reach tandem-decode's gRPC port/,
      (o) => {
        find(o, "NetworkPolicy", "tandem-decode").spec.ingress[0].from = [{ podSelector: {} }];
      },
    ],
    [
      "no default deny",
      /no NetworkPolicy denies ingress by default/,
      (o) => {
        find(o, "NetworkPolicy", "tandem-default-deny-ingress").spec.podSelector = {
          matchLabels: { app: "none" },
        };
      },
    ],
    [
      "liveness on /readyz",
      /livenessProbe path is \/readyz/,
      (o) => {
        container(o, "tandem-prefill").livenessProbe.httpGet.path = "/readyz";
      },
    ],
    [
      "grace period below the drain",
      /terminationGracePeriodSeconds 20 is not above/,
      (o) => {
        find(o, "Deployment", "tandem-gateway").spec.template.spec.terminationGracePeriodSeconds =
          20;
      },
    ],
    [
      "no preStop sleep",
      /has no preStop sleep/,
      (o) => {
        delete container(o, "tandem-decode").lifecycle;
      },
    ],
    [
      "a decode Service with a cluster IP",
      /tandem-decode .*is not headless/,
      (o) => {
        find(o, "Service", "tandem-decode").spec.clusterIP = "10.0.0.10";
      },
    ],
    [
      "a gateway target naming another Service",
      /--prefill host tandem-prefil\.tandem\S* names no headless Service/,
      (o) => {
        const data = config(o, "gateway");
        data["gateway.yaml"] = data["gateway.yaml"].replace(
          /^prefill: .*$/m,
          "prefill: tandem-prefil.tandem.svc.cluster.local:50051",
        );
      },
    ],
    [
      "a gateway target on the wrong port",
      /--decode port 8080 is not tandem-decode's grpc_port/,
      (o) => {
        const data = config(o, "gateway");
        data["gateway.yaml"] = data["gateway.yaml"].replace(
          /^decode: (.*):50051$/m,
          "decode: $1:8080",
        );
      },
    ],
    [
      "a container running as root",
      /may run as root/,
      (o) => {
        const pod = find(o, "Deployment", "tandem-gateway").spec.template.spec;
        pod.securityContext.runAsUser = 0;
        pod.securityContext.runAsNonRoot = false;
      },
    ],
    [
      "a KV address that is not the pod IP",
      /TANDEM_PREFILL_KV_LISTEN_HOST must come from the downward API/,
      (o) => {
        container(o, "tandem-prefill").env = [
          { name: "TANDEM_PREFILL_KV_LISTEN_HOST", value: "127.0.0.1" },
        ];
      },
    ],
    [
      "a service listening on loopback only",
      /host is '127\.0\.0\.1'/,
      (o) => {
        const data = config(o, "decode");
        data["decode.yaml"] = data["decode.yaml"].replace(/^host: .*$/m, "host: 127.0.0.1");
      },
    ],
    [
      "no memory limit",
      /has no limits\.memory/,
      (o) => {
        delete container(o, "tandem-decode").resources.limits;
      },
    ],
  ];
  if (flags.binDir) {
    k8sMutations.push([
      "a config key that is no flag",
      /config key 'prefill_chunks' is not a flag/,
      (o) => {
        config(o, "prefill")["prefill.yaml"] += "prefill_chunks: 256\n";
      },
    ]);
  }
  for (const [what, pattern, mutate] of k8sMutations) {
    const objects = structuredClone(cpu);
    mutate(objects);
    expect(
      `k8s: ${what}`,
      [...validateSchemas(objects, "mutated"), ...checkCluster(objects, "mutated", flags)],
      pattern,
    );
  }

  const composeMutations = [
    [
      "an unknown service key (comand)",
      /must NOT have additional properties \(comand\)/,
      (d) => {
        d.services.decode.comand = d.services.decode.command;
      },
    ],
    [
      "stop_grace_period below the drain",
      /stop_grace_period 5 s is not above/,
      (d) => {
        d.services.gateway.stop_grace_period = "5s";
      },
    ],
    [
      "a gateway target that is no service",
      /--decode host decoder is not a service/,
      (d) => {
        d.services.gateway.environment = { TANDEM_GATEWAY_DECODE: "decoder:50051" };
      },
    ],
    [
      "no KV address",
      /TANDEM_PREFILL_KV_LISTEN_HOST must be auto/,
      (d) => {
        delete d.services.prefill.environment;
      },
    ],
  ];
  for (const [what, pattern, mutate] of composeMutations) {
    const doc = loadCompose(composeFile());
    mutate(doc);
    expect(
      `compose: ${what}`,
      [...validateComposeSchema(doc, "mutated"), ...checkCompose(doc, composeFile(), flags).errors],
      pattern,
    );
  }

  const original = fs.readFileSync(path.join(repo, "deploy/docker/Dockerfile"), "utf8");
  const dockerMutations = [
    ["USER root", /runs as root/, (t) => t.replace(/^USER .*$/m, "USER root")],
    ["no HEALTHCHECK", /no HEALTHCHECK/, (t) => t.replace(/^HEALTHCHECK .*$/m, "")],
    [
      "a bad HEALTHCHECK duration",
      /missing unit in duration/,
      (t) => t.replace("--interval=10s", "--interval=10"),
    ],
    [
      "an unknown instruction",
      /Unknown instruction: WORKDIRR/,
      (t) => t.replace(/^WORKDIR /m, "WORKDIRR "),
    ],
    [
      "a COPY of a missing file",
      /probe-missing\.sh does not exist/,
      (t) => t.replace("deploy/docker/probe.sh", "deploy/docker/probe-missing.sh"),
    ],
    [
      "no libtandem_spm.so",
      /libtandem_spm\.so is not copied/,
      (t) => t.replace(/^COPY --from=build \/out\/lib\/ .*$/m, ""),
    ],
    [
      "a COPY that .dockerignore leaves out",
      /build\/bin\/x is left out by \.dockerignore/,
      (t) => t.replace(/^COPY deploy\/docker\/probe\.sh /m, "COPY build/bin/x "),
    ],
  ];
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "tandem-deploy-selftest-"));
  try {
    // The mutated Dockerfile is checked in a copy of the paths it names.
    for (const rel of [
      "scripts",
      "models/tiny-moe/config.json",
      "deploy/docker/entrypoint.sh",
      "deploy/docker/probe.sh",
      ".dockerignore",
    ]) {
      fs.cpSync(path.join(repo, rel), path.join(tmp, rel), { recursive: true });
    }
    fs.mkdirSync(path.join(tmp, "build/bin"), { recursive: true });
    fs.writeFileSync(path.join(tmp, "build/bin/x"), "");
    for (const [what, pattern, mutate] of dockerMutations) {
      fs.writeFileSync(path.join(tmp, "deploy/docker/Dockerfile"), mutate(original));
      expect(`docker: ${what}`, checkDockerfile(tmp, "deploy/docker/Dockerfile"), pattern);
    }
  } finally {
    fs.rmSync(tmp, { recursive: true, force: true });
  }
  report(
    `selftest: ${k8sMutations.length + composeMutations.length + dockerMutations.length} deliberate breaks, each reported`,
    errors,
  );
}

async function checkScripts() {
  const errors = [];
  const entrypoint = path.join(repo, "deploy/docker/entrypoint.sh");
  const probe = path.join(repo, "deploy/docker/probe.sh");
  const run = (file, argv, env) => {
    try {
      return {
        code: 0,
        out: execFileSync(file, argv, {
          env: { ...process.env, ...env },
          encoding: "utf8",
          stdio: ["ignore", "pipe", "pipe"],
        }),
      };
    } catch (x) {
      return { code: x.status, out: `${x.stdout || ""}${x.stderr || ""}` };
    }
  };
  const auto = run(entrypoint, ["sh", "-c", 'echo "$TANDEM_DECODE_KV_LISTEN_HOST"'], {
    TANDEM_DECODE_KV_LISTEN_HOST: "auto",
  });
  if (auto.code !== 0 || !/^\d+\.\d+\.\d+\.\d+$/.test(auto.out.trim())) {
    errors.push(
      `entrypoint.sh: TANDEM_DECODE_KV_LISTEN_HOST=auto gave '${auto.out.trim()}' (status ${auto.code})`,
    );
  }
  const kept = run(entrypoint, ["sh", "-c", 'echo "$TANDEM_PREFILL_KV_LISTEN_HOST"'], {
    TANDEM_PREFILL_KV_LISTEN_HOST: "10.1.2.3",
  });
  if (kept.out.trim() !== "10.1.2.3")
    errors.push(`entrypoint.sh changed an explicit address to '${kept.out.trim()}'`);
  if (run(entrypoint, [], {}).code !== 2)
    errors.push("entrypoint.sh without a command should exit 2");

  if (!flags.binDir) {
    console.log("  note: no --bin-dir: the probe is not tried against a running service");
  } else {
    const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "tandem-deploy-probe-"));
    const portFile = path.join(tmp, "ports.json");
    const child = spawn(
      path.join(flags.binDir, "tandem-serve"),
      [
        `--model=${path.join(repo, "models/tiny-moe")}`,
        "--grpc_port=0",
        "--http_port=0",
        `--port_file=${portFile}`,
        "--drain_timeout_s=1",
      ],
      { stdio: ["ignore", "ignore", "pipe"] },
    );
    let log = "";
    child.stderr.on("data", (d) => (log += d));
    const exited = new Promise((resolve) =>
      child.on("exit", (code, signal) => resolve({ code, signal })),
    );
    try {
      const deadline = Date.now() + 60_000;
      while (!fs.existsSync(portFile) && Date.now() < deadline && child.exitCode === null) {
        await new Promise((r) => setTimeout(r, 100));
      }
      if (!fs.existsSync(portFile)) throw new Error(`tandem-serve did not start: ${log}`);
      const port = String(JSON.parse(fs.readFileSync(portFile, "utf8")).http_port);
      let ready = run(probe, ["/readyz"], { TANDEM_PROBE_PORT: port });
      for (let i = 0; i < 50 && ready.code !== 0; ++i) {
        await new Promise((r) => setTimeout(r, 100));
        ready = run(probe, ["/readyz"], { TANDEM_PROBE_PORT: port });
      }
      if (ready.code !== 0)
        errors.push(`probe.sh /readyz on a ready tandem-serve: status ${ready.code}: ${ready.out}`);
      if (run(probe, ["/healthz"], { TANDEM_PROBE_PORT: port }).code !== 0)
        errors.push("probe.sh /healthz failed");
      if (run(probe, ["/no-such-path"], { TANDEM_PROBE_PORT: port }).code !== 1)
        errors.push("probe.sh passed a 404");
    } catch (x) {
      errors.push(x.message);
    } finally {
      child.kill("SIGTERM");
      const { code } = await exited;
      if (code !== 0) errors.push(`tandem-serve exited ${code} after SIGTERM (want 0: drained)`);
      fs.rmSync(tmp, { recursive: true, force: true });
    }
    const closed = run(probe, ["/readyz"], { TANDEM_PROBE_PORT: "1" });
    if (closed.code !== 1) errors.push("probe.sh passed with nothing listening");
  }
  report("scripts: entry point and probe", errors);
}

for (const section of sections) {
  try {
    if (section === "k8s") checkK8s();
    else if (section === "compose") checkComposeSection();
    else if (section === "docker") checkDocker();
    else if (section === "selftest") selftest();
    else if (section === "scripts") await checkScripts();
    else report(section, [`unknown section '${section}'`]);
  } catch (x) {
    report(section, [x.stack || String(x)]);
  }
}
// A rendered overlay, for reading: TANDEM_DEPLOY_DUMP=DIR writes each as DIR/<name>.yaml.
if (process.env.TANDEM_DEPLOY_DUMP) {
  for (const [rel, objects] of rendered) {
    const out = path.join(process.env.TANDEM_DEPLOY_DUMP, `${rel.replace(/\//g, "_")}.yaml`);
    fs.mkdirSync(path.dirname(out), { recursive: true });
    fs.writeFileSync(out, objects.map((o) => stringify(o)).join("---\n"));
  }
}
console.log(failed ? `deploy checks: ${failed} problem(s)` : "deploy checks: all passed");
process.exit(failed ? 1 : 0);
