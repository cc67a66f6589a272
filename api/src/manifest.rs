//! Multi-document Kubernetes YAML, as `dovetail plan` reads it: Pods, workloads (expanded
//! into their pods), DaemonSets, Nodes, Namespaces, NodePools and EC2NodeClasses.

use std::collections::BTreeMap;

use dovetail_core::catalog::NodeClassSettings;
use dovetail_core::labels::Labels;
use dovetail_core::node::Node;
use dovetail_core::nodepool::NodePool;
use dovetail_core::pod::Pod;
use k8s_openapi::api::apps::v1 as apps;
use k8s_openapi::api::batch::v1 as batch;
use k8s_openapi::api::core::v1 as core;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::de::DeserializeOwned;

use crate::convert::{self, ConversionError, Ctx, PodMeta};
use crate::crd;

/// The largest number of pods one workload may expand into.
pub const MAX_REPLICAS: i32 = 1_000_000;

/// Why a manifest could not be read: the document (1-based) and what was wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("document {document}: {message}")]
pub struct ManifestError {
    pub document: usize,
    pub message: String,
}

/// Everything a manifest holds, converted to domain types.
#[derive(Clone, Debug, Default)]
pub struct Manifest {
    /// Pods without a node, to place.
    pub pending: Vec<Pod>,
    /// Pods bound to a node (`spec.nodeName`).
    pub bound: Vec<Pod>,
    pub nodes: Vec<Node>,
    pub nodepools: Vec<NodePool>,
    pub nodeclasses: BTreeMap<String, NodeClassSettings>,
    pub daemonsets: Vec<Pod>,
    pub namespaces: BTreeMap<String, Labels>,
    /// Things that were skipped, for stderr.
    pub warnings: Vec<String>,
}

fn typed<T: DeserializeOwned>(doc: usize, what: &str, v: serde_yaml::Value) -> Result<T, ManifestError> {
    serde_path_to_error::deserialize(v)
        .map_err(|e| ManifestError { document: doc, message: format!("{what}: {}: {}", e.path(), e.inner()) })
}

fn conv(doc: usize) -> impl Fn(ConversionError) -> ManifestError {
    move |e| ManifestError { document: doc, message: e.to_string() }
}

/// `Kind namespace/name` for namespaced kinds (namespace defaulting to `default`), else
/// `Kind name`.
fn object_name(kind: &str, meta: &ObjectMeta) -> String {
    let name = meta.name.as_deref().unwrap_or("");
    if matches!(kind, "Node" | "Namespace") {
        return format!("{kind} {name}");
    }
    format!("{kind} {}/{name}", meta.namespace.as_deref().unwrap_or("default"))
}

impl Manifest {
    /// Parses multi-document YAML.
    pub fn parse(text: &str) -> Result<Manifest, ManifestError> {
        let mut m = Manifest::default();
        let mut docs = Vec::new();
        for (i, d) in serde_yaml::Deserializer::from_str(text).enumerate() {
            let v = <serde_yaml::Value as serde::Deserialize>::deserialize(d)
                .map_err(|e| ManifestError { document: i + 1, message: format!("invalid YAML: {e}") })?;
            docs.push((i + 1, v));
        }
        for (doc, v) in docs {
            m.add_document(doc, v)?;
        }
        m.finish();
        Ok(m)
    }

    fn add_document(&mut self, doc: usize, v: serde_yaml::Value) -> Result<(), ManifestError> {
        if v.is_null() {
            return Ok(());
        }
        let field = |k: &str| v.get(k).and_then(|x| x.as_str()).map(str::to_string);
        let kind = field("kind").ok_or_else(|| ManifestError { document: doc, message: "kind: missing".into() })?;
        let api_version = field("apiVersion").unwrap_or_default();
        let creation = doc as i64 * 1_000_000;
        match (api_version.as_str(), kind.as_str()) {
            (_, "List") => {
                let items = v.get("items").and_then(|i| i.as_sequence()).cloned().unwrap_or_default();
                for item in items {
                    self.add_document(doc, item)?;
                }
            }
            ("v1", "Pod") => {
                let p: core::Pod = typed(doc, "Pod", v)?;
                let ctx = Ctx::new(object_name("Pod", &p.metadata));
                let spec = p.spec.clone().ok_or_else(|| conv(doc)(ctx.err("spec", "a Pod needs a spec")))?;
                let phase = p.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_default();
                let (daemon, owned_by_node) = convert::owners(&p.metadata);
                let meta = PodMeta { owned_by_node, ..pod_meta(&p.metadata, creation, daemon) };
                let meta = PodMeta {
                    terminal: matches!(phase.as_str(), "Succeeded" | "Failed")
                        || p.metadata.deletion_timestamp.is_some(),
                    ..meta
                };
                let pod = convert::pod_from_spec(&ctx, "spec", meta, &spec).map_err(conv(doc))?;
                self.note_namespace(&pod.key.namespace);
                if pod.node_name.is_some() {
                    self.bound.push(pod);
                } else if pod.daemon {
                    self.warnings.push(format!(
                        "document {doc}: {}: DaemonSet pods are not provisioned for; skipped",
                        ctx.object
                    ));
                } else if !pod.terminal {
                    self.pending.push(pod);
                }
            }
            ("apps/v1", "Deployment") => {
                let d: apps::Deployment = typed(doc, "Deployment", v)?;
                let spec = d.spec;
                self.expand(doc, "Deployment", &d.metadata, spec.replicas.unwrap_or(1), &spec.template, creation)?;
            }
            ("apps/v1", "ReplicaSet") => {
                let d: apps::ReplicaSet = typed(doc, "ReplicaSet", v)?;
                let spec = d.spec;
                let template = spec.template.unwrap_or_default();
                self.expand(doc, "ReplicaSet", &d.metadata, spec.replicas.unwrap_or(1), &template, creation)?;
            }
            ("apps/v1", "StatefulSet") => {
                let d: apps::StatefulSet = typed(doc, "StatefulSet", v)?;
                let spec = d.spec;
                self.expand(doc, "StatefulSet", &d.metadata, spec.replicas.unwrap_or(1), &spec.template, creation)?;
            }
            ("batch/v1", "Job") => {
                let d: batch::Job = typed(doc, "Job", v)?;
                let spec = d.spec.unwrap_or_default();
                let parallelism = spec.parallelism.unwrap_or(1);
                let n = spec.completions.map_or(parallelism, |c| c.min(parallelism));
                self.expand(doc, "Job", &d.metadata, n, &spec.template, creation)?;
            }
            ("apps/v1", "DaemonSet") => {
                let d: apps::DaemonSet = typed(doc, "DaemonSet", v)?;
                let ctx = Ctx::new(object_name("DaemonSet", &d.metadata));
                let spec = d.spec;
                let tspec =
                    spec.template.spec.clone().ok_or_else(|| conv(doc)(ctx.err("spec.template.spec", "missing")))?;
                let mut meta = pod_meta(&d.metadata, creation, true);
                meta.labels = spec.template.metadata.as_ref().and_then(|m| m.labels.clone()).unwrap_or_default();
                let pod = convert::pod_from_spec(&ctx, "spec.template.spec", meta, &tspec).map_err(conv(doc))?;
                self.daemonsets.push(pod);
            }
            ("v1", "Node") => {
                let n: core::Node = typed(doc, "Node", v)?;
                let ctx = Ctx::new(object_name("Node", &n.metadata));
                self.nodes.push(convert::node(&ctx, &n).map_err(conv(doc))?);
            }
            ("v1", "Namespace") => {
                let n: core::Namespace = typed(doc, "Namespace", v)?;
                let name = n.metadata.name.clone().unwrap_or_default();
                let mut labels = n.metadata.labels.clone().unwrap_or_default();
                labels.insert("kubernetes.io/metadata.name".into(), name.clone());
                self.namespaces.insert(name, labels);
            }
            ("karpenter.sh/v1", "NodePool") => {
                let np: crd::NodePool = typed(doc, "NodePool", v)?;
                let pool = convert::nodepool(&np).map_err(conv(doc))?;
                if self.nodepools.iter().any(|p| p.name == pool.name) {
                    return Err(ManifestError {
                        document: doc,
                        message: format!("NodePool {:?}: metadata.name: defined twice", pool.name),
                    });
                }
                self.nodepools.push(pool);
            }
            ("karpenter.k8s.aws/v1", "EC2NodeClass") => {
                let nc: crd::EC2NodeClass = typed(doc, "EC2NodeClass", v)?;
                let settings = convert::node_class_settings(&nc).map_err(conv(doc))?;
                self.nodeclasses.insert(nc.metadata.name.clone().unwrap_or_default(), settings);
            }
            (av, k) => {
                self.warnings.push(format!("document {doc}: {av} {k} is not used by plan; skipped"));
            }
        }
        Ok(())
    }

    fn expand(
        &mut self,
        doc: usize,
        kind: &str,
        meta: &ObjectMeta,
        replicas: i32,
        template: &core::PodTemplateSpec,
        creation: i64,
    ) -> Result<(), ManifestError> {
        let ctx = Ctx::new(object_name(kind, meta));
        if !(0..=MAX_REPLICAS).contains(&replicas) {
            return Err(conv(doc)(ctx.err("spec.replicas", format!("must be in 0..{MAX_REPLICAS}, got {replicas}"))));
        }
        let spec = template.spec.clone().ok_or_else(|| conv(doc)(ctx.err("spec.template.spec", "missing")))?;
        let labels = template.metadata.as_ref().and_then(|m| m.labels.clone()).unwrap_or_default();
        let annotations = template.metadata.as_ref().and_then(|m| m.annotations.clone()).unwrap_or_default();
        let base = pod_meta(meta, creation, false);
        let first =
            convert::pod_from_spec(&ctx, "spec.template.spec", PodMeta { labels, annotations, ..base.clone() }, &spec)
                .map_err(conv(doc))?;
        self.note_namespace(&first.key.namespace);
        for i in 0..replicas {
            let mut p = first.clone();
            p.key.name = format!("{}-{i}", base.name);
            p.creation = creation + i as i64;
            if p.node_name.is_some() {
                self.bound.push(p);
            } else {
                self.pending.push(p);
            }
        }
        Ok(())
    }

    fn note_namespace(&mut self, ns: &str) {
        self.namespaces
            .entry(ns.to_string())
            .or_insert_with(|| Labels::from([("kubernetes.io/metadata.name".to_string(), ns.to_string())]));
    }

    fn finish(&mut self) {
        let names: std::collections::BTreeSet<&str> = self.nodes.iter().map(|n| n.name.as_str()).collect();
        let mut unknown = Vec::new();
        self.bound.retain(|p| {
            let known = p.node_name.as_deref().is_some_and(|n| names.contains(n));
            if !known {
                unknown.push(format!(
                    "pod {} is bound to node {:?}, which is not in the input; skipped",
                    p.key,
                    p.node_name.as_deref().unwrap_or("")
                ));
            }
            known
        });
        self.warnings.extend(unknown);
    }
}

fn pod_meta(meta: &ObjectMeta, creation: i64, daemon: bool) -> PodMeta {
    PodMeta {
        namespace: meta.namespace.clone().unwrap_or_else(|| "default".into()),
        name: meta.name.clone().unwrap_or_default(),
        labels: meta.labels.clone().unwrap_or_default(),
        annotations: meta.annotations.clone().unwrap_or_default(),
        creation,
        daemon,
        owned_by_node: false,
        terminal: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dovetail_core::resources::ResourceName;

    #[test]
    fn workloads_expand_into_named_pods() {
        let m = Manifest::parse(
            r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  replicas: 3
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers: [{name: c, image: x, resources: {requests: {cpu: 250m, memory: 1Gi}}}]
---
apiVersion: batch/v1
kind: Job
metadata: {name: batch, namespace: jobs}
spec:
  parallelism: 5
  completions: 2
  template:
    spec:
      restartPolicy: Never
      containers: [{name: c, image: x}]
"#,
        )
        .expect("valid manifest");
        let names: Vec<String> = m.pending.iter().map(|p| p.key.to_string()).collect();
        assert_eq!(names, ["default/web-0", "default/web-1", "default/web-2", "jobs/batch-0", "jobs/batch-1"]);
        assert_eq!(m.pending[0].requests.get(&ResourceName::Cpu), 250);
        assert_eq!(m.pending[0].labels.get("app").map(String::as_str), Some("web"));
        assert!(m.namespaces.contains_key("jobs"));
    }

    #[test]
    fn errors_name_the_document_object_and_field() {
        let err = Manifest::parse(
            r#"
apiVersion: v1
kind: Namespace
metadata: {name: a}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: shop}
spec:
  replicas: many
  selector: {}
  template: {spec: {containers: []}}
"#,
        )
        .expect_err("replicas is not an integer");
        assert_eq!(err.document, 2);
        assert!(err.message.contains("spec.replicas"), "{}", err.message);

        let err = Manifest::parse(
            r#"
apiVersion: v1
kind: Pod
metadata: {name: p}
spec:
  topologySpreadConstraints: [{maxSkew: 0, topologyKey: zone, whenUnsatisfiable: DoNotSchedule}]
  containers: [{name: c, image: x}]
"#,
        )
        .expect_err("maxSkew 0 is invalid");
        assert!(err.message.contains("Pod default/p: spec.topologySpreadConstraints[0].maxSkew"), "{}", err.message);
    }

    /// Karpenter's `Initialized`: a NodePool's node by its label alone (Ready without it is a
    /// node booting, its `karpenter.sh/unregistered` taint still on; with it and NotReady, a
    /// node lost); a node no NodePool manages once Ready.
    #[test]
    fn a_nodepools_node_is_initialized_by_its_label_and_another_by_ready() {
        let node = |name: &str, labels: &str, ready: &str| {
            format!(
                "apiVersion: v1\nkind: Node\nmetadata: {{name: {name}, labels: {{{labels}}}}}\nspec:\n  taints: [{{key: karpenter.sh/unregistered, effect: NoExecute}}]\nstatus:\n  allocatable: {{cpu: '4', memory: 8Gi, pods: '110'}}\n  conditions: [{{type: Ready, status: '{ready}'}}]\n"
            )
        };
        let docs = [
            node("booting", "karpenter.sh/nodepool: default", "True"),
            node("joined", "karpenter.sh/nodepool: default, karpenter.sh/initialized: 'true'", "True"),
            node("other", "team: a", "True"),
            node("down", "team: a", "False"),
            // Initialized stays: a NotReady node's taints then count (nothing goes onto it).
            node("lost", "karpenter.sh/nodepool: default, karpenter.sh/initialized: 'true'", "False"),
        ]
        .join("---\n");
        let m = Manifest::parse(&docs).expect("valid nodes");
        let initialized: Vec<(&str, bool)> = m.nodes.iter().map(|n| (n.name.as_str(), n.initialized)).collect();
        assert_eq!(
            initialized,
            [("booting", false), ("joined", true), ("other", true), ("down", false), ("lost", true)]
        );
        assert_eq!(m.nodes[0].effective_taints(), Vec::new(), "a booting node's unregistered taint is ignored");
    }

    #[test]
    fn bound_pods_need_a_known_node_and_unknown_kinds_warn() {
        let m = Manifest::parse(
            r#"
apiVersion: v1
kind: Pod
metadata: {name: orphan}
spec:
  nodeName: gone
  containers: [{name: c, image: x}]
---
apiVersion: v1
kind: Service
metadata: {name: s}
"#,
        )
        .expect("valid manifest");
        assert!(m.bound.is_empty() && m.pending.is_empty());
        assert_eq!(m.warnings.len(), 2, "{:?}", m.warnings);
    }

    #[test]
    fn node_class_kubelet_settings_are_read() {
        let m = Manifest::parse(
            r#"
apiVersion: karpenter.k8s.aws/v1
kind: EC2NodeClass
metadata: {name: dense}
spec:
  kubelet: {maxPods: 110, evictionHard: {memory.available: 5%}}
  blockDeviceMappings: [{deviceName: /dev/xvda, rootVolume: true, ebs: {volumeSize: 100Gi}}]
"#,
        )
        .expect("valid manifest");
        let s = &m.nodeclasses["dense"];
        assert_eq!(s.kubelet.max_pods, Some(110));
        assert_eq!(s.root_volume_bytes, 100 << 30);
        assert!(
            matches!(s.kubelet.eviction_memory, Some(dovetail_core::catalog::overhead::EvictionThreshold::Percent(p)) if p == 5.0)
        );
    }

    #[test]
    fn instance_store_policy_is_read_and_unknown_policies_name_the_field() {
        let m = Manifest::parse(
            r#"
apiVersion: karpenter.k8s.aws/v1
kind: EC2NodeClass
metadata: {name: nvme}
spec: {instanceStorePolicy: RAID0}
"#,
        )
        .expect("valid manifest");
        assert_eq!(
            m.nodeclasses["nvme"].instance_store_policy,
            Some(dovetail_core::catalog::InstanceStorePolicy::Raid0)
        );
        let err = Manifest::parse(
            r#"
apiVersion: karpenter.k8s.aws/v1
kind: EC2NodeClass
metadata: {name: nvme}
spec: {instanceStorePolicy: RAID5}
"#,
        )
        .expect_err("RAID5 is not a policy");
        assert!(err.message.contains("EC2NodeClass \"nvme\": spec.instanceStorePolicy"), "{}", err.message);
        assert!(err.message.contains("RAID5"), "{}", err.message);
    }
}
