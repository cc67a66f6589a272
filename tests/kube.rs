//! dovetail on a real kube-apiserver, kube-scheduler and kube-controller-manager
//! (`scripts/kube-test-env`, which `scripts/test` starts): the CRDs install, `dovetail
//! controller --cloud sim` provisions for a Deployment until the real scheduler binds every
//! pod, and `kubectl delete nodeclaim` drains and removes its node through the finalizers.
//!
//! The tests share one API server and each runs its own controller, which acts on every
//! NodePool: they take a lock and leave the cluster as they found it.
//!
//! Skipped, with a message, when `DOVETAIL_KUBE_ENV` (the directory `kube-test-env start`
//! wrote) is unset. With `DOVETAIL_CRDS=DIR` the tests install the CRD files in DIR instead of
//! dovetail's: Karpenter's own (`pkg/apis/crds/` of aws/karpenter-provider-aws), for a cluster
//! that migrates from Karpenter with its CRDs in place. The RBAC test applies the shipped
//! kustomization, dovetail's CRDs included.

// A test harness reads its environment and paces its waits by the wall clock.
#![allow(clippy::disallowed_methods)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

static SERIAL: Mutex<()> = Mutex::new(());

struct Env {
    kubeconfig: PathBuf,
    dir: PathBuf,
}

/// The dovetail binary the tests run: this build's, or `DOVETAIL_BIN` (scripts/ha-loadtest
/// points it at a release build: speed is measured on the build users run).
fn dovetail_bin() -> std::path::PathBuf {
    std::env::var_os("DOVETAIL_BIN").map_or_else(|| env!("CARGO_BIN_EXE_dovetail").into(), std::path::PathBuf::from)
}
fn env() -> Option<Env> {
    let Some(dir) = std::env::var_os("DOVETAIL_KUBE_ENV") else {
        eprintln!("skipped: DOVETAIL_KUBE_ENV is unset (run `scripts/kube-test-env start DIR` and source DIR/env)");
        return None;
    };
    let dir = PathBuf::from(dir);
    Some(Env { kubeconfig: dir.join("kubeconfig"), dir })
}

/// The environment, held by this test alone and reset, with the CRDs installed and Karpenter's
/// getting-started NodePool and EC2NodeClass applied (kubectl's output returned); `None`, with
/// the skip logged, when no environment is set.
fn getting_started() -> Option<(Env, std::sync::MutexGuard<'static, ()>, String)> {
    let env = env()?;
    let serial = SERIAL.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    env.reset();
    env.install_crds();
    let applied = env.apply(include_str!("fixtures/getting-started.yaml"));
    Some((env, serial, applied))
}

#[allow(clippy::disallowed_methods, reason = "the checkout the test runs in, from cargo at run time")]
fn repo() -> &'static Path {
    // The checkout the tests run in (cargo sets it at run time), not the one the binary was
    // built in: a build cache moved between checkouts keeps the old path in `env!`.
    static REPO: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    REPO.get_or_init(|| {
        std::path::PathBuf::from(
            std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").to_string()),
        )
    })
}

impl Env {
    /// Runs kubectl; returns stdout, or panics with stderr.
    fn kubectl(&self, args: &[&str]) -> String {
        let out = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--request-timeout=60s")
            .args(args)
            .output()
            .expect("kubectl runs");
        assert!(out.status.success(), "kubectl {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// kubectl reading stdin.
    fn apply(&self, yaml: &str) -> String {
        let (ok, out, err) = self.try_apply(yaml);
        assert!(ok, "kubectl apply: {err}");
        out
    }

    /// `kubectl apply` of `yaml`: whether it succeeded, its stdout and its stderr.
    fn try_apply(&self, yaml: &str) -> (bool, String, String) {
        use std::io::Write;
        let mut child = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(["apply", "-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("kubectl runs");
        child.stdin.take().expect("stdin").write_all(yaml.as_bytes()).expect("write");
        let out = child.wait_with_output().expect("kubectl ends");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    fn json(&self, args: &[&str]) -> serde_json::Value {
        let mut a = args.to_vec();
        a.extend(["-o", "json"]);
        serde_json::from_str(&self.kubectl(&a)).expect("kubectl prints JSON")
    }

    fn items(&self, args: &[&str]) -> Vec<serde_json::Value> {
        self.json(args)["items"].as_array().cloned().unwrap_or_default()
    }

    /// Waits (at most `limit`) until `done` holds; panics with `what` and the last state.
    fn wait(&self, what: &str, limit: Duration, done: impl FnMut(&Env) -> Result<(), String>) {
        self.wait_explained(what, limit, done, |_| String::new());
    }

    /// [`Env::wait`], and when it gives up, what `explain` says of the cluster then (read
    /// once, not at every look).
    fn wait_explained(
        &self,
        what: &str,
        limit: Duration,
        mut done: impl FnMut(&Env) -> Result<(), String>,
        explain: impl Fn(&Env) -> String,
    ) {
        let start = Instant::now();
        let mut last = String::new();
        for _ in 0..10_000 {
            match done(self) {
                Ok(()) => return,
                Err(state) => last = state,
            }
            if start.elapsed() >= limit {
                panic!("{what}: not within {limit:?}; last: {last}\n{}", explain(self));
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        panic!("{what}: gave up; last: {last}\n{}", explain(self));
    }

    /// Waits (at most `limit`) until `want` pods of `ns` are Running (and not on `off`, when
    /// given); the controller's log goes into the failure.
    fn wait_running(&self, what: &str, ns: &str, want: usize, off: Option<&str>, ctl: &Controller, limit: Duration) {
        self.wait(what, limit, |e| {
            let running = e
                .items(&["get", "pods", "-n", ns])
                .iter()
                .filter(|p| p["status"]["phase"] == "Running" && off.is_none_or(|n| p["spec"]["nodeName"] != n))
                .count();
            if running == want { Ok(()) } else { Err(format!("{running}/{want} running\n{}", ctl.log())) }
        });
    }

    /// Leaves the cluster as a test expects to find it, whatever a test before left (a failed
    /// one stops before its clean-up): no NodePool, no NodeClaim and no sim node, their
    /// finalizers taken off since no controller runs now to honour them.
    fn reset(&self) {
        // A failed test's namespace (its pods would look like the next test's): its pods
        // force-deleted (their nodes are going, no kubelet would confirm) and it deleted.
        // (One a clean-up is deleting already goes on its own.)
        let stale: Vec<String> = self
            .items(&["get", "namespaces"])
            .iter()
            .filter(|n| n["status"]["phase"] == "Active")
            .map(name_of)
            .filter(|n| n != "default" && !n.starts_with("kube-"))
            .collect();
        for ns in &stale {
            self.kubectl(&["delete", "pods", "--all", "-n", ns, "--force", "--grace-period=0", "--wait=false"]);
            self.kubectl(&["delete", "namespace", ns, "--wait=false"]);
        }
        self.wait("stale namespaces gone", Duration::from_secs(60), |e| {
            let left: Vec<String> =
                e.items(&["get", "namespaces"]).iter().map(name_of).filter(|n| stale.contains(n)).collect();
            if left.is_empty() { Ok(()) } else { Err(format!("{left:?}")) }
        });
        // Owned before owners: the garbage collector deletes nothing from under the patches.
        self.unfinalize_and_delete("nodes", &["-l", "dovetail.sh/sim-node"]);
        let karpenter = self.kubectl(&["api-resources", "--api-group=karpenter.sh", "-o", "name"]);
        for kind in ["nodeclaims", "nodepools"] {
            if karpenter.contains(kind) {
                self.unfinalize_and_delete(kind, &[]);
            }
        }
        self.wait("the cluster reset", Duration::from_secs(30), |e| {
            let nodes = e.items(&["get", "nodes", "-l", "dovetail.sh/sim-node"]).len();
            let claims = if karpenter.contains("nodeclaims") { e.items(&["get", "nodeclaims"]).len() } else { 0 };
            if nodes + claims == 0 { Ok(()) } else { Err(format!("{nodes} sim nodes, {claims} NodeClaims left")) }
        });
    }

    fn unfinalize_and_delete(&self, kind: &str, selector: &[&str]) {
        let mut args = vec!["get", kind];
        args.extend(selector);
        for o in self.items(&args) {
            let name = name_of(&o);
            let unfinalize = r#"{"metadata":{"finalizers":null}}"#;
            self.kubectl(&["patch", kind, &name, "--type=merge", "-p", unfinalize]);
            self.kubectl(&["delete", kind, &name, "--ignore-not-found", "--wait=false"]);
        }
    }

    /// Applies a kustomization holding the CRDs, or a directory of CRD files, and waits until
    /// they are Established: `scripts/install-crds`, which asks the server its version (one
    /// older than 1.25 does not know their CEL rules, so kubectl must not validate them).
    fn apply_crds(&self, dir: &Path) {
        let out = Command::new(repo().join("scripts/install-crds"))
            .arg(dir)
            .env("KUBECONFIG", &self.kubeconfig)
            .output()
            .expect("scripts/install-crds runs");
        assert!(out.status.success(), "install-crds {}: {}", dir.display(), String::from_utf8_lossy(&out.stderr));
    }

    /// dovetail's CRDs, or with `DOVETAIL_CRDS=DIR` the CRD files in DIR: Karpenter's own, to run
    /// the suite on a cluster migrating from Karpenter (the objects are the same).
    fn install_crds(&self) {
        match std::env::var_os("DOVETAIL_CRDS") {
            Some(dir) => self.apply_crds(Path::new(&dir)),
            None => self.apply_crds(&repo().join("deploy/crds")),
        }
    }
}

/// A controller process, killed when dropped.
struct Controller {
    child: Child,
    log: PathBuf,
    /// Where it serves `/metrics`.
    metrics_addr: String,
}

impl Controller {
    fn start(env: &Env, name: &str, extra: &[&str]) -> Controller {
        Controller::start_as(env, name, &env.kubeconfig, extra)
    }

    /// A controller authenticating with `kubeconfig`.
    fn start_as(env: &Env, name: &str, kubeconfig: &Path, extra: &[&str]) -> Controller {
        Controller::spawn(env, name, kubeconfig, &[&["--cloud", "sim"], extra].concat(), &[])
    }

    /// A controller launching in EC2 (`--cloud aws`) at `endpoint`, with the credentials the
    /// SDK reads from its environment.
    fn start_aws(env: &Env, name: &str, endpoint: &str, extra: &[&str]) -> Controller {
        Controller::spawn_aws(env, name, "controller", endpoint, extra)
    }

    /// `dovetail SUBCOMMAND` (`controller` or `node-agent`) with `--cloud aws` at `endpoint`.
    fn spawn_aws(env: &Env, name: &str, subcommand: &str, endpoint: &str, extra: &[&str]) -> Controller {
        // The nodes' CA: the test server's certificate (its kubeconfig skips verification,
        // which gives the controller's connection none to pass on).
        let ca = Command::new("base64")
            .args(["-w0"])
            .arg(env.dir.join("certs/apiserver.crt"))
            .output()
            .expect("base64 runs");
        let ca = String::from_utf8_lossy(&ca.stdout).into_owned();
        let args = [
            &["--cloud", "aws", "--aws-endpoint", endpoint, "--region", "us-east-1", "--cluster-ca-bundle", &ca],
            extra,
        ]
        .concat();
        let creds = [("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing")];
        Controller::run(env, name, subcommand, &env.kubeconfig, &args, &creds)
    }

    fn spawn(env: &Env, name: &str, kubeconfig: &Path, args: &[&str], envs: &[(&str, &str)]) -> Controller {
        Controller::run(env, name, "controller", kubeconfig, args, envs)
    }

    fn run(
        env: &Env,
        name: &str,
        subcommand: &str,
        kubeconfig: &Path,
        args: &[&str],
        envs: &[(&str, &str)],
    ) -> Controller {
        let log = env.dir.join(format!("{name}.log"));
        let file = std::fs::File::create(&log).expect("log file");
        let port = |n: u16| format!("127.0.0.1:{}", free_port().unwrap_or(n));
        let metrics_addr = port(18080);
        let extra = args;
        let mut command = Command::new(dovetail_bin());
        // Hermetic: a developer's AWS profile, region or endpoints do not reach the controller.
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("AWS_") {
                command.env_remove(&key);
            }
        }
        let child = command
            .args([subcommand, "--cluster-name", "dovetail-test"])
            // Plain logs: the tests read them (timestamps included).
            .env("NO_COLOR", "1")
            .env("DOVETAIL_LOG_FORMAT", "text")
            .envs(envs.iter().copied())
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(["--metrics-addr", &metrics_addr, "--health-addr", &port(18081)])
            .args(extra)
            // DOVETAIL_TEST_LOG overrides the controllers' filter (debugging a test).
            .env("RUST_LOG", std::env::var("DOVETAIL_TEST_LOG").unwrap_or_else(|_| "info,kube_client=error".into()))
            .stdout(file.try_clone().expect("log file"))
            .stderr(file)
            .spawn()
            .expect("dovetail controller starts");
        Controller { child, log, metrics_addr }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `GET /metrics`, checked by `promtool check metrics` (Prometheus's own parser and lint).
    fn scrape(&self) -> String {
        let out = Command::new("curl")
            .args(["-sf", "--max-time", "10", &format!("http://{}/metrics", self.metrics_addr)])
            .output()
            .expect("curl runs");
        assert!(out.status.success(), "GET /metrics failed\n{}", self.log());
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let promtool = std::env::var("DOVETAIL_PROMTOOL")
            .expect("DOVETAIL_PROMTOOL names promtool (scripts/test installs it in ~/.cache/dovetail/bin)");
        let mut child = Command::new(&promtool)
            .args(["check", "metrics"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("promtool runs");
        {
            use std::io::Write as _;
            let mut stdin = child.stdin.take().expect("promtool's stdin");
            stdin.write_all(text.as_bytes()).expect("the scrape goes to promtool");
        }
        let checked = child.wait_with_output().expect("promtool ends");
        assert!(
            checked.status.success(),
            "promtool check metrics: {}{}",
            String::from_utf8_lossy(&checked.stdout),
            String::from_utf8_lossy(&checked.stderr)
        );
        text
    }

    /// The sum of the samples of `metric` whose labels contain `labels` (e.g. `kind="conflict"`;
    /// "" for a metric without labels).
    fn metric(&self, metric: &str, labels: &str) -> f64 {
        let out = Command::new("curl")
            .args(["-sf", "--max-time", "10", &format!("http://{}/metrics", self.metrics_addr)])
            .output()
            .expect("curl runs");
        assert!(out.status.success(), "GET /metrics failed\n{}", self.log());
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| {
                (l.starts_with(&format!("{metric}{{")) || l.starts_with(&format!("{metric} "))) && l.contains(labels)
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        if let Err(e) = self.child.kill() {
            eprintln!("killing the controller: {e}");
        }
        if let Err(e) = self.child.wait() {
            eprintln!("reaping the controller: {e}");
        }
    }
}

/// A free port on 127.0.0.1 (never the same one twice in this process), for a server a test
/// starts. Taken below the kernel's ephemeral range (`ip_local_port_range`, 32768 and up by
/// default): a port the kernel hands out for one of the many outgoing connections (moto, the
/// API server, the peers) between this check and the server's bind would make it "address
/// already in use". A run of the three-node HA test failed so.
fn free_port() -> Option<u16> {
    static GIVEN: Mutex<Vec<u16>> = Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    // Spread by process, so two test processes rarely try the same ports first.
    let start = 20_000 + (std::process::id() % 500) as u16 * 20;
    for port in (start..32_000).chain(20_000..start) {
        if given.contains(&port) {
            continue;
        }
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            given.push(port);
            return Some(port);
        }
    }
    None
}

fn deployment(namespace: &str, name: &str, replicas: u32, cpu: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Namespace
metadata:
  name: {namespace}
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {name}
  namespace: {namespace}
spec:
  replicas: {replicas}
  selector:
    matchLabels: {{app: {name}}}
  template:
    metadata:
      labels: {{app: {name}}}
    spec:
      terminationGracePeriodSeconds: 0
      containers:
        - name: pause
          image: registry.k8s.io/pause:3.9
          resources:
            requests:
              cpu: "{cpu}"
"#
    )
}

fn name_of(o: &serde_json::Value) -> String {
    o["metadata"]["name"].as_str().unwrap_or_default().to_string()
}

/// Deletes the test's objects, with the controller still running so that NodeClaims go through
/// their finalizers, and waits until no NodeClaim and no sim node is left.
fn clean_up(env: &Env, namespace: &str, ctl: &Controller) {
    env.kubectl(&["delete", "namespace", namespace, "--wait=false"]);
    env.kubectl(&["delete", "nodepools", "--all", "--wait=false"]);
    env.kubectl(&["delete", "nodeclaims", "--all", "--wait=false"]);
    env.wait("every NodeClaim and sim node gone", Duration::from_secs(90), |e| {
        let claims = e.items(&["get", "nodeclaims"]).len();
        let nodes = e.items(&["get", "nodes", "-l", "dovetail.sh/sim-node"]).len();
        if claims + nodes == 0 { Ok(()) } else { Err(format!("{claims} nodeclaims, {nodes} nodes\n{}", ctl.log())) }
    });
    env.kubectl(&["delete", "ec2nodeclasses", "--all"]);
}

#[test]
fn a_deployment_gets_nodeclaims_nodes_and_every_pod_bound_by_the_real_scheduler() {
    let Some((env, _serial, applied)) = getting_started() else { return };
    assert!(applied.contains("nodepool.karpenter.sh/default"), "{applied}");
    let ns = "scale-up";
    env.apply(&deployment(ns, "inflate", 20, "1"));
    env.wait("pods marked Unschedulable by kube-scheduler", Duration::from_secs(30), |e| {
        let pods = e.items(&["get", "pods", "-n", ns]);
        let marked = pods
            .iter()
            .filter(|p| {
                p["status"]["conditions"].as_array().into_iter().flatten().any(|c| c["reason"] == "Unschedulable")
            })
            .count();
        if pods.len() == 20 && marked == 20 { Ok(()) } else { Err(format!("{marked}/{} marked", pods.len())) }
    });
    let ctl = Controller::start(&env, "scale-up", &[]);
    env.wait_running("every pod Running on a sim node", ns, 20, None, &ctl, Duration::from_secs(60));

    let claims = env.items(&["get", "nodeclaims"]);
    let nodes = env.items(&["get", "nodes", "-l", "dovetail.sh/sim-node"]);
    assert!(!claims.is_empty(), "NodeClaims were made");
    assert_eq!(claims.len(), nodes.len(), "one node per NodeClaim");
    for c in &claims {
        let status = &c["status"];
        let provider = status["providerID"].as_str().unwrap_or_default();
        assert!(provider.starts_with("aws:///"), "{} has a provider id: {status}", name_of(c));
        let node = nodes.iter().find(|n| n["spec"]["providerID"] == provider).expect("its node registered");
        assert_eq!(status["nodeName"], node["metadata"]["name"], "{} names its node", name_of(c));
        let conds: Vec<(&str, &str)> = status["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| (c["type"].as_str().unwrap_or_default(), c["status"].as_str().unwrap_or_default()))
            .collect();
        for kind in ["Launched", "Registered", "Initialized", "Ready"] {
            assert!(conds.contains(&(kind, "True")), "{} is {kind}: {conds:?}", name_of(c));
        }
        assert_eq!(c["metadata"]["ownerReferences"][0]["kind"], "NodePool", "owned by its NodePool");
        for key in ["node.kubernetes.io/instance-type", "topology.kubernetes.io/zone", "karpenter.sh/capacity-type"] {
            let label = &c["metadata"]["labels"][key];
            assert!(label.is_string(), "{} is labelled {key}", name_of(c));
            assert_eq!(label, &node["metadata"]["labels"][key], "{} and its node agree on {key}", name_of(c));
        }
        let taints: Vec<&str> =
            node["spec"]["taints"].as_array().into_iter().flatten().filter_map(|t| t["key"].as_str()).collect();
        assert!(!taints.contains(&"karpenter.sh/unregistered"), "registered: {taints:?}");
        assert!(!taints.contains(&"node.kubernetes.io/not-ready"), "ready: {taints:?}");
        assert_eq!(node["metadata"]["labels"]["karpenter.sh/nodepool"], "default");
        let owner = &node["metadata"]["ownerReferences"][0];
        assert_eq!(
            (&owner["kind"], &owner["name"]),
            (&"NodeClaim".into(), &c["metadata"]["name"]),
            "owned by its claim"
        );
        assert_eq!(owner["uid"], c["metadata"]["uid"], "the owner is this claim, by uid");
        assert!(
            node["metadata"]["finalizers"].as_array().into_iter().flatten().any(|f| f == "karpenter.sh/termination"),
            "the node carries the termination finalizer"
        );
    }
    let bound: Vec<String> = env
        .items(&["get", "pods", "-n", ns])
        .iter()
        .map(|p| p["spec"]["nodeName"].as_str().unwrap_or_default().to_string())
        .collect();
    let node_names: Vec<String> = nodes.iter().map(name_of).collect();
    assert!(bound.iter().all(|n| node_names.contains(n)), "every pod on a sim node: {bound:?}");

    // Karpenter's series after the scale-up, with Karpenter's labels.
    let text = ctl.scrape();
    let sum = |series: &str, labels: &[(&str, &str)]| series_sum(&text, series, labels);
    let default = [("nodepool", "default")];
    let made = claims.len() as f64;
    let created = [("nodepool", "default"), ("reason", "provisioned"), ("min_values_relaxed", "false")];
    assert_eq!(
        sum("karpenter_nodeclaims_created_total", &created),
        made,
        "nodeclaims created = NodeClaims made\n{text}"
    );
    let joined = sum("karpenter_nodes_created_total", &default);
    assert!(joined <= nodes.len() as f64, "nodes created at most the nodes there are\n{text}");
    for node in &node_names {
        let alloc = [("node_name", node.as_str()), ("nodepool", "default"), ("resource_type", "cpu")];
        assert!(sum("karpenter_nodes_allocatable", &alloc) > 0.0, "{node}'s allocatable CPU\n{text}");
    }
    let running = [("namespace", ns), ("nodepool", "default"), ("phase", "Running")];
    assert_eq!(sum("karpenter_pods_state", &running), 20.0, "{text}");
    assert_eq!(sum("karpenter_nodepools_limit", &[("nodepool", "default"), ("resource_type", "cpu")]), 1000.0);
    assert!(sum("karpenter_nodepools_usage", &[("nodepool", "default"), ("resource_type", "cpu")]) >= 20.0);
    assert_eq!(sum("karpenter_scheduler_queue_depth", &[]), 0.0);
    let solves = sum("karpenter_scheduler_scheduling_duration_seconds_count", &[("controller", "provisioner")]);
    assert!(solves >= 1.0 && sum("karpenter_provisioner_scheduling_duration_seconds_count", &[]) == solves);
    let creates = [("controller", "nodeclaim.lifecycle"), ("method", "Create"), ("provider", "sim")];
    // One Create observed per NodeClaim, as Karpenter calls Create once per NodeClaim.
    assert!(sum("karpenter_cloudprovider_duration_seconds_count", &creates) >= made, "{text}");
    assert!(sum("dovetail_ledger_proposals_total", &[("command", "reserve"), ("outcome", "committed")]) >= 1.0);
    assert_eq!(sum("karpenter_cluster_state_synced", &[]), 1.0);
    // The dashboard and the alerts read what is served: the families this scrape has, and
    // those that appear only once their event happened (an error, an interruption), taken
    // from the same registry with each event recorded once.
    let events = dovetail_actors::metrics::Metrics::new();
    events.cloud_call("Create", "aws", 0.1, Some("InsufficientCapacityError"));
    events.launch_failed("us-east-1a", "spot", "insufficient_capacity");
    events.interruption_received("spot_interrupted");
    events.nodeclaim_disrupted("underutilized", "default", "spot");
    events.nodeclaim_terminated("default", "spot");
    events.nodes_changed("default", 1, 1);
    events.disruption_decision("delete", "underutilized", "single");
    let allowance = dovetail_core::ledger::Allowance { nodes: 10, disrupting: 0, allowed: 1, rate_left: None };
    events.budgets.set("default", dovetail_core::nodepool::DisruptionReason::Empty, &allowance);
    let missing = dashboard_and_alert_series_missing(&[&text, &events.encode()]);
    assert_eq!(missing, Vec::<String>::new(), "the dashboard and alerts read what is served\n{text}");

    // The scale-down: the Deployment to zero, the empty nodes consolidated away.
    env.kubectl(&[
        "patch",
        "nodepool",
        "default",
        "--type=merge",
        "-p",
        r#"{"spec":{"disruption":{"consolidateAfter":"0s"}}}"#,
    ]);
    env.kubectl(&["scale", "deployment", "inflate", "-n", ns, "--replicas=0"]);
    env.wait("every NodeClaim consolidated away", Duration::from_secs(120), |e| {
        let claims = e.items(&["get", "nodeclaims"]).len();
        let nodes = e.items(&["get", "nodes", "-l", "dovetail.sh/sim-node"]).len();
        if claims + nodes == 0 { Ok(()) } else { Err(format!("{claims} nodeclaims, {nodes} nodes\n{}", ctl.log())) }
    });
    // Nodes joining and leaving are counted from the controller's watch, a moment behind.
    let mut text = String::new();
    env.wait("the nodes' departures counted", Duration::from_secs(15), |_| {
        text = ctl.scrape();
        let left = series_sum(&text, "karpenter_nodes_terminated_total", &default);
        if left == nodes.len() as f64 { Ok(()) } else { Err(format!("{left} of {} counted\n{text}", nodes.len())) }
    });
    let sum = |series: &str, labels: &[(&str, &str)]| series_sum(&text, series, labels);
    assert_eq!(sum("karpenter_nodeclaims_terminated_total", &default), made, "{text}");
    assert_eq!(sum("karpenter_nodes_created_total", &default), nodes.len() as f64, "every join counted\n{text}");
    assert_eq!(sum("karpenter_nodeclaims_disrupted_total", &[("nodepool", "default"), ("reason", "empty")]), made);
    let decisions = [("decision", "delete"), ("reason", "empty")];
    assert!(sum("karpenter_voluntary_disruption_decisions_total", &decisions) >= 1.0, "{text}");
    assert_eq!(sum("karpenter_nodeclaims_created_total", &created), made, "no NodeClaim made by the scale-down");
    assert_eq!(sum("karpenter_pods_state", &[("namespace", ns)]), 0.0, "{text}");
    assert!(!text.contains("karpenter_nodes_allocatable{"), "no series left of nodes that are gone\n{text}");
    // The budget gauges, from the leader's rounds: the default budget (10%) of no node left
    // allows none for every reason, and none is counted against it.
    env.wait("the budget gauges of a pool with no node", Duration::from_secs(30), |_| {
        let text = ctl.scrape();
        let lines = ["Underutilized", "Empty", "Drifted"].map(|r| {
            let labels = format!("{{nodepool=\"default\",reason=\"{r}\"}} 0");
            [
                format!("karpenter_nodepools_allowed_disruptions{labels}"),
                format!("karpenter_nodepools_nodes_consuming_budgets{labels}"),
            ]
        });
        let missing: Vec<&String> = lines.iter().flatten().filter(|l| !text.lines().any(|t| t == l.as_str())).collect();
        if missing.is_empty() { Ok(()) } else { Err(format!("not served: {missing:?}\n{text}")) }
    });
    clean_up(&env, ns, &ctl);
}

/// The sum of the samples of `series` whose labels include `labels`, in a scrape.
fn series_sum(text: &str, series: &str, labels: &[(&str, &str)]) -> f64 {
    dovetail_actors::metrics::sum_of(text, series, labels)
}

/// The series the shipped Grafana dashboard (`deploy/grafana/dovetail.json`) and alert rules
/// (`deploy/prometheus/alerts.yaml`) query that none of the scrapes `texts` has a family for (a
/// histogram's `_bucket` read as its family): none, or panels are empty and alerts never fire.
fn dashboard_and_alert_series_missing(texts: &[&str]) -> Vec<String> {
    let dashboard = std::fs::read_to_string(repo().join("deploy/grafana/dovetail.json")).expect("the dashboard");
    let json: serde_json::Value = serde_json::from_str(&dashboard).expect("the dashboard is JSON");
    let mut exprs = Vec::new();
    for panel in json["panels"].as_array().into_iter().flatten() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            exprs.extend(target["expr"].as_str().map(str::to_string));
        }
    }
    assert!(exprs.len() > 20, "the dashboard's queries: {exprs:?}");
    let alerts = std::fs::read_to_string(repo().join("deploy/prometheus/alerts.yaml")).expect("the alerts");
    let rules: serde_yaml::Value = serde_yaml::from_str(&alerts).expect("the alerts are YAML");
    let before = exprs.len();
    for group in rules["groups"].as_sequence().into_iter().flatten() {
        for rule in group["rules"].as_sequence().into_iter().flatten() {
            exprs.extend(rule["expr"].as_str().map(str::to_string));
        }
    }
    assert!(exprs.len() - before >= 10, "the alerts' expressions: {exprs:?}");
    let families: BTreeSet<&str> = texts
        .iter()
        .flat_map(|t| t.lines())
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .collect();
    let mut missing = BTreeSet::new();
    for expr in &exprs {
        let words = expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'));
        for word in words.filter(|w| w.starts_with("karpenter_") || w.starts_with("dovetail_")) {
            let family = word.strip_suffix("_bucket").unwrap_or(word);
            if !families.contains(family) {
                missing.insert(word.to_string());
            }
        }
    }
    missing.into_iter().collect()
}

#[test]
fn a_controller_killed_mid_scale_up_and_restarted_makes_no_duplicate_nodeclaims_or_instances() {
    let Some((env, _serial, _)) = getting_started() else { return };
    let ns = "restart";
    env.apply(&deployment(ns, "inflate", 40, "1"));
    let first = Controller::start(&env, "restart-1", &[]);
    env.wait("the first NodeClaims", Duration::from_secs(30), |e| {
        let n = e.items(&["get", "nodeclaims"]).len();
        if n > 0 { Ok(()) } else { Err(format!("none yet\n{}", first.log())) }
    });
    let ready_since = |e: &Env| {
        let p = e.json(&["get", "nodepool", "default"]);
        let c = p["status"]["conditions"].as_array().and_then(|cs| cs.iter().find(|c| c["type"] == "Ready")).cloned();
        c.and_then(|c| Some((c["status"].as_str()?.to_string(), c["lastTransitionTime"].as_str()?.to_string())))
    };
    env.wait("the NodePool's Ready condition", Duration::from_secs(30), |e| match ready_since(e) {
        Some((status, _)) if status == "True" => Ok(()),
        other => Err(format!("{other:?}\n{}", first.log())),
    });
    let ready_before = ready_since(&env);
    // SIGKILL: no shutdown path runs.
    drop(first);
    // Past the second the first controller wrote the condition in, so that a rewritten
    // transition time would show.
    std::thread::sleep(Duration::from_millis(1100));
    let left = env.items(&["get", "nodeclaims"]);
    let made_before = left.len();
    // What the restarted controller rebuilds from: a NodeClaim that shows its instance says
    // what the instance is (written before the provider id).
    for c in left.iter().filter(|c| c["status"]["providerID"].is_string()) {
        let labels = &c["metadata"]["labels"];
        for key in ["node.kubernetes.io/instance-type", "topology.kubernetes.io/zone", "karpenter.sh/capacity-type"] {
            assert!(labels[key].is_string(), "{} shows its instance but not {key}: {labels}", name_of(c));
        }
    }
    let second = Controller::start(&env, "restart-2", &[]);
    env.wait_running("every pod Running after the restart", ns, 40, None, &second, Duration::from_secs(60));
    assert!(second.log().contains("taking over the NodeClaims"), "the restarted ledger adopted: {}", second.log());
    assert_eq!(ready_since(&env), ready_before, "the NodePool's Ready condition kept its transition time");
    let claims = env.items(&["get", "nodeclaims"]);
    let nodes = env.items(&["get", "nodes", "-l", "dovetail.sh/sim-node"]);
    assert!(claims.len() >= made_before, "the first controller's NodeClaims were kept");
    assert_eq!(claims.len(), nodes.len(), "one instance (node) per NodeClaim");
    let mut providers: Vec<&str> = claims.iter().filter_map(|c| c["status"]["providerID"].as_str()).collect();
    providers.sort_unstable();
    providers.dedup();
    assert_eq!(providers.len(), claims.len(), "each NodeClaim has its own instance");
    let pods = env.items(&["get", "pods", "-n", ns]);
    for n in &nodes {
        let name = name_of(n);
        let on = pods.iter().filter(|p| p["spec"]["nodeName"] == name.as_str()).count();
        assert!(on > 0, "node {name} was launched for pods and holds some (a duplicate would stay empty)");
    }
    clean_up(&env, ns, &second);
}

/// Three control nodes on one replicated ledger (Raft over HTTP on 127.0.0.1): only the
/// leader acts; `kill -9` of the leader during a scale-up hands over to another that finishes
/// it with no duplicate NodeClaim; the killed node restarts from its disk as a follower.
#[test]
fn three_control_nodes_fail_over_when_the_leader_is_killed_mid_scale_up_and_only_the_leader_acts() {
    let Some((env, _serial, _)) = getting_started() else { return };
    let secret = env.dir.join("raft-secret");
    std::fs::write(&secret, "a-test-secret-of-the-group\n").expect("secret written");
    let ports: Vec<u16> = (0..3).map(|_| free_port().expect("a free port")).collect();
    let peers = ports.iter().enumerate().map(|(i, p)| format!("{}=127.0.0.1:{p}", i + 1)).collect::<Vec<_>>().join(",");
    let start = |i: usize| {
        let dir = env.dir.join(format!("ha-{}", i + 1));
        let (id, addr) = ((i + 1).to_string(), format!("127.0.0.1:{}", ports[i]));
        let args = [
            "--node-id",
            id.as_str(),
            "--raft-addr",
            addr.as_str(),
            "--peers",
            peers.as_str(),
            "--data-dir",
            dir.to_str().expect("utf-8"),
            "--raft-secret-file",
            secret.to_str().expect("utf-8"),
        ];
        Controller::start(&env, &format!("ha-{}", i + 1), &args)
    };
    for i in 0..3 {
        if let Err(e) = std::fs::remove_dir_all(env.dir.join(format!("ha-{}", i + 1))) {
            assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "{e}");
        }
    }
    let mut nodes: Vec<Option<Controller>> = (0..3).map(|i| Some(start(i))).collect();
    let leading = |nodes: &[Option<Controller>]| -> Vec<usize> {
        let started = |c: &Controller| c.log().matches("leading, starting the control plane").count();
        let stopped = |c: &Controller| c.log().matches("no longer leading").count();
        (0..3).filter(|i| nodes[*i].as_ref().is_some_and(|c| started(c) > stopped(c))).collect()
    };
    let logs =
        |nodes: &[Option<Controller>]| nodes.iter().flatten().map(Controller::log).collect::<Vec<_>>().join("\n----\n");
    let mut first = None;
    env.wait("a leader acting", Duration::from_secs(30), |_| match leading(&nodes)[..] {
        [i] => {
            first = Some(i);
            Ok(())
        }
        ref other => Err(format!("leading: {other:?}\n{}", logs(&nodes))),
    });
    let first = first.expect("a leader");
    let ns = "ha";
    env.apply(&deployment(ns, "inflate", 60, "1"));
    env.wait("the first NodeClaims", Duration::from_secs(30), |e| {
        if e.items(&["get", "nodeclaims"]).is_empty() { Err(logs(&nodes)) } else { Ok(()) }
    });
    // Only a leader acts: a node starts its plane only in a term it leads, and no term has
    // two leaders. (On a loaded machine an election may move the lead before the kill, as
    // Raft allows: the node leading then is the one killed.)
    let terms = |log: &str, what: &str| -> Vec<u64> {
        log.lines()
            .filter(|l| l.contains(what))
            .filter_map(|l| l.split("raft.term=").nth(1)?.split_whitespace().next()?.parse().ok())
            .collect()
    };
    let mut led: Vec<u64> = Vec::new();
    for (i, n) in nodes.iter().enumerate() {
        let log = n.as_ref().map(Controller::log).unwrap_or_default();
        let leads = terms(&log, "leading, starting the control plane");
        for t in terms(&log, "control plane started") {
            assert!(leads.contains(&t), "node {} acted in term {t}, which it did not lead:\n{log}", i + 1);
        }
        led.extend(leads);
    }
    let mut once = led.clone();
    once.sort_unstable();
    once.dedup();
    assert_eq!(once.len(), led.len(), "a term led by two nodes: {led:?}\n{}", logs(&nodes));
    let mut first = first;
    env.wait("one leader acting before the kill", Duration::from_secs(30), |_| match leading(&nodes)[..] {
        [i] => {
            first = i;
            Ok(())
        }
        ref other => Err(format!("leading: {other:?}\n{}", logs(&nodes))),
    });
    // SIGKILL of the leader mid-scale-up.
    drop(nodes[first].take());
    let mut second = None;
    env.wait("another leader acting", Duration::from_secs(15), |_| match leading(&nodes)[..] {
        [i] if i != first => {
            second = Some(i);
            Ok(())
        }
        ref other => Err(format!("leading: {other:?}\n{}", logs(&nodes))),
    });
    let second = second.expect("a new leader");
    let acting = nodes[second].take().expect("running");
    env.wait_running("every pod Running after the fail-over", ns, 60, None, &acting, Duration::from_secs(90));
    let claims = env.items(&["get", "nodeclaims"]);
    let sim_nodes = env.items(&["get", "nodes", "-l", "dovetail.sh/sim-node"]);
    assert_eq!(claims.len(), sim_nodes.len(), "one instance (node) per NodeClaim");
    let pods = env.items(&["get", "pods", "-n", ns]);
    for n in &sim_nodes {
        let name = name_of(n);
        assert!(
            pods.iter().any(|p| p["spec"]["nodeName"] == name.as_str()),
            "node {name} holds no pod: a duplicate NodeClaim"
        );
    }
    // `dovetail ledger status` on the new leader: it leads, and its registry holds the claims.
    let addr = format!("127.0.0.1:{}", ports[second]);
    let status = |output: &str| {
        let out = Command::new(dovetail_bin())
            .args(["ledger", "status", "--addr", &addr, "--output", output, "--raft-secret-file"])
            .arg(&secret)
            .output()
            .expect("dovetail runs");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    // Only the leader says so in its metrics.
    for (i, n) in nodes.iter().enumerate() {
        if let Some(c) = n {
            assert_eq!(c.metric("dovetail_ledger_leader", ""), 0.0, "node {} is not the leader", i + 1);
        }
    }
    assert_eq!(acting.metric("dovetail_ledger_leader", ""), 1.0);
    assert!(acting.metric("dovetail_ledger_term", "") >= 2.0);
    let text = status("text");
    assert!(text.contains(&format!("node {} (leader)", second + 1)), "{text}");
    let json: serde_json::Value = serde_json::from_str(&status("json")).expect("JSON");
    let held: u64 = json["claims"].as_object().expect("claims by state").values().filter_map(|v| v.as_u64()).sum();
    assert_eq!(held, claims.len() as u64, "the ledger's registry holds every NodeClaim: {json}");
    assert_eq!(json["members"], serde_json::json!([1, 2, 3]));
    // The killed node comes back from its disk and follows.
    nodes[first] = Some(start(first));
    nodes[second] = Some(acting);
    env.wait("the restarted node serving raft", Duration::from_secs(30), |_| {
        let log = nodes[first].as_ref().map(Controller::log).unwrap_or_default();
        if log.contains("raft node serving") && !log.contains("the group is made") { Ok(()) } else { Err(log) }
    });
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(leading(&nodes), vec![second], "one leader acts\n{}", logs(&nodes));
    let restarted = nodes[first].as_ref().map(Controller::log).unwrap_or_default();
    assert!(!restarted.contains("control plane started"), "the restarted node acts as a follower only:\n{restarted}");
    let acting = nodes[second].take().expect("running");
    clean_up(&env, ns, &acting);
}

/// `policy/v1` where the server has it, else `policy/v1beta1` (Kubernetes 1.20).
/// Pods that mount a claim bound to a volume reachable from one zone only (a local volume's
/// node affinity), plus one whose claim does not exist.
fn pinned_volume_workload(ns: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Namespace
metadata:
  name: {ns}
---
apiVersion: v1
kind: PersistentVolume
metadata:
  name: {ns}-data
spec:
  capacity: {{storage: 1Gi}}
  accessModes: [ReadWriteMany]
  storageClassName: ""
  hostPath: {{path: /tmp/{ns}-data}}
  nodeAffinity:
    required:
      nodeSelectorTerms:
        - matchExpressions:
            - {{key: topology.kubernetes.io/zone, operator: In, values: [us-east-1b]}}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: data
  namespace: {ns}
spec:
  accessModes: [ReadWriteMany]
  storageClassName: ""
  volumeName: {ns}-data
  resources: {{requests: {{storage: 1Gi}}}}
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: db
  namespace: {ns}
spec:
  replicas: 3
  selector:
    matchLabels: {{app: db}}
  template:
    metadata:
      labels: {{app: db}}
    spec:
      terminationGracePeriodSeconds: 0
      containers:
        - name: pause
          image: registry.k8s.io/pause:3.9
          resources: {{requests: {{cpu: "1"}}}}
          volumeMounts: [{{name: data, mountPath: /data}}]
      volumes:
        - name: data
          persistentVolumeClaim: {{claimName: data}}
---
apiVersion: v1
kind: Pod
metadata:
  name: orphan
  namespace: {ns}
spec:
  terminationGracePeriodSeconds: 0
  containers:
    - name: pause
      image: registry.k8s.io/pause:3.9
      resources: {{requests: {{cpu: "1"}}}}
  volumes:
    - name: data
      persistentVolumeClaim: {{claimName: missing}}
"#
    )
}

#[test]
fn pods_on_a_zonal_volume_get_a_node_in_its_zone_and_a_pod_whose_claim_is_missing_gets_none() {
    let Some((env, _serial, _)) = getting_started() else { return };
    let ns = "volumes";
    // A run that failed half way leaves its volume Released, which no new claim binds.
    env.kubectl(&["delete", "pv", &format!("{ns}-data"), "--ignore-not-found"]);
    env.apply(&pinned_volume_workload(ns));
    env.wait("the claim bound to its volume", Duration::from_secs(30), |e| {
        let pvc = e.items(&["get", "pvc", "-n", ns]);
        let phase = pvc.first().map(|c| c["status"]["phase"].clone()).unwrap_or_default();
        if phase == "Bound" { Ok(()) } else { Err(format!("claim is {phase}")) }
    });
    let ctl = Controller::start(&env, "volumes", &[]);
    env.wait("the pods on the volume Running", Duration::from_secs(60), |e| {
        let running = e
            .items(&["get", "pods", "-n", ns, "-l", "app=db"])
            .iter()
            .filter(|p| p["status"]["phase"] == "Running")
            .count();
        if running == 3 { Ok(()) } else { Err(format!("{running}/3 running\n{}", ctl.log())) }
    });
    let nodes = env.items(&["get", "nodes", "-l", "dovetail.sh/sim-node"]);
    assert!(!nodes.is_empty());
    for n in &nodes {
        assert_eq!(
            n["metadata"]["labels"]["topology.kubernetes.io/zone"],
            "us-east-1b",
            "{} is in the volume's zone",
            name_of(n)
        );
    }
    // The pod whose claim is missing was never provisioned for: the nodes hold the three
    // volume pods only (1 CPU each), and the controller said why.
    let orphan = &env.items(&["get", "pods", "-n", ns, "--field-selector", "metadata.name=orphan"])[0];
    assert!(orphan["spec"]["nodeName"].is_null(), "the orphan stays pending");
    assert!(
        ctl.log().contains("PersistentVolumeClaim volumes/missing not found"),
        "the controller says why it leaves the orphan: {}",
        ctl.log()
    );
    let claims = env.items(&["get", "nodeclaims"]);
    let cpu: f64 = claims
        .iter()
        .filter_map(|c| c["spec"]["resources"]["requests"]["cpu"].as_str())
        .map(|q| {
            q.strip_suffix('m').map_or_else(|| q.parse().unwrap_or(0.0), |m| m.parse::<f64>().unwrap_or(0.0) / 1000.0)
        })
        .sum();
    assert!(cpu < 4.0, "no NodeClaim asked room for the orphan: {cpu} CPUs requested over {} claims", claims.len());
    clean_up(&env, ns, &ctl);
    env.kubectl(&["delete", "pv", &format!("{ns}-data"), "--wait=false"]);
}

fn policy_version(env: &Env) -> &'static str {
    let versions = env.kubectl(&["api-versions"]);
    if versions.lines().any(|l| l.trim() == "policy/v1") { "policy/v1" } else { "policy/v1beta1" }
}

#[test]
fn kubectl_delete_nodeclaim_drains_its_node_once_the_pdb_allows_and_removes_it() {
    let Some((env, _serial, _)) = getting_started() else { return };
    let ns = "drain";
    env.apply(&deployment(ns, "guarded", 3, "1"));
    let pdb = |min: u32| {
        format!(
            "apiVersion: {}\nkind: PodDisruptionBudget\nmetadata:\n  name: guarded\n  namespace: {ns}\nspec:\n  \
             minAvailable: {min}\n  selector:\n    matchLabels: {{app: guarded}}\n",
            policy_version(&env)
        )
    };
    env.apply(&pdb(3));
    let ctl = Controller::start(&env, "drain", &[]);
    env.wait_running("every pod Running", ns, 3, None, &ctl, Duration::from_secs(60));
    env.wait("the PDB counts the pods healthy", Duration::from_secs(30), |e| {
        let p = e.json(&["get", "pdb", "guarded", "-n", ns]);
        if p["status"]["currentHealthy"] == 3 { Ok(()) } else { Err(format!("{}", p["status"])) }
    });
    let claims = env.items(&["get", "nodeclaims"]);
    let pods = env.items(&["get", "pods", "-n", ns]);
    let node = pods[0]["spec"]["nodeName"].as_str().expect("bound").to_string();
    let claim =
        claims.iter().find(|c| c["status"]["nodeName"] == node.as_str()).map(name_of).expect("the node's NodeClaim");
    let on_node = |e: &Env| {
        e.items(&["get", "pods", "-n", ns])
            .iter()
            .filter(|p| p["spec"]["nodeName"] == node.as_str() && p["metadata"]["deletionTimestamp"].is_null())
            .count()
    };
    let held = on_node(&env);
    env.kubectl(&["delete", "nodeclaim", &claim, "--wait=false"]);
    // The PDB allows no disruption: for a while nothing may leave the node.
    env.wait("the node tainted for disruption", Duration::from_secs(20), |e| {
        let n = e.json(&["get", "node", &node]);
        let tainted =
            n["spec"]["taints"].as_array().into_iter().flatten().any(|t| t["key"] == "karpenter.sh/disrupted");
        if tainted { Ok(()) } else { Err(format!("{}", n["spec"])) }
    });
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(on_node(&env), held, "no pod evicted while the PDB allows none\n{}", ctl.log());
    assert!(
        !env.items(&["get", "nodeclaims"]).iter().all(|c| name_of(c) != claim),
        "the NodeClaim waits for its drain"
    );
    // Asked, refused (counted), and said on the node as Karpenter says it.
    let refused = ctl.metric("dovetail_errors_total", r#"kind="disruption_budget""#);
    assert!(refused >= 1.0, "evictions were asked and refused: {refused}\n{}", ctl.log());
    let selector = format!("involvedObject.name={node},reason=FailedDraining");
    let events = env.items(&["get", "events", "-A", "--field-selector", &selector]);
    assert!(events.iter().any(|e| e["type"] == "Warning"), "a FailedDraining event on {node}: {events:?}");
    // A drain held by a PDB holds nothing else: new pods still get new nodes meanwhile (3
    // CPUs each: no node there has room for them).
    let claims_before = env.items(&["get", "nodeclaims"]).len();
    env.apply(&deployment(ns, "meanwhile", 2, "3"));
    env.wait("the other Deployment's pods Running while the drain waits", Duration::from_secs(60), |e| {
        let running = e
            .items(&["get", "pods", "-n", ns, "-l", "app=meanwhile"])
            .iter()
            .filter(|p| p["status"]["phase"] == "Running")
            .count();
        if running == 2 { Ok(()) } else { Err(format!("{running} of 2 Running\n{}", ctl.log())) }
    });
    let claims_after = env.items(&["get", "nodeclaims"]).len();
    assert!(claims_after > claims_before, "new NodeClaims while the drain waits: {claims_before} -> {claims_after}");
    assert_eq!(on_node(&env), held, "still none evicted");
    env.apply(&pdb(0));
    env.wait("the NodeClaim and its node gone", Duration::from_secs(90), |e| {
        let claim_left = e.items(&["get", "nodeclaims"]).iter().any(|c| name_of(c) == claim);
        let node_left = e.items(&["get", "nodes"]).iter().any(|n| name_of(n) == node);
        if !claim_left && !node_left {
            Ok(())
        } else {
            Err(format!("claim {claim_left}, node {node_left}\n{}", ctl.log()))
        }
    });
    env.wait_running("the evicted pods Running elsewhere", ns, 3, Some(&node), &ctl, Duration::from_secs(60));
    clean_up(&env, ns, &ctl);
}

#[test]
fn an_api_server_restart_is_survived_and_nothing_is_terminated_for_being_missing() {
    let Some((env, _serial, _)) = getting_started() else { return };
    let ns = "apiserver-restart";
    env.apply(&deployment(ns, "inflate", 10, "1"));
    let ctl = Controller::start(&env, "apiserver-restart", &[]);
    env.wait_running("every pod Running", ns, 10, None, &ctl, Duration::from_secs(60));
    let before: Vec<String> = env.items(&["get", "nodeclaims"]).iter().map(name_of).collect();
    let script = repo().join("scripts/kube-test-env");
    let out = Command::new("bash").arg(&script).arg("restart-apiserver").arg(&env.dir).output().expect("runs");
    assert!(out.status.success(), "restart: {}", String::from_utf8_lossy(&out.stderr));
    env.kubectl(&["scale", "deployment", "inflate", "-n", ns, "--replicas=20"]);
    env.wait_running("the watches resumed: the new pods Running", ns, 20, None, &ctl, Duration::from_secs(90));
    let after: Vec<String> = env.items(&["get", "nodeclaims"]).iter().map(name_of).collect();
    for c in &before {
        assert!(after.contains(c), "NodeClaim {c} kept across the restart: {after:?}");
    }
    assert!(after.len() > before.len(), "new capacity for the new pods");
    clean_up(&env, ns, &ctl);
}

/// A NodePool of the getting-started shape, named `name`, its nodes labelled `team: NAME`;
/// `operator`/`value` make its last requirement (an invalid pair makes the pool invalid).
fn team_pool(name: &str, operator: &str, value: &str) -> String {
    format!(
        r#"apiVersion: karpenter.sh/v1
kind: NodePool
metadata:
  name: {name}
spec:
  template:
    metadata:
      labels: {{team: {name}}}
    spec:
      requirements:
        - key: karpenter.sh/capacity-type
          operator: In
          values: ["on-demand"]
        - key: karpenter.k8s.aws/instance-cpu
          operator: {operator}
          values: ["{value}"]
      nodeClassRef:
        group: karpenter.k8s.aws
        kind: EC2NodeClass
        name: default
  limits:
    cpu: 100
"#
    )
}

/// A Deployment whose pods only fit nodes labelled `team: TEAM`.
fn team_deployment(namespace: &str, team: &str, replicas: u32) -> String {
    deployment(namespace, team, replicas, "1").replace(
        "      terminationGracePeriodSeconds: 0\n",
        &format!("      terminationGracePeriodSeconds: 0\n      nodeSelector: {{team: {team}}}\n"),
    )
}

/// A NodePool's condition of `kind`, as `(status, reason, message)`.
fn condition(env: &Env, pool: &str, kind: &str) -> Option<(String, String, String)> {
    let p = env.json(&["get", "nodepool", pool]);
    let c = p["status"]["conditions"].as_array()?.iter().find(|c| c["type"] == kind)?.clone();
    let s = |k: &str| c[k].as_str().unwrap_or_default().to_string();
    Some((s("status"), s("reason"), s("message")))
}

#[test]
fn nodepools_added_fixed_and_deleted_at_run_time_and_an_invalid_one_is_reported_while_the_others_provision() {
    let Some((env, _serial, _)) = getting_started() else { return };
    // The schema is Karpenter's: the server fills in its defaults and refuses what its enums,
    // patterns and bounds refuse, naming the field.
    let default = env.json(&["get", "nodepool", "default"]);
    assert_eq!(default["spec"]["disruption"]["budgets"], serde_json::json!([{"nodes": "10%"}]), "{default}");
    assert_eq!(default["spec"]["template"]["spec"]["expireAfter"], "720h");
    let (ok, _, err) = env.try_apply(&team_pool("refused", "Bogus", "1"));
    // (A 1.20 server names the list without the index: `spec.template.spec.requirements.operator`.)
    assert!(
        !ok && err.contains("spec.template.spec.requirements") && err.contains("operator") && err.contains("Bogus"),
        "refused, naming the field: {err}"
    );
    let (ok, _, err) = env.try_apply(&team_pool("refused", "In", "1").replace("cpu: 100", "cpu: 100\n  weight: 0"));
    assert!(!ok && err.contains("spec.weight"), "a weight of 0 is refused: {err}");
    // Passes the 1.20 server (no CEL there): dovetail's own validation refuses it.
    env.apply(&team_pool("bad", "Gt", "many"));
    let ctl = Controller::start(&env, "nodepools", &[]);
    env.wait("the invalid NodePool's Ready condition", Duration::from_secs(30), |e| {
        match condition(e, "bad", "Ready") {
            Some((s, reason, message)) if s == "False" && reason == "NodePoolValidationFailed" => {
                if message.contains("spec.template.spec.requirements[1]") {
                    Ok(())
                } else {
                    Err(format!("the message names no field: {message}"))
                }
            }
            other => Err(format!("{other:?}\n{}", ctl.log())),
        }
    });
    env.wait("the invalid NodePool's event", Duration::from_secs(30), |e| {
        let events = e.items(&["get", "events", "-A", "--field-selector", "involvedObject.name=bad"]);
        let found = events.iter().any(|ev| ev["reason"] == "NodePoolValidationFailed" && ev["type"] == "Warning");
        if found { Ok(()) } else { Err(format!("{events:?}")) }
    });
    // `kubectl describe` lists it: the event names the NodePool's uid.
    let uid = env.json(&["get", "nodepool", "bad"])["metadata"]["uid"].clone();
    let uid = uid.as_str().expect("a uid");
    // (Selected by uid: a reused environment keeps events of earlier pools named `bad`.)
    let events = env.items(&["get", "events", "-A", "--field-selector", &format!("involvedObject.uid={uid}")]);
    assert!(events.iter().any(|ev| ev["reason"] == "NodePoolValidationFailed"), "an event names {uid}: {events:?}");
    let described = env.kubectl(&["describe", "nodepool", "bad"]);
    assert!(described.contains("NodePoolValidationFailed"), "kubectl describe shows the event:\n{described}");
    // An EC2NodeClass the 1.20 server takes but Karpenter's CEL rules refuse (a role and an
    // instance profile): the pool using it reports it, naming the class and the field.
    let classes = std::fs::read_to_string(repo().join("tests/fixtures/getting-started.yaml")).expect("the fixture");
    let class = classes.split("---").find(|d| d.contains("apiVersion: karpenter.k8s.aws/v1")).expect("an EC2NodeClass");
    env.apply(&class.replace("name: default", "name: both").replace("spec:\n", "spec:\n  instanceProfile: p\n"));
    env.apply(&team_pool("orphan", "Gt", "1").replace("name: default", "name: both"));
    env.wait("the pool on an invalid EC2NodeClass not Ready", Duration::from_secs(30), |e| {
        match condition(e, "orphan", "Ready") {
            Some((s, reason, message))
                if s == "False"
                    && reason == "NodeClassNotReady"
                    && message.contains(
                        "EC2NodeClass \"both\": spec: must specify exactly one of ['role', 'instanceProfile']",
                    ) =>
            {
                Ok(())
            }
            other => Err(format!("{other:?}")),
        }
    });
    // The EC2NodeClasses show it too, as `kubectl get ec2nodeclasses` reads it (Ready).
    env.wait("the EC2NodeClasses' Ready conditions", Duration::from_secs(30), |e| {
        let ready = |name: &str| {
            let c = e.json(&["get", "ec2nodeclass", name]);
            let c =
                c["status"]["conditions"].as_array().and_then(|cs| cs.iter().find(|c| c["type"] == "Ready")).cloned();
            c.map(|c| {
                (
                    c["status"].as_str().unwrap_or_default().to_string(),
                    c["message"].as_str().unwrap_or_default().to_string(),
                )
            })
        };
        match (ready("default"), ready("both")) {
            (Some((ok, _)), Some((bad, why)))
                if ok == "True" && bad == "False" && why.contains("exactly one of ['role', 'instanceProfile']") =>
            {
                Ok(())
            }
            other => Err(format!("{other:?}")),
        }
    });
    // A status that holds stays as written: the class's resource version stays over several
    // passes of the NodePool loop (one every 5 s at most), so no pass rewrote it with, say,
    // new transition times. (A write of identical content would not show here.)
    let version = |e: &Env| e.json(&["get", "ec2nodeclass", "default"])["metadata"]["resourceVersion"].clone();
    let before = version(&env);
    std::thread::sleep(Duration::from_secs(11));
    assert_eq!(version(&env), before, "an unchanged EC2NodeClass status is not rewritten with changes");
    // The valid pool keeps provisioning.
    let ns = "nodepools";
    env.apply(&deployment(ns, "inflate", 4, "1"));
    env.wait_running("the default pool's pods Running", ns, 4, None, &ctl, Duration::from_secs(60));
    env.wait("the default pool Ready, counting its nodes", Duration::from_secs(30), |e| {
        let ready = condition(e, "default", "Ready").map(|c| c.0);
        let nodes = e.json(&["get", "nodepool", "default"])["status"]["resources"]["nodes"].clone();
        if ready.as_deref() == Some("True") && nodes.as_str().is_some_and(|n| n != "0") {
            Ok(())
        } else {
            Err(format!("ready {ready:?}, nodes {nodes}"))
        }
    });
    // Added at run time: its pods get its nodes.
    env.apply(&team_pool("late", "Gt", "1"));
    env.apply(&team_deployment(ns, "late", 2));
    env.wait_running("the added pool's pods Running", ns, 6, None, &ctl, Duration::from_secs(60));
    let late_nodes = env.items(&["get", "nodes", "-l", "karpenter.sh/nodepool=late"]);
    assert!(!late_nodes.is_empty(), "the added pool made nodes");
    // Fixed at run time: it provisions.
    env.apply(&team_pool("bad", "Gt", "1"));
    env.wait("the fixed NodePool Ready", Duration::from_secs(30), |e| match condition(e, "bad", "Ready") {
        Some((s, ..)) if s == "True" => Ok(()),
        other => Err(format!("{other:?}")),
    });
    env.apply(&team_deployment(ns, "bad", 1));
    env.wait_running("the fixed pool's pod Running", ns, 7, None, &ctl, Duration::from_secs(60));
    // Deleted at run time: the garbage collector deletes its NodeClaims, which drain and go.
    env.kubectl(&["delete", "deployment", "late", "-n", ns]);
    env.kubectl(&["delete", "nodepool", "late", "--wait=false"]);
    env.wait("the deleted pool's NodeClaims and nodes gone", Duration::from_secs(90), |e| {
        let claims = e.items(&["get", "nodeclaims", "-l", "karpenter.sh/nodepool=late"]).len();
        let nodes = e.items(&["get", "nodes", "-l", "karpenter.sh/nodepool=late"]).len();
        if claims + nodes == 0 { Ok(()) } else { Err(format!("{claims} claims, {nodes} nodes\n{}", ctl.log())) }
    });
    env.wait_running("the other pools' pods still Running", ns, 5, None, &ctl, Duration::from_secs(30));
    // Invalid when the controller starts, with NodeClaims: nothing is provisioned for it, but
    // its claims' lifecycle goes on (a deleted one drains and goes, its finalizer taken off).
    drop(ctl);
    env.kubectl(&["delete", "deployment", "bad", "-n", ns]);
    env.apply(&team_pool("bad", "Gt", "many"));
    let claims = env.items(&["get", "nodeclaims", "-l", "karpenter.sh/nodepool=bad"]);
    let claim = name_of(claims.first().expect("the fixed pool made a NodeClaim"));
    let ctl = Controller::start(&env, "nodepools-restarted", &[]);
    env.wait("the NodePool invalid again", Duration::from_secs(30), |e| match condition(e, "bad", "Ready") {
        Some((s, reason, _)) if s == "False" && reason == "NodePoolValidationFailed" => Ok(()),
        other => Err(format!("{other:?}\n{}", ctl.log())),
    });
    // Restarted while they are invalid, the NodePool and the EC2NodeClass keep their
    // conditions' transition times (read back from what they show).
    let since = |e: &Env, kind: &str, name: &str| {
        let o = e.json(&["get", kind, name]);
        let c = o["status"]["conditions"].as_array().and_then(|cs| cs.iter().find(|c| c["type"] == "Ready")).cloned();
        c.map(|c| c["lastTransitionTime"].clone())
    };
    let (pool_since, class_since) = (since(&env, "nodepool", "bad"), since(&env, "ec2nodeclass", "both"));
    assert!(pool_since.is_some() && class_since.is_some(), "{pool_since:?} {class_since:?}");
    drop(ctl);
    std::thread::sleep(Duration::from_millis(1100));
    let ctl = Controller::start(&env, "nodepools-restarted-again", &[]);
    env.wait("the restarted controller's first status pass", Duration::from_secs(30), |e| {
        // The default pool's counts are written by every pass that finds them changed; its
        // Ready condition read back True means a pass ran over all pools.
        match condition(e, "default", "Ready") {
            Some((s, ..)) if s == "True" && ctl.log().contains("control plane started") => Ok(()),
            other => Err(format!("{other:?}\n{}", ctl.log())),
        }
    });
    std::thread::sleep(Duration::from_secs(6));
    assert_eq!(since(&env, "nodepool", "bad"), pool_since, "the invalid NodePool's Ready kept its transition time");
    assert_eq!(since(&env, "ec2nodeclass", "both"), class_since, "the invalid EC2NodeClass's Ready kept it");
    env.kubectl(&["delete", "nodeclaim", &claim, "--wait=false"]);
    env.wait("the invalid pool's deleted NodeClaim and its node gone", Duration::from_secs(60), |e| {
        let claims = e.items(&["get", "nodeclaims", "-l", "karpenter.sh/nodepool=bad"]);
        let nodes = e.items(&["get", "nodes", "-l", "karpenter.sh/nodepool=bad"]).len();
        let left = claims.iter().any(|c| name_of(c) == claim);
        // (Each claim left keeps its node: the deleted one's went with it.)
        if !left && nodes == claims.len() {
            Ok(())
        } else {
            Err(format!("{claim} left: {left}, {nodes} nodes\n{}", ctl.log()))
        }
    });
    assert!(ctl.log().contains("their lifecycle goes on"), "a retired actor kept them: {}", ctl.log());
    clean_up(&env, ns, &ctl);
}

#[allow(dead_code, reason = "the proxy's fault injection is the cloud tests'; these use its recording")]
#[path = "../cloud/tests/conformance/moto.rs"]
mod moto;

#[path = "kube/ha.rs"]
mod ha;

#[path = "kube/disruption.rs"]
mod disruption;

// Defects a long run would find: how the caches list, a drain a pod's budgets refuse.
#[path = "kube/correctness.rs"]
mod correctness;

#[path = "kube/interruption.rs"]
mod interruption;

/// Operating it: the controller's traces on the Raft ledger and its JSON logs.
#[path = "kube/operations.rs"]
mod operations;

#[path = "otlp/mod.rs"]
#[allow(dead_code, reason = "the receiver serves the CLI tests too; these use its gRPC side")]
mod otlp;

#[path = "../cloud/tests/conformance/ami_seed.rs"]
mod ami_seed;

/// The zones whose subnets the test's EC2NodeClass selects.
const SUBNET_ZONES: [&str; 2] = ["us-east-1b", "us-east-1d"];

/// The SSM parameters of the alias AMIs, seeded in moto (which keeps `/aws/...` to itself).
const AMI_PARAMETERS: &str = "/dovetail-test/eks/optimized-ami";

/// moto set up as the getting-started EC2NodeClass expects a cluster's account to be: the
/// default VPC's subnets and security group tagged `karpenter.sh/discovery: dovetail-test`,
/// and the AL2023 alias's parameters for Kubernetes `minor` naming moto's newest AL2023 images.
async fn seed_moto(endpoint: &str, minor: &str) -> (aws_sdk_ec2::Client, aws_sdk_iam::Client) {
    let cfg = dovetail_cloud::aws::AwsConfig {
        region: Some("us-east-1".into()),
        endpoint: Some(endpoint.into()),
        credentials: Some(dovetail_cloud::aws::StaticCredentials {
            access_key_id: "testing".into(),
            secret_access_key: "testing".into(),
        }),
        ..dovetail_cloud::aws::AwsConfig::default()
    };
    let sdk = dovetail_cloud::aws::sdk_config(&cfg).await;
    let ec2 = aws_sdk_ec2::Client::new(&sdk);
    let subnets = moto::setup("describing the subnets", || ec2.describe_subnets().send()).await;
    let default_group = aws_sdk_ec2::types::Filter::builder().name("group-name").values("default").build();
    let groups = moto::setup("describing the default security group", || {
        ec2.describe_security_groups().filters(default_group.clone()).send()
    })
    .await;
    // Only the subnets of two zones: the NodePool must launch there only.
    let mut resources: Vec<String> = subnets
        .subnets()
        .iter()
        .filter(|s| s.availability_zone().is_some_and(|z| SUBNET_ZONES.contains(&z)))
        .filter_map(|s| s.subnet_id().map(str::to_string))
        .collect();
    assert!(!resources.is_empty(), "moto's default VPC has subnets in {SUBNET_ZONES:?}");
    resources.extend(groups.security_groups().iter().filter_map(|g| g.group_id().map(str::to_string)));
    let tag = aws_sdk_ec2::types::Tag::builder().key("karpenter.sh/discovery").value("dovetail-test").build();
    moto::setup("tagging the subnets", || {
        ec2.create_tags().set_resources(Some(resources.clone())).tags(tag.clone()).send()
    })
    .await;
    let ssm = aws_sdk_ssm::Client::new(&sdk);
    ami_seed::seed_ami_parameters(&ec2, &ssm, minor, AMI_PARAMETERS).await;
    (ec2, aws_sdk_iam::Client::new(&sdk))
}

/// The SDK configuration of the test's clients of moto at `endpoint`.
async fn moto_sdk(endpoint: &str) -> aws_config::SdkConfig {
    let cfg = dovetail_cloud::aws::AwsConfig {
        region: Some("us-east-1".into()),
        endpoint: Some(endpoint.into()),
        credentials: Some(dovetail_cloud::aws::StaticCredentials {
            access_key_id: "testing".into(),
            secret_access_key: "testing".into(),
        }),
        ..dovetail_cloud::aws::AwsConfig::default()
    };
    dovetail_cloud::aws::sdk_config(&cfg).await
}

/// The test process's moto server, seeded for the API server's Kubernetes version ([`seed_moto`]):
/// a runtime for its clients, its endpoint, and EC2 and IAM clients.
fn seeded_moto(env: &Env) -> (tokio::runtime::Runtime, String, aws_sdk_ec2::Client, aws_sdk_iam::Client) {
    let endpoint = format!("http://{}", moto::moto().addr);
    let version = env.json(&["version"]);
    let major = version["serverVersion"]["major"].as_str().unwrap_or("1").to_string();
    let minor: String =
        version["serverVersion"]["minor"].as_str().unwrap_or("").chars().filter(char::is_ascii_digit).collect();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let (ec2, iam) = rt.block_on(seed_moto(&endpoint, &format!("{major}.{minor}")));
    (rt, endpoint, ec2, iam)
}

/// The instances moto has for a NodeClaim (by the tag dovetail puts on them), with their state.
async fn instances_of(ec2: &aws_sdk_ec2::Client, claim: &str) -> Vec<(String, String)> {
    let tag = aws_sdk_ec2::types::Filter::builder().name("tag:karpenter.sh/nodeclaim").values(claim).build();
    let out = ec2.describe_instances().filters(tag).send().await.expect("describe instances");
    out.reservations()
        .iter()
        .flat_map(|r| r.instances())
        .map(|i| {
            let state = i.state().and_then(|s| s.name()).map(|n| n.as_str().to_string()).unwrap_or_default();
            (i.instance_id().unwrap_or_default().to_string(), state)
        })
        .collect()
}

/// Deletes `role` if the account has it, taken out of its instance profiles first (IAM
/// refuses to delete a role a profile holds).
async fn forget_role(iam: &aws_sdk_iam::Client, role: &str) {
    let profiles = match iam.list_instance_profiles_for_role().role_name(role).send().await {
        Ok(out) => out.instance_profiles().iter().map(|p| p.instance_profile_name().to_string()).collect::<Vec<_>>(),
        Err(e) if format!("{e:?}").contains("NoSuchEntity") => return,
        Err(e) => panic!("list the instance profiles of role {role}: {e:?}"),
    };
    for profile in profiles {
        iam.remove_role_from_instance_profile()
            .instance_profile_name(&profile)
            .role_name(role)
            .send()
            .await
            .unwrap_or_else(|e| panic!("take role {role} out of instance profile {profile}: {e:?}"));
    }
    if let Err(e) = iam.delete_role().role_name(role).send().await {
        assert!(format!("{e:?}").contains("NoSuchEntity"), "delete role {role}: {e:?}");
    }
}

#[test]
fn with_cloud_aws_on_moto_the_getting_started_class_gets_an_instance_profile_for_its_role_and_nodeclaims_launch_and_terminate_ec2_instances()
 {
    let Some((env, _serial, _)) = getting_started() else { return };
    let (rt, endpoint, ec2, iam) = seeded_moto(&env);
    // The account starts without the class's role: another test of this process on the same
    // moto (the price refresh's) may have made it.
    rt.block_on(forget_role(&iam, "KarpenterNodeRole-dovetail-test"));
    // Without a CA to give the nodes (the test kubeconfig skips verification) it refuses to
    // start, saying what to set, rather than launch nodes that cannot join.
    let args = ["--cloud", "aws", "--aws-endpoint", endpoint.as_str(), "--region", "us-east-1"];
    let mut refused = Controller::spawn(&env, "aws-no-ca", &env.kubeconfig, &args, &[]);
    let mut exited = None;
    for _ in 0..300 {
        exited = refused.child.try_wait().expect("wait");
        if exited.is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(exited.is_some_and(|s| !s.success()), "it exits with an error\n{}", refused.log());
    assert!(refused.log().contains("--cluster-ca-bundle"), "{}", refused.log());
    // An interruption queue that does not exist stops the start, named.
    let mut no_queue =
        Controller::start_aws(&env, "aws-no-queue", &endpoint, &["--interruption-queue", "no-such-queue"]);
    let mut exited = None;
    for _ in 0..600 {
        exited = no_queue.child.try_wait().expect("wait");
        if exited.is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(exited.is_some_and(|s| !s.success()), "it exits with an error\n{}", no_queue.log());
    assert!(no_queue.log().contains("--interruption-queue no-such-queue"), "{}", no_queue.log());
    // Karpenter's queue, named after the cluster.
    let sqs = aws_sdk_sqs::Client::new(&rt.block_on(moto_sdk(&endpoint)));
    let queue_url = rt
        .block_on(sqs.create_queue().queue_name("dovetail-test").send())
        .expect("create queue")
        .queue_url()
        .expect("queue url")
        .to_string();
    let ctl = Controller::start_aws(
        &env,
        "aws",
        &endpoint,
        &["--ami-parameter-prefix", AMI_PARAMETERS, "--interruption-queue", "dovetail-test"],
    );
    // The getting-started class names a role the account does not have yet: the NodePool
    // says so instead of launching what could not join.
    env.wait("the missing role reported", Duration::from_secs(60), |e| match condition(e, "default", "Ready") {
        Some((s, reason, message))
            if s == "False" && reason == "NodeClassNotReady" && message.contains("spec.role") =>
        {
            Ok(())
        }
        other => Err(format!("{other:?}\n{}", ctl.log())),
    });
    // Once the role exists the class resolves (subnets, security group, the alias's AMI, an
    // instance profile made for the role) and provisions.
    let role = "KarpenterNodeRole-dovetail-test";
    let trust = r#"{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Principal":{"Service":"ec2.amazonaws.com"},"Action":"sts:AssumeRole"}]}"#;
    rt.block_on(iam.create_role().role_name(role).assume_role_policy_document(trust).send()).expect("create role");
    env.wait("the NodePool Ready", Duration::from_secs(60), |e| match condition(e, "default", "Ready") {
        Some((s, ..)) if s == "True" => Ok(()),
        other => Err(format!("{other:?}\n{}", ctl.log())),
    });
    let profile = dovetail_cloud::aws::profile_name("dovetail-test", "us-east-1", "default");
    let got = rt.block_on(iam.get_instance_profile().instance_profile_name(&profile).send()).expect("the profile");
    let roles: Vec<String> = got
        .instance_profile()
        .map(|p| p.roles().iter().map(|r| r.role_name().to_string()).collect())
        .unwrap_or_default();
    assert_eq!(roles, [role], "the managed profile {profile} carries the role");
    let ns = "aws";
    env.apply(&deployment(ns, "inflate", 3, "1"));
    env.wait("NodeClaims launched in EC2", Duration::from_secs(90), |e| {
        let claims = e.items(&["get", "nodeclaims"]);
        let launched = claims
            .iter()
            .filter(|c| c["status"]["providerID"].as_str().is_some_and(|p| p.starts_with("aws:///us-east-1")))
            .count();
        if launched > 0 && launched == claims.len() {
            Ok(())
        } else {
            Err(format!("{launched} of {} launched\n{}", claims.len(), ctl.log()))
        }
    });
    let claims = env.items(&["get", "nodeclaims"]);
    for c in &claims {
        let name = name_of(c);
        let found = rt.block_on(instances_of(&ec2, &name));
        assert_eq!(found.len(), 1, "one instance for {name}: {found:?}");
        let provider = c["status"]["providerID"].as_str().unwrap_or_default();
        assert!(provider.ends_with(&found[0].0), "{name}'s providerID {provider} names its instance {found:?}");
        assert_eq!(found[0].1, "running");
        let zone = c["metadata"]["labels"]["topology.kubernetes.io/zone"].as_str().unwrap_or_default();
        assert!(SUBNET_ZONES.contains(&zone), "{name} launched in {zone}, where the class has no subnet");
    }
    // A spot interruption warning through the queue for the first NodeClaim's instance: the
    // claim is interrupted (it never registered: no pods to replace) and goes, its instance
    // terminated, the message deleted, Karpenter's event on it; its pods get a new claim.
    let second = name_of(&claims[0]);
    let (instance, _) = rt.block_on(instances_of(&ec2, &second)).into_iter().next().expect("its instance");
    let unix = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let origin = dovetail_cloud::events::Origin {
        event_id: "e-aws",
        account: "123456789012",
        region: "us-east-1",
        unix_seconds: unix,
    };
    let warning =
        dovetail_cloud::events::event(dovetail_cloud::events::EventKind::SpotInterruption, &instance, &origin);
    rt.block_on(sqs.send_message().queue_url(&queue_url).message_body(warning).send()).expect("send");
    env.wait(
        "the interrupted NodeClaim gone, its instance terminated, the message deleted",
        Duration::from_secs(90),
        |e| {
            let left = e.items(&["get", "nodeclaims"]).iter().any(|c| name_of(c) == second);
            let found = rt.block_on(instances_of(&ec2, &second));
            let terminated = found.iter().all(|(_, s)| s == "terminated" || s == "shutting-down");
            let attrs = rt
                .block_on(
                    sqs.get_queue_attributes()
                        .queue_url(&queue_url)
                        .attribute_names(aws_sdk_sqs::types::QueueAttributeName::All)
                        .send(),
                )
                .expect("queue attributes");
            let depth: u64 = attrs
                .attributes()
                .map(|a| {
                    [
                        aws_sdk_sqs::types::QueueAttributeName::ApproximateNumberOfMessages,
                        aws_sdk_sqs::types::QueueAttributeName::ApproximateNumberOfMessagesNotVisible,
                    ]
                    .iter()
                    .filter_map(|k| a.get(k).and_then(|v| v.parse::<u64>().ok()))
                    .sum()
                })
                .unwrap_or(0);
            if !left && terminated && depth == 0 {
                Ok(())
            } else {
                Err(format!("left {left}, {found:?}, {depth} messages\n{}", ctl.log()))
            }
        },
    );
    assert!(ctl.log().contains("interruption queue found"), "{}", ctl.log());
    let events = env.items(&["get", "events", "-A", "--field-selector", &format!("involvedObject.name={second}")]);
    assert!(events.iter().any(|e| e["reason"] == "SpotInterrupted"), "{events:?}");
    env.wait("a NodeClaim launched for the interrupted one's pods", Duration::from_secs(90), |e| {
        let fresh = e.items(&["get", "nodeclaims"]).into_iter().any(|c| {
            name_of(&c) != second && c["status"]["providerID"].as_str().is_some_and(|p| p.starts_with("aws:///"))
        });
        if fresh { Ok(()) } else { Err(ctl.log()) }
    });
    let claims = env.items(&["get", "nodeclaims"]);
    // The class deleted while NodeClaims still name it: its profile stays (their instances use
    // it). Passes of the NodePool loop run meanwhile: the pool reports its class missing, and
    // its NodeClaims' lifecycle goes on without it.
    env.kubectl(&["delete", "ec2nodeclass", "default", "--wait=false"]);
    env.wait("the NodePool reporting its class missing", Duration::from_secs(30), |e| {
        match condition(e, "default", "Ready") {
            Some((s, reason, _)) if s == "False" && reason == "NodeClassNotFound" => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });
    std::thread::sleep(Duration::from_secs(6));
    let kept = rt.block_on(iam.get_instance_profile().instance_profile_name(&profile).send());
    assert!(kept.is_ok(), "the profile of a class NodeClaims still name is kept: {kept:?}\n{}", ctl.log());
    // A NodeClaim deleted (never registered: no kubelet joins from moto): its instance is
    // terminated.
    let first = name_of(&claims[0]);
    env.kubectl(&["delete", "nodeclaim", &first, "--wait=false"]);
    env.wait("the deleted NodeClaim gone and its instance terminated", Duration::from_secs(60), |e| {
        let left = e.items(&["get", "nodeclaims"]).iter().any(|c| name_of(c) == first);
        let found = rt.block_on(instances_of(&ec2, &first));
        let terminated = found.iter().all(|(_, s)| s == "terminated" || s == "shutting-down");
        if !left && terminated { Ok(()) } else { Err(format!("left {left}, {found:?}\n{}", ctl.log())) }
    });
    clean_up(&env, ns, &ctl);
    for c in &claims {
        let found = rt.block_on(instances_of(&ec2, &name_of(c)));
        assert!(found.iter().all(|(_, s)| s == "terminated" || s == "shutting-down"), "{found:?}");
    }
    // The class is gone and no NodeClaim names it any more: its profile goes.
    env.wait("the deleted class's instance profile deleted", Duration::from_secs(30), |_| {
        match rt.block_on(iam.get_instance_profile().instance_profile_name(&profile).send()) {
            Err(e) if format!("{e:?}").contains("NoSuchEntity") => Ok(()),
            other => Err(format!("{other:?}\n{}", ctl.log())),
        }
    });
}

/// `kubectl auth can-i` as whoever `kubeconfig` names: whether the API allows it
/// (`resource/subresource` asks for the subresource).
fn can_i(kubeconfig: &Path, verb: &str, resource: &str) -> bool {
    let mut args = vec!["auth", "can-i", verb];
    match resource.split_once('/') {
        Some((r, sub)) => args.extend([r, "--subresource", sub]),
        None => args.push(resource),
    }
    let out = Command::new("kubectl").arg("--kubeconfig").arg(kubeconfig).args(&args).output().expect("kubectl runs");
    String::from_utf8_lossy(&out.stdout).trim() == "yes"
}

#[test]
fn the_controller_provisions_and_drains_under_the_shipped_rbac_role_applied_with_kustomize() {
    let Some(env) = env() else { return };
    let _serial = SERIAL.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    env.reset();
    let overlay = repo().join("deploy/overlays/sim");
    env.apply_crds(&overlay);
    // The controller's own credentials: its ServiceAccount's token (TokenRequest).
    let mut token = String::new();
    env.wait("the ServiceAccount", Duration::from_secs(30), |e| {
        let out = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&e.kubeconfig)
            .args(["create", "token", "dovetail", "-n", "dovetail", "--duration=1h"])
            .output()
            .expect("kubectl runs");
        token = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if out.status.success() && !token.is_empty() {
            Ok(())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into())
        }
    });
    let server = env.kubectl(&["config", "view", "--raw", "-o", "jsonpath={.clusters[0].cluster.server}"]);
    let kubeconfig = env.dir.join("kubeconfig-dovetail");
    let yaml = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {server}\n    \
         insecure-skip-tls-verify: true\nusers:\n- name: dovetail\n  user:\n    token: {token}\ncontexts:\n- name: \
         dovetail\n  context:\n    cluster: test\n    user: dovetail\ncurrent-context: dovetail\n"
    );
    std::fs::write(&kubeconfig, yaml).expect("kubeconfig written");
    // The API enforces RBAC, and the role is what it says: what dovetail uses, nothing more.
    assert!(can_i(&kubeconfig, "create", "nodeclaims.karpenter.sh"), "the role lets dovetail create NodeClaims");
    assert!(
        can_i(&kubeconfig, "patch", "ec2nodeclasses.karpenter.k8s.aws/status"),
        "the role lets dovetail write EC2NodeClass status"
    );
    assert!(
        !can_i(&kubeconfig, "list", "secrets"),
        "RBAC is enforced (start kube-test-env with KUBE_AUTHZ=RBAC, as scripts/test does) and the role grants no secrets"
    );
    assert!(!can_i(&kubeconfig, "delete", "nodepools.karpenter.sh"), "dovetail never deletes a NodePool");
    env.apply(include_str!("fixtures/getting-started.yaml"));
    let ns = "rbac";
    env.apply(&deployment(ns, "inflate", 3, "1"));
    let ctl = Controller::start_as(&env, "rbac", &kubeconfig, &[]);
    env.wait_running("every pod Running, provisioned under the role", ns, 3, None, &ctl, Duration::from_secs(60));
    env.wait("the NodePool's status written under the role", Duration::from_secs(30), |e| {
        match condition(e, "default", "Ready") {
            Some((s, ..)) if s == "True" => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });
    // Termination through the finalizers: evictions, node and NodeClaim writes, deletes.
    let claim = name_of(&env.items(&["get", "nodeclaims"])[0]);
    env.kubectl(&["delete", "nodeclaim", &claim, "--wait=false"]);
    env.wait("the NodeClaim drained and gone under the role", Duration::from_secs(90), |e| {
        let left = e.items(&["get", "nodeclaims"]).iter().any(|c| name_of(c) == claim);
        if left { Err(format!("{claim} left\n{}", ctl.log())) } else { Ok(()) }
    });
    env.wait_running("the pods Running again", ns, 3, None, &ctl, Duration::from_secs(60));
    let log = ctl.log();
    assert!(!log.contains("HTTP 403") && !log.to_lowercase().contains("forbidden"), "nothing was forbidden: {log}");
    // Also what is only counted: no watch failed, no write was refused.
    assert_eq!(ctl.metric("dovetail_cluster_watch_errors_total", ""), 0.0, "{log}");
    assert_eq!(ctl.metric("dovetail_errors_total", r#"kind="unavailable""#), 0.0, "{log}");
    clean_up(&env, ns, &ctl);
    for (kind, name, namespace) in [
        ("clusterrolebinding", "dovetail", None),
        ("clusterrole", "dovetail", None),
        ("clusterrolebinding", "dovetail-sim-agent", None),
        ("clusterrole", "dovetail-sim-agent", None),
        ("rolebinding", "dovetail-sim-agent", Some("kube-node-lease")),
        ("role", "dovetail-sim-agent", Some("kube-node-lease")),
    ] {
        let mut args = vec!["delete", kind, name, "--ignore-not-found"];
        if let Some(n) = namespace {
            args.extend(["-n", n]);
        }
        env.kubectl(&args);
    }
    env.kubectl(&["delete", "namespace", "dovetail", "--wait=false"]);
}
