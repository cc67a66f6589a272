//! Three control-node processes on one replicated ledger, sharing the test's API server and
//! one moto EC2 server (each node through a proxy of its own, which records its calls), with
//! `dovetail node-agent` playing the kubelets of moto's instances. The leader is killed with
//! SIGKILL during scale-ups; duplicates are counted by the NodeClaim tag on moto's instances,
//! and the NodePool's CPU limit is checked against the vCPUs of what moto runs.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::SystemTime;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;

/// Two NodePools on 4- and 8-vCPU types (a scale-up is many NodeClaims, so a kill lands
/// among launches in flight): `limited`, preferred (weight 10) with a CPU limit the scale-up
/// reaches, and Karpenter's getting-started `default`, unlimited, which takes the rest. Neither
/// consolidates (`consolidateAfter: Never`): these tests are about fail-over, and a 1,000-pod
/// scale-up would otherwise be repacked while it lands (disruption has tests of its own).
fn pools(limit_cpu: u32) -> String {
    let pool = |name: &str, extra: &str| {
        format!(
            r#"apiVersion: karpenter.sh/v1
kind: NodePool
metadata:
  name: {name}
spec:
{extra}  template:
    spec:
      requirements:
        - {{key: kubernetes.io/arch, operator: In, values: ["amd64"]}}
        - {{key: kubernetes.io/os, operator: In, values: ["linux"]}}
        - {{key: karpenter.sh/capacity-type, operator: In, values: ["on-demand"]}}
        - {{key: karpenter.k8s.aws/instance-category, operator: In, values: ["c", "m", "r"]}}
        - {{key: karpenter.k8s.aws/instance-cpu, operator: In, values: ["4", "8"]}}
      nodeClassRef: {{group: karpenter.k8s.aws, kind: EC2NodeClass, name: default}}
  disruption:
    consolidateAfter: Never
"#
        )
    };
    let limited = format!("  weight: 10\n  limits:\n    cpu: {limit_cpu}\n");
    format!("{}---\n{}", pool("limited", &limited), pool("default", ""))
}

/// The vCPUs NodePool `pool`'s claims hold in a control node's ledger (`ledger status`).
fn held_cpu(status: &serde_json::Value, pool: &str) -> u32 {
    let millis = status["pools"][pool]["usage"]["cpu"].as_i64().unwrap_or_default();
    u32::try_from(millis / 1000).unwrap_or_default()
}

/// A setting of the test from the environment (`loadtest`'s scripts/ha-loadtest sets them).
fn setting(name: &str, default: u32) -> u32 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// The node role of these tests' EC2NodeClass: not the getting-started one, which another test
/// of this process (sharing moto) expects to be missing at its start.
pub(super) const ROLE: &str = "KarpenterNodeRole-dovetail-ha";

/// Seeds moto ([`seeded_moto`]), makes [`ROLE`] there (once per process) and points the
/// getting-started EC2NodeClass at it; moto's runtime, endpoint and EC2 client.
pub(super) fn own_role(env: &Env) -> (tokio::runtime::Runtime, String, aws_sdk_ec2::Client) {
    let (rt, endpoint, ec2, iam) = seeded_moto(env);
    let trust = r#"{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Principal":{"Service":"ec2.amazonaws.com"},"Action":"sts:AssumeRole"}]}"#;
    if let Err(e) = rt.block_on(iam.create_role().role_name(ROLE).assume_role_policy_document(trust).send()) {
        // Made by an earlier test in this process.
        assert!(format!("{e:?}").contains("EntityAlreadyExists"), "create role: {e:?}");
    }
    let patch = format!(r#"{{"spec":{{"role":"{ROLE}"}}}}"#);
    env.kubectl(&["patch", "ec2nodeclass", "default", "--type=merge", "-p", &patch]);
    (rt, endpoint, ec2)
}

/// The seconds since the epoch a log line starts with (`2026-11-25T10:11:12.345678Z`).
fn log_time(line: &str) -> Option<f64> {
    let t = line.get(..26)?;
    let num = |r: std::ops::Range<usize>| t.get(r)?.parse::<i64>().ok();
    let (y, m, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hh, mm) = (num(11..13)?, num(14..16)?);
    let secs: f64 = t.get(17..26)?.parse().ok()?;
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some((days * 86_400 + hh * 3_600 + mm * 60) as f64 + secs)
}

fn epoch(t: SystemTime) -> f64 {
    t.duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

/// The time of the first line of `log` containing `what` logged at or after `since`.
fn first_after(log: &str, what: &str, since: f64) -> Option<f64> {
    log.lines().filter(|l| l.contains(what)).filter_map(log_time).find(|t| *t >= since)
}

/// Whether the control node says on `/metrics` that it leads (false if it does not answer).
fn leads(c: &Controller) -> bool {
    Command::new("curl")
        .args(["-sf", "--max-time", "0.5", &format!("http://{}/metrics", c.metrics_addr)])
        .output()
        .is_ok_and(|o| {
            o.status.success() && String::from_utf8_lossy(&o.stdout).contains("\ndovetail_ledger_leader 1\n")
        })
}

/// The control nodes' network: a TCP proxy in front of each node's Raft port that closes
/// every connection crossing the partition. A connection carries one sender's messages; the
/// sender is read from its first request's `x-raft-from` header (connections without one,
/// `dovetail ledger status`, always pass). Each change of the partition closes every open
/// connection, so the next ones are judged by it.
struct RaftNet {
    /// The nodes cut off from the others (none: no partition).
    cut: Arc<Mutex<BTreeSet<u64>>>,
    changed: tokio::sync::watch::Sender<u64>,
}

impl RaftNet {
    fn new() -> RaftNet {
        RaftNet { cut: Arc::new(Mutex::new(BTreeSet::new())), changed: tokio::sync::watch::channel(0).0 }
    }

    /// Cuts `nodes` off from the rest (empty: heals).
    fn partition(&self, nodes: &[u64]) {
        *self.cut.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = nodes.iter().copied().collect();
        self.changed.send_modify(|n| *n += 1);
    }

    /// A proxy to node `to` listening on 127.0.0.1 at `upstream`; its port.
    async fn proxy(&self, to: u64, upstream: u16) -> u16 {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind raft proxy");
        let port = listener.local_addr().expect("addr").port();
        let (cut, changed) = (self.cut.clone(), self.changed.subscribe());
        // Bounded: a test's proxy serves at most this long, and this many connections.
        let serve = async move {
            for _ in 0..100_000u32 {
                let Ok((mut client, _)) = listener.accept().await else { break };
                let (cut, mut changed) = (cut.clone(), changed.clone());
                changed.borrow_and_update();
                tokio::spawn(async move {
                    // The first request's headers (bounded in size and time).
                    let mut head = Vec::new();
                    let mut buf = [0u8; 4096];
                    let read = async {
                        while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 65_536 {
                            match client.read(&mut buf).await {
                                Ok(0) | Err(_) => return false,
                                Ok(n) => head.extend_from_slice(&buf[..n]),
                            }
                        }
                        true
                    };
                    if !matches!(tokio::time::timeout(Duration::from_secs(5), read).await, Ok(true)) {
                        return;
                    }
                    let text = String::from_utf8_lossy(&head).to_ascii_lowercase();
                    let from = text
                        .lines()
                        .find_map(|l| l.strip_prefix("x-raft-from:"))
                        .and_then(|v| v.trim().parse::<u64>().ok());
                    let crossing = {
                        let cut = cut.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                        from.is_some_and(|f| cut.contains(&f) != cut.contains(&to))
                    };
                    if crossing {
                        // Dropped: read and discarded, never answered, until the partition
                        // changes (the sender's call times out, as on a lossy network).
                        let drain = async {
                            while let Ok(n) = client.read(&mut buf).await {
                                if n == 0 {
                                    break;
                                }
                            }
                        };
                        tokio::select! {
                            () = drain => {}
                            _ = changed.changed() => {}
                            () = tokio::time::sleep(Duration::from_secs(600)) => {}
                        }
                        return;
                    }
                    let Ok(mut server) = tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await else { return };
                    if server.write_all(&head).await.is_err() {
                        return;
                    }
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                        _ = changed.changed() => {}
                        () = tokio::time::sleep(Duration::from_secs(600)) => {}
                    }
                });
            }
        };
        tokio::spawn(async move {
            if tokio::time::timeout(Duration::from_secs(1800), serve).await.is_err() {
                eprintln!("raft proxy to node {to}: closed after 30 minutes");
            }
        });
        port
    }
}

/// Three control nodes launching in moto, each through its own recording proxy.
struct Group<'a> {
    env: &'a Env,
    proxies: Vec<moto::Proxy>,
    ports: Vec<u16>,
    peers: String,
    secret: PathBuf,
    nodes: Vec<Option<Controller>>,
    /// How many times each node was started (its log file is per start).
    starts: Vec<u32>,
}

impl Group<'_> {
    /// The group; with `net`, the nodes reach each other through its proxies.
    fn new<'a>(
        env: &'a Env,
        rt: &tokio::runtime::Runtime,
        upstream: std::net::SocketAddr,
        net: Option<&RaftNet>,
    ) -> Group<'a> {
        let secret = env.dir.join("raft-secret");
        std::fs::write(&secret, "a-test-secret-of-the-group\n").expect("secret written");
        let ports: Vec<u16> = (0..3).map(|_| free_port().expect("a free port")).collect();
        let reached: Vec<u16> = match net {
            Some(net) => (0..3).map(|i| rt.block_on(net.proxy(i as u64 + 1, ports[i]))).collect(),
            None => ports.clone(),
        };
        let peers =
            reached.iter().enumerate().map(|(i, p)| format!("{}=127.0.0.1:{p}", i + 1)).collect::<Vec<_>>().join(",");
        for i in 0..3 {
            if let Err(e) = std::fs::remove_dir_all(env.dir.join(format!("ha-aws-{}", i + 1))) {
                assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "{e}");
            }
        }
        let proxies = (0..3).map(|_| rt.block_on(moto::Proxy::start(upstream))).collect();
        Group { env, proxies, ports, peers, secret, nodes: vec![None, None, None], starts: vec![0; 3] }
    }

    fn start(&mut self, i: usize) {
        let dir = self.env.dir.join(format!("ha-aws-{}", i + 1));
        let (id, addr) = ((i + 1).to_string(), format!("127.0.0.1:{}", self.ports[i]));
        let endpoint = format!("http://{}", self.proxies[i].addr);
        let mut args = vec![
            "--node-id",
            id.as_str(),
            "--raft-addr",
            addr.as_str(),
            "--peers",
            self.peers.as_str(),
            "--data-dir",
            dir.to_str().expect("utf-8"),
            "--raft-secret-file",
            self.secret.to_str().expect("utf-8"),
            "--ami-parameter-prefix",
            AMI_PARAMETERS,
        ];
        // Raft's timings for a shared machine, unless the fail-over goals are being measured
        // (DOVETAIL_HA_ASSERT_TIMING, at the defaults): with two Kubernetes passes and a
        // CPU-heavy job on two cores, 50 ms heartbeats time out, the lease flaps and leadership
        // moved four times in two minutes, so the cleanup's 90 s passed with no plane acting
        // for most of it (15 Nodes left). The settings a busy control plane would use.
        if std::env::var_os("DOVETAIL_HA_ASSERT_TIMING").is_none() {
            args.extend([
                "--raft-heartbeat-ms",
                "100",
                "--raft-election-timeout-min-ms",
                "1000",
                "--raft-election-timeout-max-ms",
                "2000",
            ]);
        }
        self.starts[i] += 1;
        let name = format!("ha-aws-{}-{}", i + 1, self.starts[i]);
        self.nodes[i] = Some(Controller::start_aws(self.env, &name, &endpoint, &args));
    }

    fn logs(&self) -> String {
        self.nodes.iter().flatten().map(Controller::log).collect::<Vec<_>>().join("\n----\n")
    }

    /// The running nodes that say they lead now.
    fn leading(&self) -> Vec<usize> {
        self.nodes.iter().enumerate().filter(|(_, n)| n.as_ref().is_some_and(leads)).map(|(i, _)| i).collect()
    }

    /// The one node that says it leads, waiting (at most `limit`) until exactly one does.
    fn leader(&self, limit: Duration) -> usize {
        let mut found = None;
        self.env.wait("one leader", limit, |_| match self.leading()[..] {
            [i] => {
                found = Some(i);
                Ok(())
            }
            ref other => Err(format!("leading: {other:?}\n{}", self.logs())),
        });
        found.expect("a leader")
    }

    fn log(&self, i: usize) -> String {
        self.nodes[i].as_ref().map(Controller::log).unwrap_or_default()
    }

    fn status(&self, i: usize) -> serde_json::Value {
        let out = Command::new(super::dovetail_bin())
            .args(["ledger", "status", "--addr", &format!("127.0.0.1:{}", self.ports[i]), "--output", "json"])
            .arg("--raft-secret-file")
            .arg(&self.secret)
            .output()
            .expect("dovetail runs");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).expect("JSON")
    }
}

/// An instance moto launched for a NodeClaim.
struct Launched {
    id: String,
    /// Its NodeClaim and NodePool tags.
    claim: String,
    pool: String,
    instance_type: String,
    state: String,
}

/// Every instance moto has (with `filter`), over every page: moto answers 100 reservations a
/// page. moto's server is threaded and can fail a describe that runs while instances are made
/// (`dictionary changed size during iteration`, a 500): a page is asked again, at most 5 times.
async fn describe_all(
    ec2: &aws_sdk_ec2::Client,
    filters: Vec<aws_sdk_ec2::types::Filter>,
) -> Vec<aws_sdk_ec2::types::Instance> {
    let mut all = Vec::new();
    let mut token: Option<String> = None;
    // Bounded: 1,000 pages are 100,000 reservations.
    for _ in 0..1_000 {
        let mut tries = 0;
        let page = loop {
            let call = ec2
                .describe_instances()
                .set_filters((!filters.is_empty()).then(|| filters.clone()))
                .set_next_token(token.clone());
            // Bounded in time too: a moto that stopped answering fails the test, not hangs it. A
            // page takes moto tens of seconds once it holds thousands of instances (round 14 of
            // a 20 x 1,000 run waited over 60 s for one).
            let sent = tokio::time::timeout(std::time::Duration::from_secs(300), call.send()).await;
            let Ok(sent) = sent else { panic!("describe instances: moto did not answer within 300 s") };
            match sent {
                Ok(out) => break out,
                Err(e) if tries < 5 && e.raw_response().is_some_and(|r| r.status().is_server_error()) => {
                    tries += 1;
                    eprintln!("describe instances: moto answered a server error, asking again: {e:?}");
                    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                }
                Err(e) => panic!("describe instances: {e:?}"),
            }
        };
        all.extend(page.reservations().iter().flat_map(|r| r.instances()).cloned());
        token = page.next_token().map(str::to_string);
        if token.is_none() {
            return all;
        }
    }
    panic!("describe instances: more than 1,000 pages");
}

/// moto's instances launched for NodeClaims since the test began (`known` are older ones):
/// in every state, or (`live_only`) those pending or running. moto filters every page over
/// every instance it holds, terminated ones too; under scripts/moto-server it forgets them after
/// `DOVETAIL_MOTO_TERMINATED_TTL` (EC2's hour by default, 10 minutes in scripts/ha-loadtest:
/// longer than a round, so a round's settled check still sees each of its instances).
async fn claimed_instances(ec2: &aws_sdk_ec2::Client, known: &BTreeSet<String>, live_only: bool) -> Vec<Launched> {
    use aws_sdk_ec2::types::Filter;
    let mut filters = vec![Filter::builder().name("tag-key").values("karpenter.sh/nodeclaim").build()];
    if live_only {
        filters.push(Filter::builder().name("instance-state-name").values("pending").values("running").build());
    }
    describe_all(ec2, filters)
        .await
        .iter()
        .filter(|i| !known.contains(i.instance_id().unwrap_or_default()))
        // An instance the tag filter matched comes back without tags only when moto forgot it
        // between filtering and answering (terminated long ago, scripts/moto_server.py): it
        // is not counted (one whose claim tag was never written never matches the filter).
        .filter(|i| !i.tags().is_empty())
        .map(|i| {
            let tag = |key: &str| {
                i.tags().iter().find(|t| t.key() == Some(key)).and_then(|t| t.value()).unwrap_or_default().to_string()
            };
            Launched {
                id: i.instance_id().unwrap_or_default().to_string(),
                claim: tag("karpenter.sh/nodeclaim"),
                pool: tag("karpenter.sh/nodepool"),
                instance_type: i.instance_type().map(|t| t.as_str().to_string()).unwrap_or_default(),
                state: i.state().and_then(|s| s.name()).map(|n| n.as_str().to_string()).unwrap_or_default(),
            }
        })
        .collect()
}

/// Every instance id moto has now.
async fn all_instances(ec2: &aws_sdk_ec2::Client) -> BTreeSet<String> {
    describe_all(ec2, Vec::new()).await.iter().filter_map(|i| i.instance_id().map(str::to_string)).collect()
}

/// What the fleet is checked against.
struct Fleet<'a> {
    rt: &'a tokio::runtime::Runtime,
    ec2: aws_sdk_ec2::Client,
    /// Instances moto had before the test.
    known: BTreeSet<String>,
    /// vCPUs by instance type.
    vcpus: BTreeMap<String, u32>,
    /// NodePool `limited`'s CPU limit.
    limit: u32,
}

impl Fleet<'_> {
    /// Checks the fleet against the cluster: no NodeClaim has two instances, the vCPUs of
    /// NodePool `limited`'s live instances are within its limit, and (when `settled`) every
    /// live instance is a NodeClaim's and every NodeClaim has one. Returns `limited`'s vCPUs.
    /// Settled, the duplicates are counted over every state (a duplicate terminated later
    /// was still launched); while a round runs, over the live instances only, so the polls
    /// do not list the whole run's history each time (the round's settled check still sees
    /// every instance it launched).
    fn check(&self, env: &Env, settled: bool, logs: &dyn Fn() -> String) -> u32 {
        let (vcpus, limit) = (&self.vcpus, self.limit);
        let found = self.rt.block_on(claimed_instances(&self.ec2, &self.known, !settled));
        let mut by_claim: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for i in &found {
            by_claim.entry(i.claim.as_str()).or_default().push(i.id.as_str());
        }
        for (claim, ids) in &by_claim {
            assert_eq!(ids.len(), 1, "NodeClaim {claim} has {} instances: {ids:?}\n{}", ids.len(), logs());
        }
        let live: Vec<&Launched> = found.iter().filter(|i| i.state == "pending" || i.state == "running").collect();
        let cpu: u32 = live
            .iter()
            .filter(|i| i.pool == "limited")
            .map(|i| {
                *vcpus
                    .get(i.instance_type.as_str())
                    .unwrap_or_else(|| panic!("{} is not in the catalog", i.instance_type))
            })
            .sum();
        assert!(cpu <= limit, "{cpu} vCPUs of NodePool limited running, over its limit of {limit}\n{}", logs());
        if settled {
            let claims: BTreeSet<String> = env.items(&["get", "nodeclaims"]).iter().map(name_of).collect();
            let running: BTreeSet<String> = live.iter().map(|i| i.claim.clone()).collect();
            assert_eq!(running, claims, "one running instance per NodeClaim, none without one");
        }
        cpu
    }
}

/// The Done-when's kill test: ROUNDS (default 3; `DOVETAIL_HA_ROUNDS`) scale-ups of PODS
/// pods (default 200; `DOVETAIL_HA_PODS`), each in a namespace of its own: half the pods, the
/// leader killed once the round's first NodeClaims exist, the other half added, every pod
/// Running, the fleet checked, the round cleaned up (but the last). Then all three restart from
/// their disks. Prints the time from each kill to the new leader's committed Lead and to its
/// first provisioning decision.
#[test]
fn three_control_nodes_on_moto_lose_their_leader_mid_scale_up_and_launch_nothing_twice() {
    let Some((env, _serial, _)) = getting_started() else { return };
    let rounds = setting("DOVETAIL_HA_ROUNDS", 3);
    let pods = setting("DOVETAIL_HA_PODS", 200);
    // Half the CPU the pods ask for: `limited` reaches it in every round.
    let limit = pods / 2;
    env.apply(&pools(limit));
    let (rt, endpoint, ec2) = own_role(&env);
    let known = rt.block_on(all_instances(&ec2));
    let catalog = dovetail_core::catalog::Catalog::embedded("us-east-1").expect("the embedded catalog");
    let vcpus = catalog.instance_types.iter().map(|t| (t.name.clone(), t.vcpu)).collect();
    let fleet = Fleet { rt: &rt, ec2, known, vcpus, limit };

    let agent = Controller::spawn_aws(&env, "node-agent", "node-agent", &endpoint, &[]);
    let mut group = Group::new(&env, &rt, moto::moto().addr, None);
    for i in 0..3 {
        group.start(i);
    }
    group.leader(Duration::from_secs(30));
    let mut commits = Vec::new();
    let mut flowing = Vec::new();
    // The limit's peak on moto (vCPUs running) and in the leader's ledger (vCPUs its claims
    // hold, reservations included).
    let (mut peak_cpu, mut peak_held) = (0, 0);
    let mut ns = String::new();
    // moto forgets terminated instances after this (scripts/moto-server): a round's settled
    // check sees every instance of the round only if the round is shorter.
    let forgets_after = setting("DOVETAIL_MOTO_TERMINATED_TTL", 3600);
    for round in 1..=rounds {
        ns = format!("ha-aws-{round}");
        let round_started = std::time::Instant::now();
        env.apply(&deployment(&ns, "inflate", pods / 2, "1"));
        env.wait("the round's first NodeClaims", Duration::from_secs(120), |e| {
            if e.items(&["get", "nodeclaims"]).is_empty() { Err(group.logs()) } else { Ok(()) }
        });
        // SIGKILL of the leader mid-scale-up, and more pods for the next one to place.
        let old = group.leader(Duration::from_secs(10));
        let killed_at = epoch(SystemTime::now());
        drop(group.nodes[old].take());
        env.kubectl(&["scale", "deployment", "inflate", "-n", &ns, "--replicas", &pods.to_string()]);
        let new = group.leader(Duration::from_secs(15));
        let led = first_after(&group.log(new), "ledger.lead: leading", killed_at).expect("the new leader's Lead line");
        // Its first provisioning decision: new NodeClaims for pending pods, or pending pods
        // left to the capacity in flight (the killed leader's claims, which the new leader
        // takes over: once its Router counts them, a backlog they cover needs none).
        let mut decided = None;
        env.wait("the new leader's first provisioning decision", Duration::from_secs(30), |_| {
            let log = group.log(new);
            let claims = first_after(&log, "nodepool.provision: computed new nodeclaim", killed_at);
            let left = first_after(&log, "router.route: left pod(s) to existing or in-flight capacity", killed_at);
            decided = claims.into_iter().chain(left).reduce(f64::min);
            decided.map(|_| ()).ok_or_else(|| group.logs())
        });
        let decided = decided.expect("decided");
        commits.push(led - killed_at);
        flowing.push(decided - killed_at);
        eprintln!(
            "round {round}: node {} killed; node {} committed its Lead after {:.3} s, decided after {:.3} s",
            old + 1,
            new + 1,
            led - killed_at,
            decided - killed_at
        );
        group.start(old);
        // The limit holds all along the scale-up, not only at its end.
        let logs = || group.logs();
        env.wait(&format!("round {round}: every pod Running"), Duration::from_secs(300), |e| {
            peak_cpu = peak_cpu.max(fleet.check(e, false, &logs));
            peak_held = peak_held.max(held_cpu(&group.status(new), "limited"));
            let running =
                e.items(&["get", "pods", "-n", &ns]).iter().filter(|p| p["status"]["phase"] == "Running").count();
            let want = pods as usize;
            if running == want { Ok(()) } else { Err(format!("{running}/{want} running\n{}", agent.log())) }
        });
        fleet.check(&env, true, &logs);
        assert!(
            round_started.elapsed() < Duration::from_secs(forgets_after.into()),
            "round {round} took {:?}, longer than moto keeps terminated instances ({forgets_after} s): its duplicate check could miss one",
            round_started.elapsed()
        );
        if round < rounds {
            // The round's pods go first: a namespace deleted with its Deployment still there
            // has its ReplicaSet recreate the pods the drains evict, and kube-scheduler (and
            // the controllers) spend the next round on a dying namespace's pending pods (round
            // 9 of a 20 x 1,000 run: the scheduler's requests throttled 10 s, the new round's
            // pods not marked unschedulable within 30 s).
            env.kubectl(&["scale", "deployment", "inflate", "-n", &ns, "--replicas", "0"]);
            env.wait("the round's pods gone", Duration::from_secs(120), |e| {
                let left = e.items(&["get", "pods", "-n", &ns]).len();
                if left == 0 { Ok(()) } else { Err(format!("{left} pods left in {ns}")) }
            });
            // The namespace stays (empty): kube-scheduler's event broadcaster retries the
            // events of a deleted namespace's pods for many minutes, each refused (about 15 a
            // second in round 14 of a 20 x 1,000 run, for namespaces of rounds before), while
            // it is to mark the round's new pods.
            env.kubectl(&["delete", "deployment", "inflate", "-n", &ns, "--wait=false"]);
            env.kubectl(&["delete", "nodeclaims", "--all", "--wait=false"]);
            env.wait("the round's NodeClaims and nodes gone", Duration::from_secs(120), |e| {
                let claims = e.items(&["get", "nodeclaims"]).len();
                let nodes = e.items(&["get", "nodes", "-l", "dovetail.sh/sim-node"]).len();
                if claims + nodes == 0 {
                    Ok(())
                } else {
                    Err(format!("{claims} nodeclaims, {nodes} nodes\n{}", logs()))
                }
            });
        }
    }
    let max = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
    eprintln!(
        "{rounds} kills, {pods} pods each: Lead committed after {commits:.3?} s (max {:.3}); first decision after {flowing:.3?} s (max {:.3}); NodePool limited peaked at {peak_held} of {limit} vCPUs held in the ledger, {peak_cpu} running on moto",
        max(&commits),
        max(&flowing),
    );
    // The limit bound the leader's decisions (the fleet check above is not vacuous): its claims
    // held it, within one 8-vCPU node. Held, not running: the claims a killed leader reserved
    // and never created hold the limit until they are released (`create_grace`, 30 s, the
    // time its create may still land), longer than a 200-pod round.
    assert!(peak_held + 8 >= limit, "NodePool limited's claims held at most {peak_held} of {limit} vCPUs");
    // The goals, asserted where they are measured at load (scripts/ha-loadtest); speed is
    // for benchmarks, not for a CI run on a shared machine.
    if std::env::var_os("DOVETAIL_HA_ASSERT_TIMING").is_some() {
        assert!(max(&commits) <= 1.0, "a new leader committed its Lead after {:.3} s (goal <= 1 s)", max(&commits));
        assert!(max(&flowing) <= 2.0, "a new leader decided after {:.3} s (goal <= 2 s)", max(&flowing));
    }

    // All three restarted from their disks: no committed claim is lost, nothing is relaunched.
    let leader = group.leader(Duration::from_secs(10));
    let before = group.status(leader);
    let claims_before: BTreeSet<String> = env.items(&["get", "nodeclaims"]).iter().map(name_of).collect();
    for i in 0..3 {
        drop(group.nodes[i].take());
    }
    for i in 0..3 {
        group.start(i);
    }
    let leader = group.leader(Duration::from_secs(30));
    let after = group.status(leader);
    assert_eq!(after["claims"], before["claims"], "the registry after a restart of all three from disk");
    assert!(
        after["applied_index"].as_u64() >= before["applied_index"].as_u64(),
        "applied index went back: {before} -> {after}"
    );
    std::thread::sleep(Duration::from_secs(5));
    let claims_after: BTreeSet<String> = env.items(&["get", "nodeclaims"]).iter().map(name_of).collect();
    assert_eq!(claims_after, claims_before, "no NodeClaim made or lost by the restart");
    fleet.check(&env, true, &|| group.logs());
    // With the group running: the leader acts only while a quorum follows it.
    clean_up(&env, &ns, group.nodes[leader].as_ref().expect("running"));
    drop(group);
    drop(agent);
}

/// A leader cut off from the other two while it has pods to decide (the test's proxies drop
/// its Raft traffic both ways, while it still reaches the API server and moto): once the
/// other two elected a leader, it makes no cloud call (counted by its moto proxy) and no
/// Kubernetes request (its `dovetail_cluster_requests_total`: writes and the reads they
/// need), while the majority provisions for the pods. Healed, it follows.
#[test]
fn a_leader_cut_off_in_a_minority_makes_no_cloud_call_and_no_kubernetes_write_while_the_majority_goes_on() {
    let Some((env, _serial, _)) = getting_started() else { return };
    env.apply(&pools(1000));
    let (rt, endpoint, _) = own_role(&env);
    let agent = Controller::spawn_aws(&env, "node-agent", "node-agent", &endpoint, &[]);
    let net = RaftNet::new();
    let mut group = Group::new(&env, &rt, moto::moto().addr, Some(&net));
    for i in 0..3 {
        group.start(i);
    }
    let first = group.leader(Duration::from_secs(30));
    let ns = "ha-partition";
    env.apply(&deployment(ns, "inflate", 20, "1"));
    let ctl = group.nodes[first].as_ref().expect("running");
    env.wait_running("the pods Running before the partition", ns, 20, None, ctl, Duration::from_secs(120));

    // More pods for the leader to decide on, then the cut, while it has that work. The node
    // cut off is the one leading then, once it has acted: on a loaded machine (three
    // controllers on two cores beside other work) leadership may have moved since the first
    // pods, and a leader that has not acted yet would show nothing.
    env.kubectl(&["scale", "deployment", "inflate", "-n", ns, "--replicas", "60"]);
    let mut leader = None;
    env.wait("a leader that has launched and written", Duration::from_secs(60), |_| match group.leading()[..] {
        [i] if !group.proxies[i].faults().actions.is_empty()
            && group.nodes[i].as_ref().is_some_and(|c| c.metric("dovetail_cluster_requests_total", "") > 0.0) =>
        {
            leader = Some(i);
            Ok(())
        }
        ref other => Err(format!("leading: {other:?}\n{}", group.logs())),
    });
    let old = leader.expect("a leader that acted");
    net.partition(&[old as u64 + 1]);
    let cut_at = Instant::now();
    let mut new = None;
    env.wait("a leader among the other two", Duration::from_secs(15), |_| {
        match group.leading().into_iter().filter(|i| *i != old).collect::<Vec<_>>()[..] {
            [i] => {
                new = Some(i);
                Ok(())
            }
            ref other => Err(format!("leading: {other:?}\n{}", group.logs())),
        }
    });
    let new = new.expect("a new leader");
    let cut_off = group.nodes[old].as_ref().expect("running");
    assert_eq!(
        cut_off.metric("dovetail_ledger_leader", ""),
        0.0,
        "the cut-off node stopped saying it leads before another was elected"
    );
    // From here on (the majority elected a leader: the old lease is out), nothing.
    let calls = group.proxies[old].faults().actions.len();
    let writes = cut_off.metric("dovetail_cluster_requests_total", "");
    assert!(calls > 0 && writes > 0.0, "it launched and wrote while it led: {calls} calls, {writes} writes");
    eprintln!("a new leader {:.3} s after the cut", cut_at.elapsed().as_secs_f64());
    let acting = group.nodes[new].as_ref().expect("running");
    env.wait_running("the majority provisions for new pods", ns, 60, None, acting, Duration::from_secs(120));
    // Longer than the cut-off node's plane may linger out of its lease (5 s).
    std::thread::sleep(Duration::from_secs(6));
    let cut_off = group.nodes[old].as_ref().expect("running");
    let after = group.proxies[old].faults().actions.clone();
    assert_eq!(after.len(), calls, "cloud calls of the cut-off node: {:?}\n{}", &after[calls..], cut_off.log());
    assert_eq!(
        cut_off.metric("dovetail_cluster_requests_total", ""),
        writes,
        "Kubernetes requests of the cut-off node"
    );
    assert!(group.proxies[new].faults().actions.iter().any(|a| a.ends_with(":CreateFleet")), "the majority launched");

    // Healed: one leader, and the old one follows without acting.
    net.partition(&[]);
    std::thread::sleep(Duration::from_secs(3));
    let leader = group.leader(Duration::from_secs(15));
    assert_ne!(leader, old, "the healed node does not take over: the others' log is longer");
    let cut_off = group.nodes[old].as_ref().expect("running");
    assert_eq!(group.proxies[old].faults().actions.len(), calls, "{}", cut_off.log());
    clean_up(&env, ns, group.nodes[leader].as_ref().expect("running"));
    drop(group);
    drop(agent);
}
